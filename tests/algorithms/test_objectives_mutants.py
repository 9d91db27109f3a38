"""Policy objectives, the value loss and the entropy bonus term on what mutation testing showed the other
tests leave open: float32 results for float64 / bfloat16 inputs, the value clip ranges' bounds (0 allowed,
each negative one refused by name), and further cases listed per test.

References: float64 loops written here from the papers (T-PPO, arXiv 2506.15050, eqs. 4-5, for the value
loss) and the ``ref_*`` loops of ``test_ref_objectives``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from runners import metric_names
from runners.algorithms import OBJECTIVES
from runners.algorithms.objectives import (
    BAPO_CLIP_HIGH,
    BAPO_CLIP_LOW,
    BAPO_POS_SHARE,
    bapo_objective,
    bapo_positive_share,
    choose_bapo_bounds,
    clip_objective,
    entropy_bonus_term,
    gspo_objective,
    token_is_objective,
    value_loss,
)
from runners.algorithms.types import PolicyInputs

from .test_ref_objectives import (
    RTOL,
    Batch,
    bapo_batch,
    gspo_batch,
    ref_bapo,
    ref_clip,
    ref_gpg_loss,
    ref_gspo,
    ref_token_is,
    token_batch,
)


def ref_value_loss(values, values_old, returns, mask, *, clip_low, clip_high):
    """T-PPO's clipped value loss per token, ``0.5 max((V - R)^2, (clip(V, V_old - xi_low, V_old + xi_high)
    - R)^2)`` (arXiv 2506.15050, eqs. 4-5), its token mean over ``mask`` and the share of tokens where the
    clipped term is the larger one. Returns ``(loss [B,T], vf_loss, vf_clipfrac)``."""
    loss = np.zeros(mask.shape)
    total = clipped = count = 0.0
    for i in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            v, v_old, r = float(values[i, t]), float(values_old[i, t]), float(returns[i, t])
            v_clip = min(max(v, v_old - clip_low), v_old + clip_high)
            loss[i, t] = 0.5 * max((v - r) ** 2, (v_clip - r) ** 2)
            if mask[i, t] > 0:
                total += loss[i, t]
                clipped += float((v_clip - r) ** 2 > (v - r) ** 2)
                count += 1
    return loss, total / max(count, 1), clipped / max(count, 1)


def _value_case():
    """Values moved off V_old by -2.5 .. 2.5 (both clip sides and inside), returns around V_old; float32
    representable; row 2 is padding after its first two tokens."""
    rng = np.random.default_rng(0)
    shape = (4, 6)
    values_old = np.round(rng.uniform(-1.0, 1.0, shape), 3)
    values = values_old + np.round(rng.uniform(-2.5, 2.5, shape), 3)
    returns = values_old + np.round(rng.uniform(-2.5, 2.5, shape), 3)
    mask = np.ones(shape)
    mask[2, 2:] = 0.0
    f32 = [np.asarray(x, dtype=np.float32).astype(np.float64) for x in (values, values_old, returns)]
    return (*f32, mask)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("clip", [(0.5, 0.6), (0.0, 0.3), (0.4, 0.0), (0.0, 0.0)])
def test_value_loss_is_float32_and_matches_the_loop(dtype, clip):
    """Every input in ``dtype`` (float64 or bf16): the loss matrix is float32 and equals the loop on the
    inputs as float32; a clip range of 0 on either side (or both: V_old itself) is allowed."""
    values, values_old, returns, mask = _value_case()
    if dtype == torch.bfloat16:
        values, values_old, returns = (
            torch.tensor(x).to(torch.bfloat16).double().numpy() for x in (values, values_old, returns)
        )
    clip_low, clip_high = clip
    out = value_loss(
        *(torch.tensor(x).to(dtype) for x in (values, values_old, returns, mask)),
        clip_low=clip_low,
        clip_high=clip_high,
    )
    assert out.loss_mat.dtype == torch.float32
    ref, vf_loss, vf_clipfrac = ref_value_loss(
        values, values_old, returns, mask, clip_low=clip_low, clip_high=clip_high
    )
    np.testing.assert_allclose(out.loss_mat.double().numpy(), ref, rtol=1e-6, atol=1e-6)
    assert out.metrics[metric_names.VF_LOSS] == pytest.approx(vf_loss, rel=1e-6)
    assert out.metrics[metric_names.VF_CLIPFRAC] == pytest.approx(vf_clipfrac, abs=1e-7)
    assert 0 < vf_clipfrac < 1


@pytest.mark.parametrize("clip", [(-0.1, 0.6), (0.5, -0.1), (-0.2, -0.3)])
def test_value_loss_refuses_a_negative_clip_range(clip):
    values, values_old, returns, mask = (torch.tensor(x) for x in _value_case())
    clip_low, clip_high = clip
    with pytest.raises(ValueError, match=r"clip_low=.*clip_high="):
        value_loss(values, values_old, returns, mask, clip_low=clip_low, clip_high=clip_high)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_entropy_bonus_term_is_float32(dtype):
    """``-coef * H`` per token, float32 whatever the entropy's dtype (the loss matrix is float32)."""
    entropy = torch.tensor([[0.5, 2.0, 0.0], [1.25, 3.0, 0.75]], dtype=dtype)
    term = entropy_bonus_term(entropy, 0.25)
    assert term.dtype == torch.float32
    np.testing.assert_allclose(term.numpy(), [[-0.125, -0.5, 0.0], [-0.3125, -0.75, -0.1875]], rtol=0, atol=0)


def test_value_loss_defaults_are_t_ppos():
    """Without clip arguments: xi_low = 0.5, xi_high = 0.6 (T-PPO, arXiv 2506.15050, eqs. 4-5)."""
    values, values_old, returns, mask = _value_case()
    out = value_loss(*(torch.tensor(x) for x in (values, values_old, returns, mask)))
    ref, vf_loss, vf_clipfrac = ref_value_loss(values, values_old, returns, mask, clip_low=0.5, clip_high=0.6)
    np.testing.assert_allclose(out.loss_mat.double().numpy(), ref, rtol=1e-6, atol=1e-6)
    assert out.metrics[metric_names.VF_CLIPFRAC] == pytest.approx(vf_clipfrac, abs=1e-7)
    # 0.5 / 0.6 differ from their neighbours here: the loop with 0.6 / 0.6 or 0.5 / 0.5 gives other losses
    for other in [(0.6, 0.6), (0.5, 0.5)]:
        assert (
            np.abs(
                ref_value_loss(values, values_old, returns, mask, clip_low=other[0], clip_high=other[1])[0] - ref
            ).max()
            > 1e-3
        )


# -- float32 losses for float64 inputs, defaults ---------------------------------------------------------
def _float64_inputs(batch: Batch):
    logp, old_logp, adv, mask = batch.tensors()
    return logp, PolicyInputs(logp, old_logp, adv, mask)


def _assert_loss(out, logp, ref_loss, ref_dloss, batch: Batch):
    """float32 loss matrix equal to the reference on real tokens, and d sum(loss * mask) / d logp."""
    assert out.loss_mat.dtype == torch.float32
    real = batch.mask > 0
    np.testing.assert_allclose(out.loss_mat.detach().double().numpy()[real], ref_loss[real], rtol=RTOL, atol=1e-6)
    (out.loss_mat * torch.tensor(batch.mask)).sum().backward()
    np.testing.assert_allclose(logp.grad.numpy(), ref_dloss * batch.mask, rtol=RTOL, atol=1e-6)


def _ppo_kl(batch: Batch) -> float:
    """verl's ``ppo_kl``: mean over real tokens of log pi_old - log pi."""
    value = float(np.mean((batch.old_logp - batch.logp)[batch.mask > 0]))
    assert abs(value) > 1e-4  # a sign flip is far outside the tolerance
    return value


def test_clip_defaults_and_float64_inputs():
    """clip_objective() is PPO's 0.2 / 0.2 without dual clip; float64 inputs give a float32 loss."""
    batch = token_batch(0)
    r = np.exp(batch.logp - batch.old_logp)[batch.mask > 0]
    assert ((r > 1.2) & (r < 2.2)).any() and (r < 0.8).any()
    logp, inp = _float64_inputs(batch)
    out = clip_objective(inp)
    ref_loss, ref_dloss, clipped, _ = ref_clip(
        batch.logp, batch.old_logp, batch.adv, batch.mask, clip_ratio_low=0.2, clip_ratio_high=0.2
    )
    _assert_loss(out, logp, ref_loss, ref_dloss, batch)
    assert out.metrics[metric_names.PG_CLIPFRAC] == pytest.approx(clipped[batch.mask > 0].mean(), abs=1e-7)
    assert out.metrics[metric_names.PG_CLIPFRAC_LOWER] == 0.0
    assert out.metrics[metric_names.PPO_KL] == pytest.approx(_ppo_kl(batch), rel=1e-5)


def test_token_is_and_gpg_float64_inputs():
    batch = token_batch(1)
    logp, inp = _float64_inputs(batch)
    _assert_loss(token_is_objective(inp), logp, *ref_token_is(batch.logp, batch.old_logp, batch.adv, batch.mask), batch)
    logp, inp = _float64_inputs(batch)
    _assert_loss(OBJECTIVES.get("gpg")(inp), logp, *ref_gpg_loss(batch.logp, batch.adv, batch.mask), batch)


def test_gspo_defaults_and_float64_inputs():
    """gspo_objective() uses GSPO's 3e-4 / 4e-4 (arXiv 2507.18071; the conf/objective/gspo.yaml preset); float64 inputs (mask included)
    give a float32 loss."""
    batch = gspo_batch(3, 3e-4, 4e-4)
    logp, inp = _float64_inputs(batch)
    out = gspo_objective(inp)
    ref_loss, ref_dloss, clipped = ref_gspo(
        batch.logp, batch.old_logp, batch.adv, batch.mask, clip_ratio_low=3e-4, clip_ratio_high=4e-4
    )
    _assert_loss(out, logp, ref_loss, ref_dloss, batch)
    real = batch.mask > 0
    assert 0 < clipped[real].mean() < 1
    assert out.metrics[metric_names.PG_CLIPFRAC] == pytest.approx(clipped[real].mean(), abs=1e-7)
    assert out.metrics[metric_names.PPO_KL] == pytest.approx(_ppo_kl(batch), rel=1e-5)


def test_gspo_sequence_log_ratio_is_capped_at_ten():
    """verl caps GSPO's token log-ratio sg[log s_i] + logp - sg[logp] at 10 from above. A = -1 on both rows, so
    the unclipped term -A s is the max: row 0 (mean log-ratio 12) has loss e^10 per token and no gradient
    (capped); row 1 (mean log-ratio 5, below the cap) has loss e^5 and gradient -A s = e^5 per token."""
    old_logp = np.full((2, 3), -2.0)
    logp = old_logp + np.array([[12.0, 11.0, 13.0], [5.5, 4.0, 5.5]])
    adv = np.full((2, 3), -1.0)
    lp = torch.tensor(logp, requires_grad=True)
    out = gspo_objective(PolicyInputs(lp, torch.tensor(old_logp), torch.tensor(adv), torch.ones(2, 3)))
    out.loss_mat.sum().backward()
    expected = np.array([[np.exp(10.0)] * 3, [np.exp(5.0)] * 3])
    np.testing.assert_allclose(out.loss_mat.detach().double().numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(lp.grad.numpy(), [[0.0] * 3, [np.exp(5.0)] * 3], rtol=1e-6)


def test_log_ratio_is_clamped_to_plus_minus_twenty():
    """Token-level objectives clamp log(pi / pi_old) to [-20, 20] (verl): r = e^20 and e^-20 at log-ratios 30
    and -25; ``actor/ppo_kl`` averages the clamped values; clamped tokens get no gradient."""
    old_logp = np.array([[-1.0, -1.0, -1.0]])
    logp = old_logp + np.array([[30.0, -25.0, 0.5]])
    adv = np.array([[1.0, -1.0, 2.0]])
    lp = torch.tensor(logp, requires_grad=True)
    out = token_is_objective(PolicyInputs(lp, torch.tensor(old_logp), torch.tensor(adv), torch.ones(1, 3)))
    out.loss_mat.sum().backward()
    expected = np.array([[-np.exp(20.0), np.exp(-20.0), -2.0 * np.exp(0.5)]])
    np.testing.assert_allclose(out.loss_mat.detach().double().numpy(), expected, rtol=1e-6, atol=0)
    assert out.metrics[metric_names.PPO_KL] == pytest.approx(-(20.0 - 20.0 + 0.5) / 3, rel=1e-6)
    np.testing.assert_allclose(lp.grad.numpy(), [[0.0, 0.0, -2.0 * np.exp(0.5)]], rtol=1e-6)


# -- BAPO -------------------------------------------------------------------------------------------------
def test_bapo_defaults_and_float64_inputs():
    """bapo_objective() uses rho_0 = 0.5, [0.6, 0.9] x [1.2, 3.0], steps 0.05, the "paper" rule (the defaults of
    the BAPO authors' README, arXiv 2510.18927); on an all-negative batch the search runs into both maxima."""
    batch = bapo_batch(6)
    logp, inp = _float64_inputs(batch)
    out = bapo_objective(inp)
    ref_loss, ref_dloss, _, _, (c_low, c_high, share, trace) = ref_bapo(
        batch.logp, batch.old_logp, batch.adv, batch.mask
    )
    assert len(trace) >= 3 and c_high < 3.0
    _assert_loss(out, logp, ref_loss, ref_dloss, batch)
    assert out.metrics[BAPO_CLIP_LOW] == pytest.approx(c_low, abs=1e-9)
    assert out.metrics[BAPO_CLIP_HIGH] == pytest.approx(c_high, abs=1e-9)
    assert out.metrics[BAPO_POS_SHARE] == pytest.approx(share, abs=1e-6)
    assert out.metrics[metric_names.PPO_KL] == pytest.approx(_ppo_kl(batch), rel=1e-5)

    hopeless = Batch(batch.logp, batch.old_logp, -np.abs(batch.adv), batch.mask)
    logp, inp = _float64_inputs(hopeless)
    out = bapo_objective(inp)
    assert (out.metrics[BAPO_CLIP_LOW], out.metrics[BAPO_CLIP_HIGH]) == pytest.approx((0.9, 3.0), abs=1e-12)


def _share_inputs(ratios, advantages, mask=None):
    ratio = torch.tensor([ratios], dtype=torch.float64)
    adv = torch.tensor([advantages], dtype=torch.float64)
    return ratio, adv, torch.ones_like(adv) if mask is None else torch.tensor([mask], dtype=torch.float64)


def test_bapo_positive_share_hand_cases():
    """Paper reading: a positive token with r == c_high and a negative one with r == c_low still carry
    gradient (PPO's clip keeps r A at the bound), so both count; shares below 1 in total are plain ratios;
    nothing contributing gives 1.0."""
    ratio, adv, mask = _share_inputs([1.25, 0.75, 1.5, 0.5], [2.0, -1.0, 1.0, -3.0])
    # counted: 1.25 * 2 (r == c_high) and 0.75 * 1 (r == c_low); 1.5 > 1.25 and 0.5 < 0.75 drop out
    assert bapo_positive_share(ratio, adv, mask, 0.75, 1.25, "paper") == pytest.approx(2.5 / 3.25, rel=1e-15)
    ratio, adv, mask = _share_inputs([1.0, 1.0], [0.5, -0.25])
    for rule in ("paper", "recipe"):
        assert bapo_positive_share(ratio, adv, mask, 0.6, 1.2, rule) == pytest.approx(2 / 3, rel=1e-15)
    ratio, adv, mask = _share_inputs([1.0, 2.0], [0.0, 0.0])
    for rule in ("paper", "recipe"):
        assert bapo_positive_share(ratio, adv, mask, 0.6, 1.2, rule) == 1.0
    ratio, adv, mask = _share_inputs([1.0, 2.0], [1.0, -1.0], [0.0, 0.0])
    assert bapo_positive_share(ratio, adv, mask, 0.6, 1.2, "paper") == 1.0


@pytest.mark.parametrize("rule", ["paper", "recipe"])
def test_bapo_search_stops_when_the_share_equals_rho(rule):
    """The search raises bounds only while the share is below rho_0: a share of exactly 0.5 keeps the start
    bounds (BAPO's condition rho >= rho_0 is met)."""
    ratio, adv, mask = _share_inputs([1.0, 1.0], [1.0, -1.0])
    bounds = dict(low_start=0.6, low_max=0.9, high_start=1.2, high_max=3.0, low_step=0.05, high_step=0.05)
    assert choose_bapo_bounds(ratio, adv, mask, rho=0.5, rule=rule, **bounds) == (0.6, 1.2, 0.5)


def test_bapo_search_can_stop_after_one_step():
    """One step of 0.05 suffices: the bounds are the start plus exactly one step (paper: both bounds; recipe:
    c_low runs to its maximum, which cannot raise the recipe's share, then c_high moves once)."""
    bounds = dict(low_start=0.6, low_max=0.9, high_start=1.2, high_max=3.0, low_step=0.05, high_step=0.05)
    # paper: the positive token (r = 1.22) enters at c_high = 1.25: share 1.22 / 2.22
    ratio, adv, mask = _share_inputs([1.22, 1.0], [1.0, -1.0])
    lower, upper, share = choose_bapo_bounds(ratio, adv, mask, rho=0.5, rule="paper", **bounds)
    assert (lower, upper) == pytest.approx((0.65, 1.25), abs=1e-12)
    assert share == pytest.approx(1.22 / 2.22, rel=1e-12)
    # recipe: pos = min(1.5, c_high) * 1, neg = max(1, c_low) * 1.22; 1.2 / 2.42 < 0.5 <= 1.25 / 2.47
    ratio, adv, mask = _share_inputs([1.5, 1.0], [1.0, -1.22])
    lower, upper, share = choose_bapo_bounds(ratio, adv, mask, rho=0.5, rule="recipe", **bounds)
    assert (lower, upper) == pytest.approx((0.9, 1.25), abs=1e-12)
    assert share == pytest.approx(1.25 / 2.47, rel=1e-12)


def test_bapo_recipe_keeps_start_bounds_when_the_share_is_reached():
    """Recipe rule with rho_0 below the start share: neither c_low nor c_high moves."""
    batch = bapo_batch(6)
    _, inp = _float64_inputs(batch)
    out = bapo_objective(inp, rule="recipe", rho=0.45)
    ref = ref_bapo(batch.logp, batch.old_logp, batch.adv, batch.mask, rule="recipe", rho=0.45)[4]
    assert (ref[0], ref[1]) == (0.6, 1.2) and ref[2] >= 0.45 + 1e-3
    assert (out.metrics[BAPO_CLIP_LOW], out.metrics[BAPO_CLIP_HIGH]) == (0.6, 1.2)


# -- invalid parameters -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "params", "field"),
    [
        ("clip", {"clip_ratio_low": 1.5}, "clip_ratio_low"),
        ("clip", {"clip_ratio_low": 0.0}, "clip_ratio_low"),
        ("clip", {"clip_ratio_high": 0.0}, "clip_ratio_high"),
        ("clip", {"clip_ratio_high": -0.2}, "clip_ratio_high"),
        ("clip", {"clip_ratio_c": 0.5}, "clip_ratio_c"),
        ("gspo", {"clip_ratio_low": 1.0}, "clip_ratio_low"),
        ("gspo", {"clip_ratio_high": 0.0}, "clip_ratio_high"),
        ("bapo", {"rho": 0.0}, "rho"),
        ("bapo", {"rho": 1.0}, "rho"),
        ("bapo", {"ratio_low_step": 0.0}, "ratio_low_step"),
        ("bapo", {"ratio_high_step": -0.05}, "ratio_high_step"),
        ("bapo", {"rule": "magic"}, "rule"),
        ("bapo", {"clip_ratio_c": 1.0}, "clip_ratio_c"),
        ("bapo", {"ratio_low_start": 0.95}, "ratio_low_start"),
        ("bapo", {"ratio_low_max": 1.0}, "ratio_low_start"),
        ("bapo", {"ratio_low_start": 0.0}, "ratio_low_start"),
        ("bapo", {"ratio_high_start": 1.0}, "ratio_high_start"),
        ("bapo", {"ratio_high_max": 1.1}, "ratio_high_start"),
    ],
)
def test_invalid_parameters_name_the_objective_and_the_key(name, params, field):
    """Refused before any computation. The advantages are all positive, so BAPO's search would stop at once
    (share 1) and a missed check shows as a missing error rather than a search that never ends."""
    batch = token_batch(0)
    _, inp = _float64_inputs(Batch(batch.logp, batch.old_logp, np.abs(batch.adv), batch.mask))
    with pytest.raises(ValueError, match=rf"objective '{name}': {field}"):
        OBJECTIVES.get(name)(inp, **params)
