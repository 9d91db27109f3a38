"""Every trustbench policy-loss plugin, called through verl's ``get_policy_loss_fn`` with verl's
signature, against the built-in trainer's actor update (the real ``LocalTrainer._update_actor`` on
the same float64 inputs): aggregated loss, gradient w.r.t. the logits, method metrics. Plus verl's
global-batch counts, rollout importance weights and clear errors.

Run: ``pytest tests/verl/test_plugins_losses.py``.
"""

from __future__ import annotations

import math

import pytest
import torch

from runners import metric_names
from runners.algorithms.numerics import entropy_from_logits, token_logprobs
from runners.algorithms.trm import ln_trm_scores, sample_log_ratio, sparse_token_divergences

from ._local_reference import Method, local_update, problem

pytestmark = pytest.mark.verl

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")

MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
TROLL = {"eps": 0.05, "top_k": 6, "tail_mass": 1e-5, "polish_steps": 0}

# id -> (loss_mode, Method); thresholds sit inside the spread of the test batch (checked below)
CASES = {
    "clip_dapo": ("trustbench_clip", Method("clip", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28})),
    "token_is": ("trustbench_token_is", Method("token_is")),
    "gspo": ("trustbench_gspo", Method("gspo", {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4})),
    "gpg": ("trustbench_gpg", Method("gpg")),
    "bapo": ("trustbench_bapo", Method("bapo", {"rho": 0.5})),
    "troll": ("trustbench_troll", Method("troll", dict(TROLL))),
    "troll_seq": ("trustbench_troll_seq", Method("troll", dict(TROLL, sequence=True))),
    "gtpo": ("trustbench_gtpo", Method("gtpo", {"gamma": 0.1, "h_ini_prompts": 100}, loss_agg="seq-mean-token-mean")),
    "trm_max": ("trustbench_clip", Method("clip", mask="trm_max", mask_params={"delta": 0.3, "top_k": 6})),
    "trm_avg": ("trustbench_clip", Method("clip", mask="trm_avg", mask_params={"delta_avg": 0.08, "top_k": 6})),
    "trm_max_avg": (
        "trustbench_clip",
        Method("clip", mask="trm_max_avg", mask_params={"delta": 0.5, "delta_avg": 0.1, "top_k": 6}),
    ),
    "trm_max_k2": ("trustbench_clip", Method("clip", mask="trm_max_k2", mask_params={"delta": 0.2})),
    "trm_avg_k3": ("trustbench_clip", Method("clip", mask="trm_avg_k3", mask_params={"delta_avg": 0.03})),
    "trm_sample": (
        "trustbench_clip",
        Method("clip", mask="trm_max_avg_sample", mask_params={"delta": 0.4, "delta_avg": 0.05}),
    ),
    "ln_trm": ("trustbench_clip", Method("clip", mask="ln_trm", mask_params={"delta": 1e-4, "delta_w": 0.25})),
    "ser": ("trustbench_gspo", Method("gspo", mask="ser", mask_params={"delta_ser": 0.25})),
    "troll_trm_max": ("trustbench_troll", Method("troll", dict(TROLL), mask="trm_max", mask_params={"delta": 0.3})),
    "repo_r": ("trustbench_clip", Method("clip", entropy_control="repo_r", entropy_control_params={"zeta0": 0.02})),
    "repo_d": ("trustbench_clip", Method("clip", entropy_control="repo_d", entropy_control_params={"zeta0": 0.5})),
    "adapo": ("trustbench_clip", Method("clip", entropy_control="adapo")),
    "bonus": ("trustbench_clip", Method("clip", entropy_control="bonus", entropy_control_params={"beta0": 0.05})),
}


def _actor_config(loss_mode: str, method: Method, *, norm_len=None, global_info=None):
    from verl.workers.config.actor import ActorConfig

    from runners.backends.verl.plugins.config import TrustbenchPolicyLossConfig

    policy_loss = TrustbenchPolicyLossConfig(
        loss_mode=loss_mode,
        objective_params=dict(method.objective_params),
        mask=method.mask,
        mask_params=dict(method.mask_params),
        entropy_control=method.entropy_control,
        entropy_control_params=dict(method.entropy_control_params),
    )
    config = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        loss_agg_mode=method.loss_agg,
        loss_scale_factor=norm_len,
        policy_loss=policy_loss,
    )
    config.global_batch_info.update(global_info or {})
    return config


def _needs(method: Method) -> tuple[bool, bool]:
    sparse = method.objective == "troll" or method.mask in {"trm_max", "trm_avg", "trm_max_avg"}
    entropy = method.objective == "gtpo" or method.entropy_control == "bonus"
    return sparse, entropy


def plugin_update(loss_mode, method, prob, controller, *, h_ini=None, norm_len=None, global_info=None, weights=None):
    """The plugin through verl's registry; returns (loss, metrics, d loss / d logits)."""
    from runners.backends.verl.plugins import register  # noqa: F401  (registers the plugins)
    from runners.backends.verl.plugins.losses import TrustbenchInputs

    sparse, need_entropy = _needs(method)
    logits = prob.logits.detach().clone().requires_grad_(True)
    inputs = TrustbenchInputs(
        responses=prob.responses,
        group_index=prob.uids,
        entropy=entropy_from_logits(logits) if need_entropy else None,
        logits=logits if sparse else None,
        old_topk_index=prob.old_topk_index,
        old_topk_logp=prob.old_topk_logp,
        runtime={"entropy_control_state": controller.state_dict(), "h_ini": h_ini},
    )
    info = {"loss_scale_factor": norm_len, **(global_info or {})}  # as verl's ppo_loss fills it
    config = _actor_config(loss_mode, method, norm_len=norm_len, global_info=info)
    loss_fn = core_algos.get_policy_loss_fn(loss_mode)
    loss, metrics = loss_fn(
        prob.old_logp,
        token_logprobs(logits, prob.responses),
        prob.advantages,
        prob.mask,
        method.loss_agg,
        config,
        weights,
        inputs=inputs,
    )
    loss.backward()
    return float(loss.detach()), metrics, logits.grad


def _problem(method: Method, seed: int = 0):
    sparse, _ = _needs(method)
    return problem(seed, sparse=method.sparse if sparse else None)


@pytest.mark.parametrize("case", list(CASES))
def test_plugin_equals_local_trainer(case):
    """Loss, logits gradient and method metrics of each plugin equal LocalTrainer._update_actor's."""
    loss_mode, method = CASES[case]
    prob = _problem(method)
    h_ini = 0.5 if method.objective == "gtpo" else None  # below ln 2: GTPO's entropy filter is active
    norm_len = 6.0
    ref_loss, ref_metrics, model = local_update(method, prob, method.controller(), h_ini=h_ini, norm_len=norm_len)
    loss, metrics, grad = plugin_update(loss_mode, method, prob, method.controller(), h_ini=h_ini, norm_len=norm_len)
    assert loss == pytest.approx(ref_loss, rel=1e-6, abs=1e-9)
    torch.testing.assert_close(grad, model.logits.grad, rtol=1e-6, atol=1e-9)
    assert grad.abs().sum() > 0
    for key in (
        "troll/projected_frac",
        "troll/kl_before",
        "gtpo/conflict_frac",
        metric_names.PG_CLIPFRAC,
        metric_names.TRM_MEAN_KL,
    ):
        if key in ref_metrics:
            assert metrics[key] == pytest.approx(ref_metrics[key], rel=1e-6, abs=1e-9), key


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", ["troll_trm_max", "repo_r", "ser"])
def test_aggregation_modes_equal_local_trainer(case, mode):
    """Every loss aggregation (Dr.GRPO's seq-mean-token-sum-norm with a constant norm) as the built-in trainer."""
    loss_mode, base = CASES[case]
    method = Method(**{**base.__dict__, "loss_agg": mode})
    prob = _problem(method, seed=3)
    ref_loss, _, model = local_update(method, prob, method.controller(), norm_len=9.0)
    loss, _, grad = plugin_update(loss_mode, method, prob, method.controller(), norm_len=9.0)
    assert loss == pytest.approx(ref_loss, rel=1e-6, abs=1e-9)
    torch.testing.assert_close(grad, model.logits.grad, rtol=1e-6, atol=1e-9)


def test_cases_are_not_trivial():
    """The test batch makes every mask keep some sequences and reject others, TROLL project some
    tokens but not all, and the controllers move away from their start values."""
    from runners.algorithms import MASKS
    from runners.algorithms.types import PolicyInputs

    for case, (_, method) in CASES.items():
        prob = _problem(method)
        if method.mask != "none":
            inp = PolicyInputs(
                logp=token_logprobs(prob.logits, prob.responses),
                old_logp=prob.old_logp,
                advantages=prob.advantages,
                response_mask=prob.mask,
                logits=prob.logits,
                old_topk_index=prob.old_topk_index,
                old_topk_logp=prob.old_topk_logp,
            )
            keep = MASKS.get(method.mask)(inp, **method.mask_kw).seq_mask
            assert 0 < float(keep.mean()) < 1, case
        if method.objective == "troll":
            _, metrics, _ = plugin_update(*CASES[case], prob, method.controller())
            assert 0 < metrics["troll/projected_frac"] < 1, case
    for name in ("repo_r", "repo_d", "adapo", "bonus"):
        _, method = CASES[name]
        moved = method.controller().state_dict()
        start = Method(**method.__dict__).controller(entropies=()).state_dict()
        assert moved != start, name
    # the statistics behind the thresholds exist on both sides of them
    prob = _problem(CASES["ln_trm"][1])
    scores = ln_trm_scores(
        sample_log_ratio(token_logprobs(prob.logits, prob.responses), prob.old_logp), prob.mask, 1e-4
    )
    assert float(scores.min()) < 0.25 < float(scores.max())
    prob = _problem(CASES["trm_max"][1])
    kl, _ = sparse_token_divergences(prob.logits, prob.old_topk_index, prob.old_topk_logp, prob.mask)
    assert float(kl.max()) > 0.3 > float(kl[prob.mask > 0].min())


def test_global_batch_counts_scale_like_verl_agg_loss():
    """With verl's global-batch info (dp_size ranks, global token/sequence counts) the plugin's loss is
    the local one times (local count / (global count / dp_size)), as verl's agg_loss."""
    loss_mode, method = CASES["troll_trm_max"]
    prob = _problem(method)
    ref, _, _ = plugin_update(loss_mode, method, prob, method.controller())
    tokens = float(prob.mask.sum())
    info = {"dp_size": 2, "batch_num_tokens": 3 * tokens, "global_batch_size": 24}
    scaled, _, _ = plugin_update(loss_mode, method, prob, method.controller(), global_info=info)
    assert scaled == pytest.approx(ref * tokens / (3 * tokens / 2), rel=1e-9)
    seq = Method(**{**method.__dict__, "loss_agg": "seq-mean-token-mean"})
    ref, _, _ = plugin_update(loss_mode, seq, prob, seq.controller())
    scaled, _, _ = plugin_update(loss_mode, seq, prob, seq.controller(), global_info=info)
    assert scaled == pytest.approx(ref * 8 / (24 / 2), rel=1e-9)


def test_rollout_is_weights_multiply_the_token_loss():
    """verl's rollout importance weights [B,T] multiply the per-token loss (as verl's vanilla loss):
    weights equal to 1 change nothing, weights 2 double the loss; verl's vanilla loss does the same."""
    loss_mode, method = CASES["clip_dapo"]
    prob = _problem(method)
    ref, _, _ = plugin_update(loss_mode, method, prob, method.controller())
    ones, _, _ = plugin_update(loss_mode, method, prob, method.controller(), weights=torch.ones_like(prob.mask))
    twos, _, _ = plugin_update(loss_mode, method, prob, method.controller(), weights=2 * torch.ones_like(prob.mask))
    assert ones == pytest.approx(ref, rel=1e-6) and twos == pytest.approx(2 * ref, rel=1e-6)


@pytest.mark.parametrize(
    ("verl_name", "plugin", "method", "c"),
    [
        ("vanilla", "trustbench_clip", Method("clip", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}), 1e9),
        (
            "vanilla",
            "trustbench_clip",
            Method("clip", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0}),
            3.0,
        ),
        ("gspo", "trustbench_gspo", Method("gspo", {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4}), 3.0),
        ("gpg", "trustbench_gpg", Method("gpg"), 3.0),
    ],
)
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum-norm"])
def test_verl_builtin_losses_equal_plugins_through_registry(verl_name, plugin, method, c, mode):
    """verl's built-ins, looked up by name in verl's registry, equal the plugin of the same library
    objective (loss and gradient), Dr.GRPO's constant-norm aggregation included."""
    from verl.workers.config.actor import ActorConfig

    method = Method(**{**method.__dict__, "loss_agg": mode})
    prob = _problem(method, seed=5)
    params = method.objective_params
    config = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=params.get("clip_ratio_low", 0.2),
        clip_ratio_low=params.get("clip_ratio_low", 3e-4 if verl_name == "gspo" else 0.2),
        clip_ratio_high=params.get("clip_ratio_high", 4e-4 if verl_name == "gspo" else 0.2),
        clip_ratio_c=c,
        loss_agg_mode=mode,
        loss_scale_factor=7,
    )
    config.global_batch_info["loss_scale_factor"] = 7  # what verl's ppo_loss does before the call
    logits = prob.logits.detach().clone().requires_grad_(True)
    logp = token_logprobs(logits, prob.responses).float()
    ref, _ = core_algos.get_policy_loss_fn(verl_name)(
        prob.old_logp.float(), logp, prob.advantages.float(), prob.mask, mode, config
    )
    ref.backward()
    loss, _, grad = plugin_update(plugin, method, prob, method.controller(), norm_len=7)
    assert loss == pytest.approx(float(ref.detach()), rel=1e-5, abs=1e-7)
    torch.testing.assert_close(grad, logits.grad, rtol=1e-4, atol=1e-7)


def test_errors_name_the_setting():
    from runners.backends.verl.plugins.config import TrustbenchPolicyLossConfig

    loss_mode, method = CASES["clip_dapo"]
    prob = _problem(method)
    with pytest.raises(ValueError, match="loss_agg_mode='token-sum'"):
        plugin_update(loss_mode, Method(**{**method.__dict__, "loss_agg": "token-sum"}), prob, method.controller())
    with pytest.raises(ValueError, match="policy_loss.mask='trm_maxx'"):
        TrustbenchPolicyLossConfig(loss_mode=loss_mode, mask="trm_maxx")
    with pytest.raises(ValueError, match="calculate_entropy=true"):
        _, bonus = CASES["bonus"]
        from runners.backends.verl.plugins.losses import TrustbenchInputs

        core_algos.get_policy_loss_fn("trustbench_clip")(
            prob.old_logp,
            prob.old_logp.clone(),
            prob.advantages,
            prob.mask,
            "token-mean",
            _actor_config("trustbench_clip", bonus),
            None,
            inputs=TrustbenchInputs(),
        )
    assert math.isfinite(plugin_update(loss_mode, method, prob, method.controller())[0])


def test_the_loss_is_built_once_per_iteration_and_rebuilt_when_its_state_or_config_changes(monkeypatch):
    """verl calls the loss once per micro-batch: the plugin builds its ``PolicyLoss`` once and reuses it
    while the config's fields and the controller state the trainer pushed are unchanged; a new state
    (the next iteration: REPO-R's coefficient moved) or a changed config builds anew, and the rebuilt
    loss equals the built-in trainer's at that state."""
    from runners.backends.verl.plugins import losses

    built = []
    build = losses.PolicyLoss
    monkeypatch.setattr(losses, "PolicyLoss", lambda *a, **k: built.append(a[0]) or build(*a, **k))
    monkeypatch.setattr(losses, "_BUILT", {})
    loss_mode, method = CASES["repo_r"]
    prob = _problem(method)
    controller = method.controller()
    first, _, first_grad = plugin_update(loss_mode, method, prob, controller)
    again, _, again_grad = plugin_update(loss_mode, method, prob, controller)
    assert len(built) == 1 and again == first and torch.equal(again_grad, first_grad)
    controller.update(0.6)  # the next iteration: the coefficient moves
    moved, _, moved_grad = plugin_update(loss_mode, method, prob, controller)
    assert len(built) == 2 and moved != first
    ref_loss, _, model = local_update(method, prob, controller)
    assert moved == pytest.approx(ref_loss, rel=1e-6, abs=1e-9)
    torch.testing.assert_close(moved_grad, model.logits.grad, rtol=1e-6, atol=1e-9)
    wider = Method(**{**method.__dict__, "entropy_control_params": {"zeta0": 0.02, "zeta_max": 0.1}})
    plugin_update(loss_mode, wider, prob, controller)
    assert len(built) == 3 and dict(built[-1].entropy_control_kw)["zeta_max"] == 0.1
