"""Policy objectives and the value loss against verl's policy/value losses (aggregated loss, gradient
w.r.t. logp, metrics), hand-computed cases, GSPO's sequence-level gradient, BAPO's bound search
against a per-token loop, and property tests on huge log-ratios.

Run: ``pytest tests/algorithms/test_objectives.py`` (the ``verl`` tests import verl's core_algos).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from runners import metric_names
from runners.algorithms import LOSS_AGGS, OBJECTIVES
from runners.algorithms.loss_agg import seq_mean_token_mean, token_mean
from runners.algorithms.objectives import (
    BAPO_CLIP_HIGH,
    BAPO_CLIP_LOW,
    BAPO_POS_SHARE,
    bapo_objective,
    bapo_positive_share,
    clip_objective,
    entropy_bonus_term,
    gpg_objective,
    gspo_objective,
    token_is_objective,
    value_loss,
)
from runners.algorithms.types import PolicyInputs

from ._ref_batches import policy_batch

MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


@pytest.fixture(scope="module")
def core_algos():
    return pytest.importorskip("verl.trainer.ppo.core_algos")


def _actor_config(mode: str, low: float, high: float, c: float):
    """verl's ActorConfig as its own CPU tests build it (strategy, rollout_n, micro batch are required)."""
    from verl.workers.config.actor import ActorConfig

    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=low,
        clip_ratio_low=low,
        clip_ratio_high=high,
        clip_ratio_c=c,
        loss_agg_mode=mode,
    )


def _batch(seed: int):
    logp, old_logp, adv, mask = policy_batch(seed, batch=10, length=9, spread=0.4)
    with torch.no_grad():  # a few large ratios so that the dual clip (r > 3 with A < 0) is exercised
        old_logp[:2, :4] -= 2.5
        adv[0] = -adv[0].abs()
    return logp, old_logp, adv, mask


def _ours_and_grad(fn, mode, logp, old_logp, adv, mask, **params):
    logp = logp.detach().clone().requires_grad_(True)
    out = fn(PolicyInputs(logp, old_logp, adv, mask), **params)
    loss = LOSS_AGGS.get(mode)(out.loss_mat, mask)
    loss.backward()
    return loss.detach(), logp.grad, out.metrics


def _verl_and_grad(verl_fn, mode, config, logp, old_logp, adv, mask):
    logp = logp.detach().clone().requires_grad_(True)
    loss, metrics = verl_fn(old_logp, logp, adv, mask, mode, config)
    loss.backward()
    return loss.detach(), logp.grad, metrics


CLIP_CASES = {
    "ppo": ({"clip_ratio_low": 0.2, "clip_ratio_high": 0.2}, (0.2, 0.2, 1e9)),
    "dapo": ({"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}, (0.2, 0.28, 1e9)),
    "dual_clip": ({"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0}, (0.2, 0.2, 3.0)),
}


@pytest.mark.verl
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(CLIP_CASES))
@pytest.mark.parametrize("seed", [0, 1])
def test_clip_matches_verl_vanilla(core_algos, case, mode, seed):
    """PPO clip, DAPO asymmetric clip and dual clip equal verl's compute_policy_loss_vanilla: aggregated
    loss, gradient w.r.t. logp and the three metrics (verl's dual clip is off via c = 1e9)."""
    params, (low, high, c) = CLIP_CASES[case]
    batch = _batch(seed)
    loss, grad, metrics = _ours_and_grad(clip_objective, mode, *batch, **params)
    ref_loss, ref_grad, ref_metrics = _verl_and_grad(
        core_algos.compute_policy_loss_vanilla, mode, _actor_config(mode, low, high, c), *batch
    )
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grad, ref_grad)
    for name in (metric_names.PG_CLIPFRAC, metric_names.PG_CLIPFRAC_LOWER, metric_names.PPO_KL):
        assert metrics[name] == pytest.approx(ref_metrics[name], abs=1e-6)
    assert 0 < metrics[metric_names.PG_CLIPFRAC] < 1
    if case == "dual_clip":
        assert metrics[metric_names.PG_CLIPFRAC_LOWER] > 0


@pytest.mark.verl
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("low", "high"), [(3e-4, 4e-4), (0.05, 0.1)])
def test_gspo_matches_verl(core_algos, mode, low, high):
    """GSPO equals verl's compute_policy_loss_gspo (stop-gradient token form), loss and gradient."""
    batch = policy_batch(3, batch=10, length=9, spread=0.05)
    loss, grad, metrics = _ours_and_grad(gspo_objective, mode, *batch, clip_ratio_low=low, clip_ratio_high=high)
    ref_loss, ref_grad, ref_metrics = _verl_and_grad(
        core_algos.compute_policy_loss_gspo, mode, _actor_config(mode, low, high, 3.0), *batch
    )
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grad, ref_grad)
    assert metrics[metric_names.PG_CLIPFRAC] == pytest.approx(ref_metrics[metric_names.PG_CLIPFRAC], abs=1e-6)
    assert metrics[metric_names.PPO_KL] == pytest.approx(ref_metrics[metric_names.PPO_KL], abs=1e-6)


@pytest.mark.verl
@pytest.mark.parametrize("mode", MODES)
def test_gpg_matches_verl(core_algos, mode):
    """GPG's loss -logp A equals verl's compute_policy_loss_gpg, loss and gradient."""
    batch = policy_batch(4)
    loss, grad, _ = _ours_and_grad(gpg_objective, mode, *batch)
    ref_loss, ref_grad, _ = _verl_and_grad(
        core_algos.compute_policy_loss_gpg, mode, _actor_config(mode, 0.2, 0.2, 3.0), *batch
    )
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grad, ref_grad)


@pytest.mark.verl
@pytest.mark.parametrize("clip", [0.2, 0.5])
def test_value_loss_matches_verl_when_symmetric(core_algos, clip):
    """clip_low == clip_high is PPO's clipped value loss: equals verl's compute_value_loss (vf_loss,
    vf_clipfrac, gradient w.r.t. the values). The asymmetric T-PPO form is checked by hand below."""
    gen = torch.Generator().manual_seed(5)
    v_old = torch.randn(6, 7, generator=gen)
    values = (v_old + 0.8 * torch.randn(6, 7, generator=gen)).requires_grad_(True)
    returns = torch.randn(6, 7, generator=gen)
    mask = (torch.arange(7)[None] < torch.randint(1, 8, (6, 1), generator=gen)).float()
    out = value_loss(values, v_old, returns, mask, clip_low=clip, clip_high=clip)
    (grad,) = torch.autograd.grad(token_mean(out.loss_mat, mask), values)
    v_ref = values.detach().clone().requires_grad_(True)
    ref_loss, ref_clipfrac = core_algos.compute_value_loss(v_ref, returns, v_old, mask, cliprange_value=clip)
    (ref_grad,) = torch.autograd.grad(ref_loss, v_ref)
    assert out.metrics[metric_names.VF_LOSS] == pytest.approx(ref_loss.item(), rel=1e-6)
    assert out.metrics[metric_names.VF_CLIPFRAC] == pytest.approx(ref_clipfrac.item(), abs=1e-6)
    assert 0 < out.metrics[metric_names.VF_CLIPFRAC] < 1
    torch.testing.assert_close(grad, ref_grad)


# -- hand-computed cases -----------------------------------------------------------------------
def _one(logp: float, old_logp: float, adv: float) -> PolicyInputs:
    return PolicyInputs(
        torch.tensor([[logp]], requires_grad=True), torch.tensor([[old_logp]]), torch.tensor([[adv]]), torch.ones(1, 1)
    )


def test_clip_hand_cases():
    """r = 1.5, A = +1: clipped at 1.2 (loss -1.2, no gradient); r = 0.5, A = +1: unclipped (loss -0.5);
    A = -1, r = 5, c = 3: dual clip caps the loss at 3; DAPO's eps_high = 0.28 allows r up to 1.28."""
    cases = [
        ({}, (math.log(1.5), 1.0), -1.2, 0.0),
        ({}, (math.log(0.5), 1.0), -0.5, -0.5),
        ({"clip_ratio_c": 3.0}, (math.log(5.0), -1.0), 3.0, 0.0),
        ({}, (math.log(5.0), -1.0), 5.0, 5.0),
        ({"clip_ratio_high": 0.28}, (math.log(1.5), 1.0), -1.28, 0.0),
    ]
    for params, (lr, adv), loss, grad in cases:
        inp = _one(lr, 0.0, adv)
        out = clip_objective(inp, **params)
        out.loss_mat.sum().backward()
        assert out.loss_mat.item() == pytest.approx(loss, rel=1e-6)
        assert inp.logp.grad.item() == pytest.approx(grad, rel=1e-6, abs=1e-7)


def test_token_is_equals_unclipped_ppo_and_bf16_inputs_upcast():
    """Token-IS = r A is PPO clip with bounds that never bind; bf16 log-probs are subtracted in fp32."""
    logp, old_logp, adv, mask = policy_batch(6, spread=0.5)
    inp = PolicyInputs(logp, old_logp, adv, mask)
    wide = clip_objective(inp, clip_ratio_low=1 - 1e-12, clip_ratio_high=1e9)
    torch.testing.assert_close(token_is_objective(inp).loss_mat, wide.loss_mat)
    bf16 = PolicyInputs(logp.detach().bfloat16(), old_logp.bfloat16(), adv, mask)
    upcast = PolicyInputs(bf16.logp.float(), bf16.old_logp.float(), adv, mask)
    out = clip_objective(bf16)
    assert out.loss_mat.dtype == torch.float32
    torch.testing.assert_close(out.loss_mat, clip_objective(upcast).loss_mat, rtol=0, atol=0)


def test_gspo_gradient_equals_sequence_level_gradient():
    """Unclipped, GSPO's token form with seq-mean-token-mean has the gradient of the sequence-level
    objective mean_i s_i A_i with s_i = exp(mean_t (logp - old_logp)) (GSPO's definition)."""
    logp, old_logp, _, mask = policy_batch(7, spread=0.05)
    adv = torch.randn(logp.shape[0], 1).expand_as(logp).contiguous()
    out = gspo_objective(PolicyInputs(logp, old_logp, adv, mask), clip_ratio_low=0.9, clip_ratio_high=1e3)
    (grad,) = torch.autograd.grad(seq_mean_token_mean(out.loss_mat, mask), logp)
    seq_ratio = (((logp - old_logp) * mask).sum(-1) / mask.sum(-1)).exp()
    (ref,) = torch.autograd.grad(-(seq_ratio * adv[:, 0]).mean(), logp)
    torch.testing.assert_close(grad, ref)


def test_value_loss_asymmetric_hand_cases():
    """xi_low = 0.5, xi_high = 0.6 around V_old = 0 (T-PPO, arXiv 2506.15050, eqs. 4-5)."""
    values = torch.tensor([[1.0, -1.0, 1.0, 0.3]])
    returns = torch.tensor([[2.0, -2.0, 0.0, 0.0]])
    out = value_loss(values, torch.zeros(1, 4), returns, torch.ones(1, 4))
    # clip(1) = 0.6 -> max(1, 1.96); clip(-1) = -0.5 -> max(1, 2.25); clip(1) = 0.6 -> max(1, 0.36); inside
    expected = 0.5 * torch.tensor([[1.96, 2.25, 1.0, 0.09]])
    torch.testing.assert_close(out.loss_mat, expected)
    assert out.metrics[metric_names.VF_CLIPFRAC] == pytest.approx(0.5)
    assert out.metrics[metric_names.VF_LOSS] == pytest.approx(expected.mean().item())


def test_entropy_bonus_term_sign():
    entropy = torch.tensor([[0.5, 2.0]])
    torch.testing.assert_close(entropy_bonus_term(entropy, 0.01), torch.tensor([[-0.005, -0.02]]))


def test_invalid_parameters_name_the_key():
    inp = _one(0.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        clip_objective(inp, clip_ratio_c=0.5)
    with pytest.raises(ValueError, match="clip_ratio_low"):
        clip_objective(inp, clip_ratio_low=1.5)
    with pytest.raises(ValueError, match="rule"):
        bapo_objective(inp, rule="magic")
    with pytest.raises(ValueError, match="ratio_low_start"):
        bapo_objective(inp, ratio_low_start=0.95, ratio_low_max=0.9)


# -- BAPO ----------------------------------------------------------------------------------------
def _share_by_loop(ratio, adv, mask, lower, upper, rule):
    """Per-token loop: positive share of |contribution| (see objectives.py, BAPO section)."""
    pos = neg = 0.0
    for r, a, m in zip(ratio.flatten().tolist(), adv.flatten().tolist(), mask.flatten().tolist()):
        if m == 0 or a == 0:
            continue
        if rule == "paper":
            if a > 0 and r <= upper:
                pos += r * a
            elif a < 0 and r >= lower:
                neg += -r * a
        elif a > 0:
            pos += min(r, upper) * a
        else:
            neg += max(r, lower) * -a
    return 1.0 if pos + neg <= 0 else pos / (pos + neg)


def _negative_heavy(seed: int, spread: float = 0.6):
    logp, old_logp, adv, mask = policy_batch(seed, batch=12, length=10, spread=spread)
    adv = adv - 0.8  # most tokens negative
    return PolicyInputs(logp, old_logp, adv, mask)


def _tunable(seed: int) -> PolicyInputs:
    """40 positive tokens (A = 1, r in [1, 2.5]) and 80 negative ones (A = -1, r in [0.5, 1.2]):
    the positive share starts low and crosses 0.45-0.5 while the bounds move (not at their maxima)."""
    gen = torch.Generator().manual_seed(seed)
    ratio = torch.cat([1 + 1.5 * torch.rand(40, generator=gen), 0.5 + 0.7 * torch.rand(80, generator=gen)])
    adv = torch.cat([torch.ones(40), -torch.ones(80)])
    order = torch.randperm(120, generator=gen)
    old_logp = torch.full((12, 10), -1.0)
    logp = (old_logp + ratio[order].log().reshape(12, 10)).requires_grad_(True)
    return PolicyInputs(logp, old_logp, adv[order].reshape(12, 10), torch.ones(12, 10))


@pytest.mark.parametrize("rule", ["paper", "recipe"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bapo_share_matches_token_loop(rule, seed):
    inp = _negative_heavy(seed)
    ratio = (inp.logp - inp.old_logp).detach().exp()
    for lower, upper in [(0.6, 1.2), (0.75, 1.6), (0.9, 3.0)]:
        ours = bapo_positive_share(ratio, inp.advantages, inp.response_mask, lower, upper, rule)
        assert ours == pytest.approx(_share_by_loop(ratio, inp.advantages, inp.response_mask, lower, upper, rule))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_bapo_paper_rule_stops_at_first_bounds_reaching_target(seed):
    """The chosen bounds reach rho and the previous step's did not; the loss is PPO clip with them."""
    inp = _tunable(seed)
    rho = 0.5
    out = bapo_objective(inp, rho=rho)
    lower, upper = out.metrics[BAPO_CLIP_LOW], out.metrics[BAPO_CLIP_HIGH]
    ratio = (inp.logp - inp.old_logp).detach().exp()

    def share(lo, hi):
        return _share_by_loop(ratio, inp.advantages, inp.response_mask, lo, hi, "paper")

    assert out.metrics[BAPO_POS_SHARE] == pytest.approx(share(lower, upper))
    assert share(0.6, 1.2) < rho <= share(lower, upper)
    steps = round((upper - 1.2) / 0.05)  # both bounds step together; c_low is capped at 0.9 first
    assert 0 < steps and upper < 3.0
    assert lower == pytest.approx(min(0.6 + steps * 0.05, 0.9))
    assert share(min(0.6 + (steps - 1) * 0.05, 0.9), 1.2 + (steps - 1) * 0.05) < rho
    expected = clip_objective(inp, clip_ratio_low=1 - lower, clip_ratio_high=upper - 1)
    torch.testing.assert_close(out.loss_mat, expected.loss_mat)


def test_bapo_keeps_start_bounds_when_balanced_and_maxes_out_when_hopeless():
    logp, old_logp, adv, mask = policy_batch(8)
    positive = bapo_objective(PolicyInputs(logp, old_logp, adv.abs(), mask))
    assert (positive.metrics[BAPO_CLIP_LOW], positive.metrics[BAPO_CLIP_HIGH]) == (0.6, 1.2)
    negative = bapo_objective(PolicyInputs(logp, old_logp, -adv.abs(), mask))
    assert (negative.metrics[BAPO_CLIP_LOW], negative.metrics[BAPO_CLIP_HIGH]) == (0.9, 3.0)
    assert negative.metrics[BAPO_POS_SHARE] == 0.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bapo_recipe_rule_raises_lower_bound_first(seed):
    """The authors' recipe raises c_low to its maximum before moving c_high, then stops c_high at
    the first step whose share (clipped surrogate values of all tokens) reaches rho."""
    inp = _tunable(seed)
    ratio = (inp.logp - inp.old_logp).detach().exp()
    rho = 0.45
    out = bapo_objective(inp, rho=rho, rule="recipe")
    lower, upper = out.metrics[BAPO_CLIP_LOW], out.metrics[BAPO_CLIP_HIGH]

    def share(lo, hi):
        return _share_by_loop(ratio, inp.advantages, inp.response_mask, lo, hi, "recipe")

    assert share(0.9, 1.2) < rho
    assert lower == 0.9 and 1.2 < upper < 3.0
    assert share(lower, upper - 0.05) < rho <= share(lower, upper)


# -- properties on extreme inputs --------------------------------------------------------------
@pytest.mark.parametrize("name", ["clip", "token_is", "gspo", "gpg", "bapo"])
@settings(max_examples=40, deadline=None)
@given(
    log_ratio=st.lists(st.floats(-1e4, 1e4), min_size=6, max_size=6),
    adv=st.sampled_from([0.0, 1.0, -1.0, 1e3, -1e3]),
    length=st.integers(1, 3),
)
def test_objectives_finite_for_huge_log_ratios(name, log_ratio, adv, length):
    """Log-ratios up to +-1e4, length-1 responses: finite loss and finite gradient."""
    lr = torch.tensor(log_ratio).reshape(2, 3)
    old_logp = torch.full((2, 3), -5.0)
    logp = (old_logp + lr).requires_grad_(True)
    mask = (torch.arange(3)[None] < length).float().expand(2, 3)
    out = OBJECTIVES.get(name)(PolicyInputs(logp, old_logp, torch.full((2, 3), adv), mask))
    (grad,) = torch.autograd.grad(token_mean(out.loss_mat, mask), logp)
    assert torch.isfinite(out.loss_mat).all() and torch.isfinite(grad).all()
    assert all(math.isfinite(v) for v in out.metrics.values())
