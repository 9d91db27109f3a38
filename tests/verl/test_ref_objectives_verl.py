"""The trustbench plugins in verl's registries against the references written from the papers.

- Policy losses: ``get_policy_loss_fn("trustbench_<objective>")`` called with verl's signature
  (``old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights``) and
  verl's ``ActorConfig`` (the method in ``policy_loss.objective_params``, Dr.GRPO's norm in
  ``loss_scale_factor``, verl's global-batch counts in ``global_batch_info``): aggregated loss and its
  gradient w.r.t. ``log_prob`` against the float64 loop references of
  ``tests/algorithms/test_ref_objectives.py`` for clip (PPO / DAPO clip-higher / dual clip), token_is,
  gpg, gspo, cispo and bapo, in every aggregation mode.
- Advantage estimators: ``get_adv_estimator_fn("trustbench_<name>")`` for every estimator trustbench
  registers (grpo, drgrpo, rloo, loop, gpg, rfpp, rfpp_baseline, gae, egae), called as verl's
  ``compute_advantage`` calls a registered estimator (``index`` = uid strings, the estimator's parameters in
  ``algorithm.trustbench_estimator``; critic values and EGAE's ``finished`` flags as the trustbench trainer
  passes them), against the references of ``tests/algorithms/test_ref_estimators.py``.

The cases are those of the two reference modules, which assert that each method acts on them (clipping
on both sides with both signs of the advantage, the dual clip binding, BAPO's bounds moving, singleton
groups, ties, truncated responses). Tolerances as there (float32 library arithmetic against float64
references): rtol 1e-5, atol 1e-6.

Run: ``pytest tests/verl/test_ref_objectives_verl.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from runners import metric_names

from ..algorithms.test_ref_estimators import (
    OutcomeCase,
    estimator_preset,
    outcome_case,
    ref_egae,
    ref_gae,
    ref_gpg,
    ref_grpo,
    ref_rfpp,
    ref_rfpp_baseline,
    ref_rloo,
    token_case,
)
from ..algorithms.test_ref_objectives import (
    BAPO_CASES,
    CISPO_CASES,
    CLIP_PRESETS,
    GSPO_CASES,
    MODES,
    bapo_batch,
    gspo_batch,
    ref_agg_weights,
    ref_aggregate,
    ref_bapo,
    ref_cispo,
    ref_clip,
    ref_gpg_loss,
    ref_gspo,
    ref_token_is,
    token_batch,
)

pytestmark = pytest.mark.verl

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")

RTOL, ATOL = 1e-5, 1e-6


# -- policy losses ---------------------------------------------------------------------------------------
def _objective_cases():
    """case id -> (loss mode, objective params, batch, reference returning (loss [B,T], dloss [B,T]))."""
    cases = {}
    for name, (_, params) in CLIP_PRESETS.items():
        batch = token_batch(0)
        cases[f"clip-{name}"] = ("trustbench_clip", params, batch, lambda b, p=params: ref_clip(*_arrays(b), **p)[:2])
    cases["token_is"] = ("trustbench_token_is", {}, token_batch(1), lambda b: ref_token_is(*_arrays(b)))
    cases["gpg"] = ("trustbench_gpg", {}, token_batch(2), lambda b: ref_gpg_loss(b.logp, b.adv, b.mask))
    for name, params in GSPO_CASES.items():
        batch = gspo_batch(3, **params, token_adv=True)
        cases[f"gspo-{name}"] = ("trustbench_gspo", params, batch, lambda b, p=params: ref_gspo(*_arrays(b), **p)[:2])
    for name, params in CISPO_CASES.items():
        cases[f"cispo-{name}"] = (
            "trustbench_cispo",
            params,
            token_batch(5),
            lambda b, p=params: ref_cispo(*_arrays(b), **p)[:2],
        )
    for name, (rule, params, _) in BAPO_CASES.items():
        full = {"rule": rule, **params}
        cases[f"bapo-{name}"] = (
            "trustbench_bapo",
            full,
            bapo_batch(6),
            lambda b, p=full: ref_bapo(*_arrays(b), **p)[:2],
        )
    return cases


def _arrays(batch):
    return batch.logp, batch.old_logp, batch.adv, batch.mask


OBJECTIVE_CASES = _objective_cases()


def _actor_config(loss_mode: str, params: dict, mode: str, *, norm_len: float, global_info: dict | None = None):
    from verl.workers.config.actor import ActorConfig

    from runners.backends.verl.plugins.config import TrustbenchPolicyLossConfig

    config = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        loss_agg_mode=mode,
        loss_scale_factor=norm_len,
        policy_loss=TrustbenchPolicyLossConfig(loss_mode=loss_mode, objective_params=dict(params)),
    )
    # verl's ppo_loss copies loss_scale_factor (and, with data parallelism, the global counts) here
    config.global_batch_info.update({"loss_scale_factor": norm_len, **(global_info or {})})
    return config


def _verl_loss(loss_mode, params, batch, mode, *, norm_len, global_info=None, weights=None):
    """The plugin through verl's registry with verl's signature; ``(loss, metrics, d loss / d log_prob)``."""
    from runners.backends.verl.plugins import register  # noqa: F401  (registers the plugins)

    logp, old_logp, adv, mask = batch.tensors()
    config = _actor_config(loss_mode, params, mode, norm_len=norm_len, global_info=global_info)
    loss_fn = core_algos.get_policy_loss_fn(loss_mode)
    loss, metrics = loss_fn(old_logp, logp, adv, mask, mode, config, weights)
    loss.backward()
    return float(loss.detach()), metrics, logp.grad.numpy()


def test_every_non_troll_loss_mode_is_covered():
    from runners.backends.verl import LOSS_MODES

    covered = {loss_mode for loss_mode, *_ in OBJECTIVE_CASES.values()}
    assert covered == set(LOSS_MODES) - {"trustbench_troll", "trustbench_troll_seq", "trustbench_gtpo"}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(OBJECTIVE_CASES))
def test_policy_loss_plugin_matches_reference(case, mode):
    """Aggregated loss and gradient w.r.t. log_prob of each plugin equal the paper references."""
    loss_mode, params, batch, ref = OBJECTIVE_CASES[case]
    loss, metrics, grad = _verl_loss(loss_mode, params, batch, mode, norm_len=7.0)
    ref_loss, ref_dloss = ref(batch)
    assert loss == pytest.approx(ref_aggregate(ref_loss, batch.mask, mode, norm_len=7.0), rel=RTOL, abs=ATOL)
    np.testing.assert_allclose(grad, ref_agg_weights(batch.mask, mode, norm_len=7.0) * ref_dloss, rtol=RTOL, atol=ATOL)
    assert np.abs(grad).sum() > 0


@pytest.mark.parametrize("case", ["clip-dual_clip", "clip-dapo_clip", "gspo-preset", "cispo-two_sided"])
def test_clip_metrics_through_verl(case):
    """``actor/pg_clipfrac`` (and the dual clip's ``actor/pg_clipfrac_lower``) as the references count them."""
    loss_mode, params, batch, _ = OBJECTIVE_CASES[case]
    _, metrics, _ = _verl_loss(loss_mode, params, batch, "token-mean", norm_len=7.0)
    real = batch.mask > 0
    if loss_mode == "trustbench_clip":
        _, _, clipped, dual = ref_clip(*_arrays(batch), **params)
        assert metrics[metric_names.PG_CLIPFRAC_LOWER] == pytest.approx(dual[real].mean(), abs=1e-7)
    elif loss_mode == "trustbench_gspo":
        clipped = ref_gspo(*_arrays(batch), **params)[2]
    else:
        clipped = ref_cispo(*_arrays(batch), **params)[2]
    assert 0 < clipped[real].mean() < 1
    assert metrics[metric_names.PG_CLIPFRAC] == pytest.approx(clipped[real].mean(), abs=1e-7)


@pytest.mark.parametrize("mode", MODES)
def test_global_batch_counts_and_rollout_weights(mode):
    """verl's global-batch counts (dp_size ranks) replace the local counts as the references' ``num_tokens``
    / ``num_seqs``; rollout importance weights multiply the per-token loss."""
    loss_mode, params, batch, ref = OBJECTIVE_CASES["clip-dual_clip"]
    info = {"dp_size": 2, "batch_num_tokens": 150, "global_batch_size": 24}
    weights = np.random.default_rng(9).uniform(0.5, 1.5, batch.mask.shape)
    loss, _, grad = _verl_loss(
        loss_mode, params, batch, mode, norm_len=5.0, global_info=info, weights=torch.tensor(weights)
    )
    ref_loss, ref_dloss = ref(batch)
    counts = {"norm_len": 5.0, "num_tokens": 150 / 2, "num_seqs": 24 / 2}
    assert loss == pytest.approx(ref_aggregate(ref_loss * weights, batch.mask, mode, **counts), rel=RTOL, abs=ATOL)
    np.testing.assert_allclose(
        grad, ref_agg_weights(batch.mask, mode, **counts) * weights * ref_dloss, rtol=RTOL, atol=ATOL
    )


# -- advantage estimators --------------------------------------------------------------------------------
ESTIMATOR_CASES = {
    # name: (params, reference(case, params) -> (advantages, returns))
    "grpo": ({"std_eps": 1e-4}, lambda c, p: (ref_grpo(c.rewards, c.mask, c.groups, **p),) * 2),
    "drgrpo": ({}, lambda c, p: (ref_grpo(c.rewards, c.mask, c.groups, norm_by_std=False),) * 2),
    "rloo": ({}, lambda c, p: (ref_rloo(c.rewards, c.mask, c.groups),) * 2),
    "loop": ({}, lambda c, p: (ref_rloo(c.rewards, c.mask, c.groups),) * 2),
    "gpg": ({"rescale": "groups", "f_norm": 2.0}, lambda c, p: (ref_gpg(c.rewards, c.mask, c.groups, **p),) * 2),
    "rfpp_baseline": ({}, lambda c, p: (ref_rfpp_baseline(c.rewards, c.mask, c.groups),) * 2),
    "rfpp": ({"gamma": 0.9, "center": False}, lambda c, p: ref_rfpp(c.rewards, c.mask, **p)),
    "gae": ({"gamma": 0.95, "lam": 0.9}, lambda c, p: ref_gae(c.rewards, c.values, c.mask, **p)),
    "egae": (estimator_preset("egae"), lambda c, p: ref_egae(c.rewards, c.values, c.mask, c.finished, **p)),
}


def _algorithm(params: dict):
    from runners.backends.verl import ESTIMATOR_PARAMS_KEY

    return OmegaConf.create({ESTIMATOR_PARAMS_KEY: dict(params), "gamma": 1.0, "lam": 1.0})


def _verl_estimate(name: str, case, params: dict, *, finished=True):
    """The plugin through verl's registry, called as verl's compute_advantage calls registered estimators."""
    from runners.backends.verl.plugins import register  # noqa: F401  (registers the plugins)

    kwargs = {}
    if not isinstance(case, OutcomeCase):
        kwargs["values"] = torch.tensor(case.values, dtype=torch.float32)
        if finished:
            kwargs["finished"] = torch.tensor(case.finished)
    adv, ret = core_algos.get_adv_estimator_fn(f"trustbench_{name}")(
        token_level_rewards=torch.tensor(case.rewards, dtype=torch.float32),
        response_mask=torch.tensor(case.mask, dtype=torch.float32),
        config=_algorithm(params),
        index=case.uids if isinstance(case, OutcomeCase) else np.array([f"p{i}" for i in range(case.mask.shape[0])]),
        **kwargs,
    )
    return adv.double().numpy(), ret.double().numpy()


def test_every_registered_estimator_is_covered():
    from runners.backends.verl import ADV_ESTIMATORS

    assert set(ADV_ESTIMATORS) == {f"trustbench_{name}" for name in ESTIMATOR_CASES}


@pytest.mark.parametrize("name", sorted(ESTIMATOR_CASES))
@pytest.mark.parametrize("seed", [0, 1])
def test_estimator_plugin_matches_reference(name, seed):
    params, ref = ESTIMATOR_CASES[name]
    case = token_case(seed + 2) if name in {"rfpp", "gae", "egae"} else outcome_case(seed)
    adv, ret = _verl_estimate(name, case, params)
    ref_adv, ref_ret = ref(case, params)
    np.testing.assert_allclose(adv, ref_adv, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(ret, ref_ret, rtol=RTOL, atol=ATOL)
    assert np.abs(adv).sum() > 0


def test_egae_plugin_without_finished_is_gae():
    """verl's rollouts end every response: without ``finished`` the EGAE plugin is GAE (V = 0 at the end),
    and with it the truncated rows bootstrap from V(s_{l-1}) (T-PPO, arXiv 2506.15050, sec. 3.1)."""
    case = token_case(4)
    params = {"gamma": 1.0, "lam": 0.95, "whiten": False}
    plain, _ = _verl_estimate("egae", case, params, finished=False)
    cut, _ = _verl_estimate("egae", case, params)
    np.testing.assert_allclose(plain, ref_gae(case.rewards, case.values, case.mask, **params)[0], rtol=RTOL, atol=ATOL)
    ref_cut = ref_egae(case.rewards, case.values, case.mask, case.finished, **params)[0]
    np.testing.assert_allclose(cut, ref_cut, rtol=RTOL, atol=ATOL)
    assert np.abs(cut - plain)[~case.finished].max() > 1e-3
