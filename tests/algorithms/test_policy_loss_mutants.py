"""``PolicyLoss`` (the per-batch loss both backends call) against a float64 reference, on the paths that
mutation testing showed the other tests under tests/algorithms leave open: the k3 KL-to-reference term,
rollout importance weights, the mini-batch counts and ``norm_len`` handed to the aggregation, a controller
passed in (its state used, not a fresh one), the entropy bonus term, the mask's keyword arguments, the
refusal of a method needing the entropy without it, the float32 loss and the returned metrics / keep mask.

References: ``ref_clip`` / ``ref_aggregate`` / ``ref_agg_weights`` of ``test_ref_objectives`` (PPO, arXiv
1707.06347, eq. 7, DAPO clip-higher; verl 0.9.1's ``agg_loss``) and the k3 estimator exp(x) - x - 1 with
x = log pi_ref - log pi (Schulman, "Approximating KL divergence", 2020; verl's ``low_var_kl``, which clamps
x to [-20, 20] and k3 to [-10, 10]), as float64 loops here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from runners import metric_names
from runners.algorithms.entropy import RepoDController
from runners.algorithms.method import Method
from runners.algorithms.policy_loss import PolicyLoss, build_controller, reference_kl
from runners.algorithms.types import PolicyInputs

from .test_ref_objectives import MODES, RTOL, ref_agg_weights, ref_aggregate, ref_clip, token_batch

CLIP = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}


def ref_k3(logp, ref_logp, mask):
    """Per-token k3 = exp(x) - x - 1, x = ref - logp clamped to [-20, 20], k3 clamped to [-10, 10], and its
    derivative w.r.t. logp (0 where a clamp binds)."""
    value = np.zeros(mask.shape)
    deriv = np.zeros(mask.shape)
    for i in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            x = float(ref_logp[i, t]) - float(logp[i, t])
            xc = min(max(x, -20.0), 20.0)
            k3 = math.exp(xc) - xc - 1.0
            value[i, t] = min(max(k3, -10.0), 10.0)
            deriv[i, t] = 0.0 if (xc != x or k3 > 10.0) else -(math.exp(x) - 1.0)
    return value, deriv


def _ref_logp(batch, seed=11):
    """Reference log-probs: log-ratios to logp in [-1.5, 1.5], one token with x = 3 (k3 = e^3 - 4 > 10)."""
    rng = np.random.default_rng(seed)
    ref = batch.logp + rng.uniform(-1.5, 1.5, batch.logp.shape)
    ref[0, 0] = batch.logp[0, 0] + 3.0
    return np.asarray(ref, dtype=np.float32).astype(np.float64)


def _inputs(batch, adv=None, entropy=None):
    logp, old_logp, adv_t, mask = batch.tensors()
    if adv is not None:
        adv_t = torch.tensor(adv)
    return logp, PolicyInputs(logp, old_logp, adv_t, mask, entropy=entropy)


def test_reference_kl_matches_the_k3_loop():
    batch = token_batch(0)
    ref = _ref_logp(batch)
    ref[1, 1] = batch.logp[1, 1] - 30.0  # x = -30: clamped to -20, k3 = 19 + e^-20 -> 10
    ref[2, 0] = batch.logp[2, 0] + 25.0  # x = 25: clamped to 20, k3 -> 10
    logp = torch.tensor(batch.logp, requires_grad=True)
    kl = reference_kl(logp, torch.tensor(ref))
    kl.sum().backward()
    value, deriv = ref_k3(batch.logp, ref, np.ones(batch.mask.shape))
    np.testing.assert_allclose(kl.detach().double().numpy(), value, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(logp.grad.numpy(), deriv, rtol=1e-5, atol=1e-6)
    assert kl.dtype == torch.float32 and float(kl.detach().max()) == 10.0 and float(kl.detach()[0, 0]) == 10.0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("counts", [{}, {"num_tokens": 70.0, "num_seqs": 13.0}], ids=["local", "global"])
def test_clip_with_kl_and_importance_weights_matches_reference(mode, counts):
    """L = (clip loss + kl_coef k3) * w per token, aggregated with the given counts and method.norm_len."""
    batch = token_batch(0)
    ref = _ref_logp(batch)
    rng = np.random.default_rng(3)
    weights = np.asarray(rng.uniform(0.3, 1.7, batch.mask.shape), dtype=np.float32)
    method = Method(objective="clip", objective_kw=CLIP, loss_agg=mode, kl_coef=0.3, norm_len=6)
    logp, inp = _inputs(batch)
    out = PolicyLoss(method)(inp, ref_logp=torch.tensor(ref), is_weights=torch.tensor(weights), **counts)
    out.loss.backward()

    clip_loss, clip_dloss, clipped, _ = ref_clip(batch.logp, batch.old_logp, batch.adv, batch.mask, **CLIP)
    k3, dk3 = ref_k3(batch.logp, ref, batch.mask)
    token_loss = (clip_loss + 0.3 * k3) * weights
    token_dloss = (clip_dloss + 0.3 * dk3) * weights
    expected = ref_aggregate(token_loss, batch.mask, mode, norm_len=6, **counts)
    assert float(out.loss.detach()) == pytest.approx(expected, rel=RTOL, abs=1e-6)
    grad = ref_agg_weights(batch.mask, mode, norm_len=6, **counts) * token_dloss
    np.testing.assert_allclose(logp.grad.numpy(), grad, rtol=RTOL, atol=1e-6)
    # the KL term and the weights both matter here
    assert abs(expected - ref_aggregate(clip_loss * weights, batch.mask, mode, norm_len=6, **counts)) > 1e-3
    assert abs(expected - ref_aggregate(clip_loss + 0.3 * k3, batch.mask, mode, norm_len=6, **counts)) > 1e-3
    real = batch.mask > 0
    assert out.metrics[metric_names.PG_CLIPFRAC] == pytest.approx(clipped[real].mean(), abs=1e-7)
    assert all(type(value) is float for value in out.metrics.values())
    assert out.seq_mask.tolist() == [1.0] * batch.mask.shape[0]


def test_float64_inputs_give_a_float32_loss_and_no_kl_without_reference():
    """float64 log-probs: the loss stays float32 (objectives compute in float32; the keep mask follows the
    loss's dtype); ``kl_coef`` without ``ref_logp`` adds nothing."""
    batch = token_batch(1)
    method = Method(objective="clip", objective_kw=CLIP, loss_agg="seq-mean-token-mean", kl_coef=0.5)
    _, inp = _inputs(batch)
    out = PolicyLoss(method)(inp)
    assert out.loss.dtype == torch.float32
    clip_loss = ref_clip(batch.logp, batch.old_logp, batch.adv, batch.mask, **CLIP)[0]
    expected = ref_aggregate(clip_loss, batch.mask, "seq-mean-token-mean")
    assert float(out.loss.detach()) == pytest.approx(expected, rel=RTOL, abs=1e-6)


def test_norm_len_argument_overrides_the_methods():
    """seq-mean-token-sum-norm divides by the call's norm_len, else by method.norm_len, else by T = 9."""
    batch = token_batch(2)
    clip_loss = ref_clip(batch.logp, batch.old_logp, batch.adv, batch.mask, **CLIP)[0]
    for method_norm, call_norm, divisor in [(6, None, 6), (6, 8.0, 8), (None, 8.0, 8), (None, None, 9)]:
        method = Method(objective="clip", objective_kw=CLIP, loss_agg="seq-mean-token-sum-norm", norm_len=method_norm)
        _, inp = _inputs(batch)
        out = PolicyLoss(method)(inp, norm_len=call_norm)
        expected = ref_aggregate(clip_loss, batch.mask, "seq-mean-token-sum", norm_len=None) / divisor
        assert float(out.loss.detach()) == pytest.approx(expected, rel=RTOL, abs=1e-6), (method_norm, call_norm)


def test_a_controller_passed_in_is_used_with_its_state():
    """REPO-D with zeta = 0.5 (a state a fresh controller, zeta0 = 1e-3, does not have): the objective sees
    A' = A - zeta log pi on real tokens (Entropy-preserving RL, arXiv 2603.11682, sec. 5.1)."""
    batch = token_batch(3)
    method = Method(objective="clip", objective_kw=CLIP, entropy_control="repo_d", loss_agg="token-mean")
    controller = build_controller(method, {"target": 1.0, "num_updates": 3, "zeta": 0.5})
    assert isinstance(controller, RepoDController) and controller.zeta == 0.5
    logp, inp = _inputs(batch)
    out = PolicyLoss(method, controller)(inp)
    out.loss.backward()
    adv = np.where(batch.mask > 0, batch.adv - 0.5 * batch.logp, batch.adv)
    clip_loss, clip_dloss, _, _ = ref_clip(batch.logp, batch.old_logp, adv, batch.mask, **CLIP)
    assert float(out.loss.detach()) == pytest.approx(ref_aggregate(clip_loss, batch.mask, "token-mean"), rel=RTOL)
    grad = ref_agg_weights(batch.mask, "token-mean") * clip_dloss
    np.testing.assert_allclose(logp.grad.numpy(), grad, rtol=RTOL, atol=1e-6)
    plain = ref_clip(batch.logp, batch.old_logp, batch.adv, batch.mask, **CLIP)[0]
    assert abs(ref_aggregate(plain, batch.mask, "token-mean") - float(out.loss.detach())) > 1e-2


def test_entropy_bonus_term_is_added_and_its_gradient_reaches_the_entropy():
    """Entropy bonus with a fixed beta = 0.4: L = clip loss - beta H per token (objective + beta H)."""
    batch = token_batch(4)
    method = Method(
        objective="clip",
        objective_kw=CLIP,
        entropy_control="bonus",
        entropy_control_kw={"beta0": 0.4, "adaptive": False},
        loss_agg="seq-mean-token-mean",
    )
    rng = np.random.default_rng(5)
    entropy_np = rng.uniform(0.1, 3.0, batch.mask.shape)
    entropy = torch.tensor(entropy_np, requires_grad=True)
    _, inp = _inputs(batch, entropy=entropy)
    out = PolicyLoss(method)(inp)
    out.loss.backward()
    clip_loss = ref_clip(batch.logp, batch.old_logp, batch.adv, batch.mask, **CLIP)[0]
    expected = ref_aggregate(clip_loss - 0.4 * entropy_np, batch.mask, "seq-mean-token-mean")
    assert float(out.loss.detach()) == pytest.approx(expected, rel=RTOL, abs=1e-6)
    np.testing.assert_allclose(
        entropy.grad.numpy(), -0.4 * ref_agg_weights(batch.mask, "seq-mean-token-mean"), rtol=1e-6, atol=1e-9
    )


def test_a_method_needing_the_entropy_refuses_inputs_without_it():
    method = Method(objective="clip", objective_kw=CLIP, entropy_control="bonus")
    _, inp = _inputs(token_batch(4))
    with pytest.raises(ValueError, match="entropy_control=bonus need the current entropy with gradient"):
        PolicyLoss(method)(inp)


def test_mask_keyword_arguments_reach_the_mask():
    """``mask_kw`` is passed to the mask: monitor=False leaves out the monitoring metrics (``trm/*``)."""
    batch = token_batch(6)
    _, inp = _inputs(batch)
    quiet = PolicyLoss(Method(objective="clip", objective_kw=CLIP, mask_kw={"monitor": False}))(inp)
    _, inp = _inputs(batch)
    loud = PolicyLoss(Method(objective="clip", objective_kw=CLIP))(inp)
    assert not any(key.startswith("trm/") for key in quiet.metrics)
    assert any(key.startswith("trm/") for key in loud.metrics)
    assert float(quiet.loss.detach()) == float(loud.loss.detach())
