"""Same cell, same numbers: every algorithm preset gives the same loss and gradients on both backends.

For each preset the cell is composed once and taken through each backend's own entry point, on one
batch (a tiny float64 Qwen2, four responses in two prompt groups, fixed GRPO advantages, a moderate
drift between the old and the current policy, and rollout log-probs from a third policy, so that the
rollout policy differs from pi_old as it does with a separate inference engine):

- built-in backend: ``runners.backends.local.actor.update_actor`` (what ``LocalTrainer.step`` calls)
  with the method the trainer builds (``Method.from_config``), a zero learning rate, one mini-batch;
- verl backend: the overrides ``build_overrides`` writes for the cell, applied to verl 0.9.1's own
  config and built into its ``ActorConfig`` as ``main_ppo`` does; the old-log-prob pass and the update
  pass through verl's engine code (``FSDPEngineWithLMHead.prepare_model_inputs/outputs`` with the
  trustbench hooks) and the actor loss verl runs (``trustbench_ppo_loss``, i.e. verl's ``ppo_loss``
  with verl's built-in policy loss where the translation chose one, the ``trustbench_*`` plugin
  otherwise), fed the controller state and H_ini the trustbench trainer pushes.

The loss and every parameter gradient must agree (relative 1e-6; the library computes ratios in float32
and verl's built-in losses in the input dtype, so gradients are compared at 1e-6 of their scale). T-PPO cannot be expressed in verl (its
truncated rollouts): the translation must refuse it naming ``rollout.mode``. One more cell adds a
KL-to-reference term under a TRM mask, whose reference log-probs both backends receive.

The sample-based masks (TRM-Max(k2), TRM-Avg(k3), their combination, LN-TRM, SER) compare the current
policy with the rollout policy (TRM, arXiv 2512.23075, appendix B): their thresholds sit where the
accepted sequences against the rollout log-probs differ from those against pi_old's, so a backend that
used pi_old as the reference would compute another loss and fail the comparison.

Run: ``pytest tests/verl/test_cross_backend.py``.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import torch

from runners.algorithms import ESTIMATORS
from runners.algorithms.method import Method
from runners.algorithms.policy_loss import PolicyLoss, build_controller
from runners.algorithms.types import AdvantageInputs
from runners.config.validate import ConfigError

from ._verl_config import _compose, _translate, make_verl_config, verl_accepts

pytestmark = pytest.mark.verl
pytest.importorskip("verl.workers.engine.fsdp.transformer_impl")

from .test_plugins_engine import RESPONSES, _batch, _engine, _forward, _model, _padded, _response_logits, _sequences  # noqa: E402

CONF = Path(__file__).resolve().parents[2] / "conf"
PRESETS = sorted(p.stem for p in (CONF / "algorithm").glob("*.yaml"))
# presets verl cannot express, and the key the refusal names
INEXPRESSIBLE = {"tppo": "rollout.mode"}
# a small vocabulary: the stored sparse distribution keeps top_k of it (a truncated support)
TOP_K = 6
EXTRA_CELLS = {
    "grpo+trm_max+kl": (
        "algorithm=grpo",
        "mask=trm_max",
        f"mask.top_k={TOP_K}",
        "mask.delta=0.01",
        "trainer.kl_coef=0.05",
    ),
    "grpo+cispo": ("algorithm=grpo", "objective=cispo", "objective.clip_ratio_low=0.2"),
    "gspo+troll+repo_r": ("algorithm=gspo", "objective=troll", f"objective.top_k={TOP_K}", "entropy_control=repo_r"),
    # sample-based masks: against the rollout log-probs they keep part of the batch, against pi_old's other
    # sequences (per-sequence scores rollout / pi_old: max k2 .004 .013 .011 .009 / .022 .030 .012 .054;
    # mean k3 .001 .007 .004 .004 / .006 .017 .003 .017; SER .041 .091 .072 .073 / .088 .152 .064 .118;
    # LN-TRM .022 .011 .078 .040 / .080 .026 .068 .037)
    "grpo+trm_max_k2": ("algorithm=grpo", "mask=trm_max_k2", "mask.delta=0.01"),
    "grpo+trm_avg_k3": ("algorithm=grpo", "mask=trm_avg_k3", "mask.delta_avg=0.005"),
    "dapo+trm_max_avg_sample": (
        "algorithm=dapo",
        "mask=trm_max_avg_sample",
        "mask.delta=0.012",
        "mask.delta_avg=0.005",
    ),
    "gspo+ln_trm": ("algorithm=gspo", "mask=ln_trm", "mask.delta_w=0.03"),
    "grpo+ser": ("algorithm=grpo", "mask=ser", "mask.delta_ser=0.08"),
}


@pytest.fixture(scope="module")
def verl_config():
    make = make_verl_config()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        yield make


def _cells():
    cells = {name: (f"algorithm={name}",) for name in PRESETS if name not in INEXPRESSIBLE}
    cells.update(EXTRA_CELLS)
    return cells


def _controller_state(method: Method) -> dict:
    """The method's controller after a few iterations (its coefficient has left its start value)."""
    controller = build_controller(method)
    for value in (1.0, 1.2, 0.9):
        controller.update(value)
    return controller.state_dict()


def _drift(base, other, share: float):
    """``base`` moved ``share`` of the way to ``other`` (in place); returns ``base``."""
    with torch.no_grad():
        for p_base, p_other in zip(base.parameters(), other.parameters()):
            p_base.copy_(p_base + share * (p_other - p_base))
    return base


def _drifted_models():
    """pi_old, the current policy (drifted from it), the reference policy, and the rollout policy (pi_old
    drifted elsewhere: the inference engine's mismatch)."""
    old_model = _model(1)
    model = _drift(_model(1), _model(3), 0.3)
    rollout_model = _drift(_model(1), _model(11), 0.3)
    return old_model, model, _model(5), rollout_model


@pytest.mark.parametrize("cell", list(_cells()))
def test_both_backends_compute_the_same_loss_and_gradients(verl_config, cell):
    from verl.workers.utils.padding import response_from_nested, response_to_nested

    from runners.backends.local.actor import OldPass, UpdateSettings, update_actor
    from runners.backends.verl.plugins.losses import RUNTIME_KEY
    from runners.backends.verl.plugins.ppo_loss import trustbench_ppo_loss
    from runners.backends.verl.plugins.sparse_old import (
        KEEP_LOGITS_KEY,
        OLD_TOPK_INDEX,
        OLD_TOPK_LOGP,
        SPARSIFY_KEY,
    )
    from tests.backends._batch import rollout_batch

    cfg = _compose((*_cells()[cell], "model=qwen3_1.7b"))
    method = Method.from_config(cfg)
    _, actor = verl_accepts(verl_config(_translate(cfg)))
    prompts, responses = _sequences(seed=2)
    old_model, model, ref_model, rollout_model = _drifted_models()
    sparse = method.requires("sparse_old")
    state = _controller_state(method)
    h_ini = 0.5 if method.requires("h_ini") else None  # below ln 2: GTPO's entropy filter acts

    # the old-log-prob pass, once, through verl's engine hook; both backends train on its outputs
    flags = {SPARSIFY_KEY: method.sparse} if sparse else {}
    td_old = _batch(prompts, responses, remove_padding=True, calculate_entropy=True, **flags)
    with torch.no_grad():
        old_out = _forward(_engine(old_model), td_old)
        ref_out = _forward(_engine(ref_model), _batch(prompts, responses, remove_padding=True))
        rollout_out = _forward(_engine(rollout_model), _batch(prompts, responses, remove_padding=True))
    mask_nt = td_old["response_mask"]
    ref_logp_nt = response_from_nested(ref_out["log_probs"], mask_nt)
    old_logp_nt = response_from_nested(old_out["log_probs"], mask_nt)
    rollout_logp_nt = response_from_nested(rollout_out["log_probs"], mask_nt)
    rollout_logp = torch.nested.to_padded_tensor(rollout_logp_nt, 0.0)
    assert not torch.allclose(rollout_logp, torch.nested.to_padded_tensor(old_logp_nt, 0.0))
    mask = _padded([torch.ones(len(r)) for r in responses]).double()
    rewards = torch.zeros_like(mask)
    rewards[torch.arange(4), torch.tensor(RESPONSES) - 1] = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    groups = torch.tensor([0, 0, 1, 1])
    adv, _ = ESTIMATORS.get("grpo")(AdvantageInputs(rewards, mask, group_index=groups))
    adv = adv.double()
    old = OldPass(old_logp=torch.nested.to_padded_tensor(old_logp_nt, 0.0))
    if sparse:
        old.old_topk_index = torch.nested.to_padded_tensor(old_out[OLD_TOPK_INDEX], 0).long()
        old.old_topk_logp = torch.nested.to_padded_tensor(old_out[OLD_TOPK_LOGP], float("-inf"))
    if method.kl_coef:
        old.ref_logp = torch.nested.to_padded_tensor(ref_logp_nt, 0.0)

    # built-in backend: the trainer's update on the same model
    batch = rollout_batch(responses=_padded(responses).long(), group_index=groups, rollout_logp=rollout_logp)
    local_metrics, _ = update_actor(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        lambda _b, rows: _response_logits(model, prompts, responses, rows),
        PolicyLoss(method, build_controller(method, state)),
        batch,
        old,
        adv,
        mask,
        settings=UpdateSettings(1, 1.0, 0, 0.0, "fp32"),
        shuffle=torch.Generator().manual_seed(0),
        h_ini=h_ini,
    )
    local_grads = [p.grad.detach().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)

    # verl backend: the translated actor config, verl's engine and ppo_loss
    plugin = actor.policy_loss.loss_mode.startswith("trustbench_")
    fields = {
        "old_log_probs": old_logp_nt,
        "advantages": response_to_nested(adv, mask_nt),
        "rollout_log_probs": rollout_logp_nt,
        KEEP_LOGITS_KEY: plugin and sparse,
        RUNTIME_KEY: {"entropy_control_state": state, "h_ini": h_ini},
        "calculate_entropy": bool(actor.calculate_entropy or actor.entropy_coeff),
        "dp_size": 1,
        "batch_num_tokens": int(mask.sum()),
        "global_batch_size": 4,
    }
    if actor.use_kl_loss:
        fields["ref_log_prob"] = ref_logp_nt
    if sparse:
        fields[OLD_TOPK_INDEX] = old_out[OLD_TOPK_INDEX]
        fields[OLD_TOPK_LOGP] = old_out[OLD_TOPK_LOGP]
    td = _batch(prompts, responses, remove_padding=True, **fields)
    loss_fn = partial(trustbench_ppo_loss, config=actor)
    model.train()
    loss, _ = loss_fn(model_output=_forward(_engine(model), td, loss_fn), data=td)
    loss.backward()

    # the library forms ratios and log-probs in float32, verl's built-in losses keep the input dtype (float64
    # here): with a built-in, values agree to float32 rounding, gradients relative to their scale
    loss_abs = 1e-10 if plugin else 1e-7
    assert float(loss.detach()) == pytest.approx(local_metrics["actor/pg_loss"], rel=1e-6, abs=loss_abs), cell
    scale = max(float(g.abs().max()) for g in local_grads)
    for p, ref in zip(model.parameters(), local_grads):
        torch.testing.assert_close(p.grad, ref, rtol=1e-6, atol=1e-6 * scale)
    assert sum(float(g.abs().sum()) for g in local_grads) > 0, "the batch must carry a gradient"
    if method.mask != "none":  # the mask acts: it rejects part of the batch
        assert 0 < local_metrics["trm/accept_rate"] < 1, local_metrics["trm/accept_rate"]


@pytest.mark.parametrize("preset", sorted(INEXPRESSIBLE))
def test_presets_verl_cannot_express_are_refused_naming_the_key(preset):
    with pytest.raises(ConfigError) as err:
        _translate(_compose((f"algorithm={preset}", "model=qwen3_1.7b")))
    assert err.value.key == INEXPRESSIBLE[preset]


def test_every_preset_is_covered():
    assert set(PRESETS) == set(INEXPRESSIBLE) | {c for c in _cells() if c in PRESETS}
