"""TRM masks and monitoring (runners/algorithms/trm.py).

Checks against: dense KL/TV computed from full distributions, hand-computed k2/k3 values, a
Monte-Carlo estimate of KL (k3 is unbiased), verl's ``compute_rollout_rejection_mask`` (same
accept/reject decisions for the sample-based criteria), loops over positions for LN-TRM with
``bounds.ln_trm_normaliser`` as Z(T), and a hand-computed eq. 50 gradient through
``runners.algorithms.loss_agg``.  Run: ``pytest tests/algorithms/test_trm.py``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from runners import metric_names
from runners.algorithms import MASKS, loss_agg, trm
from runners.algorithms.bounds import adaptive_bound, dbar_from_position_buckets, ln_trm_normaliser
from runners.algorithms.types import PolicyInputs

SAMPLE_MASKS = ["none", "trm_max_k2", "trm_avg_k3", "trm_max_avg_sample", "ln_trm", "ser"]
EXACT_MASKS = ["trm_max", "trm_avg", "trm_max_avg"]


def _batch(B=6, T=9, V=11, K=None, scale=0.3, seed=0, lengths=None):
    """Random batch: rollout and current distributions, sampled tokens, right-padded responses."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=g, dtype=torch.float64)
    roll_full = torch.log_softmax(logits + scale * torch.randn(B, T, V, generator=g, dtype=torch.float64), -1)
    y = torch.multinomial(roll_full.exp().reshape(-1, V), 1, generator=g).reshape(B, T)
    logp = torch.log_softmax(logits, -1).gather(-1, y[..., None])[..., 0]
    rollout_logp = roll_full.gather(-1, y[..., None])[..., 0]
    if lengths is None:
        lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < torch.as_tensor(lengths)[:, None]).double()
    K = V if K is None else K
    order = torch.argsort(roll_full, dim=-1, descending=True)[..., :K]  # top-K support
    inp = PolicyInputs(
        logp=logp,
        old_logp=rollout_logp,
        advantages=torch.zeros(B, T, dtype=torch.float64),
        response_mask=mask,
        logits=logits,
        old_topk_index=order,
        old_topk_logp=roll_full.gather(-1, order),
    )
    return inp, roll_full


def _dense_kl_tv(logits, roll_full):
    logq = torch.log_softmax(logits, -1)
    p = roll_full.exp()
    return (p * (roll_full - logq)).sum(-1), 0.5 * (p - logq.exp()).abs().sum(-1)


# -- exact divergences ------------------------------------------------------------------------
def test_exact_kl_and_tv_match_dense_on_full_support():
    inp, roll_full = _batch(V=13)
    kl_ref, tv_ref = _dense_kl_tv(inp.logits, roll_full)
    kl, tv = trm.sparse_token_divergences(inp.logits, inp.old_topk_index, inp.old_topk_logp)
    torch.testing.assert_close(kl, kl_ref, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(tv, tv_ref, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(trm.exact_token_kl(inp.logits, inp.old_topk_index, inp.old_topk_logp), kl_ref)


def test_exact_kl_truncated_support_padding_and_chunks(monkeypatch):
    """Top-K support with -inf padding slots: eq. 51 over the kept ids; tail bin = coarse-grained KL."""
    inp, roll_full = _batch(V=13, K=5, seed=3)
    index, topk_logp = inp.old_topk_index.clone(), inp.old_topk_logp.clone()
    topk_logp[..., 4] = float("-inf")  # one padding slot everywhere, its id arbitrary
    index[..., 4] = 0
    logq = torch.log_softmax(inp.logits, -1)
    kept = torch.zeros_like(roll_full, dtype=torch.bool).scatter(-1, inp.old_topk_index[..., :4], True)
    p, q = roll_full.exp(), logq.exp()
    ref = torch.where(kept, p * (roll_full - logq), 0.0).sum(-1)
    p_rest, q_rest = (p * ~kept).sum(-1), (q * ~kept).sum(-1)
    ref_tail = ref + p_rest * (p_rest.log() - q_rest.log())
    ref_tv = 0.5 * (torch.where(kept, (p - q).abs(), 0.0).sum(-1) + (p_rest - q_rest).abs())
    monkeypatch.setattr(trm, "_CHUNK_ELEMENTS", 13 * 4)  # 4 rows per chunk
    kl, tv = trm.sparse_token_divergences(inp.logits, index, topk_logp, tail_bin=False)
    kl_tail, _ = trm.sparse_token_divergences(inp.logits, index, topk_logp, tail_bin=True)
    torch.testing.assert_close(kl, ref, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(kl_tail, ref_tail, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(tv, ref_tv, rtol=1e-9, atol=1e-12)
    kl_full, tv_full = _dense_kl_tv(inp.logits, roll_full)
    assert torch.all(kl_tail >= -1e-12) and torch.all(kl_tail <= kl_full + 1e-12)  # data processing
    assert torch.all(tv <= tv_full + 1e-12)


def test_exact_kl_masked_positions_skipped_and_shapes_checked():
    inp, _ = _batch()
    kl, tv = trm.sparse_token_divergences(inp.logits, inp.old_topk_index, inp.old_topk_logp, inp.response_mask)
    assert torch.all(kl[inp.response_mask == 0] == 0) and torch.all(tv[inp.response_mask == 0] == 0)
    with pytest.raises(ValueError, match="shape mismatch"):
        trm.exact_token_kl(inp.logits[:, :-1], inp.old_topk_index, inp.old_topk_logp)


# -- sample estimators --------------------------------------------------------------------------
def test_k2_k3_hand_values():
    log_ratio = torch.tensor([math.log(2.0), math.log(0.5), 0.0, -3.0], dtype=torch.float64)
    expected_k2 = [0.5 * math.log(2) ** 2, 0.5 * math.log(2) ** 2, 0.0, 4.5]
    expected_k3 = [2 - 1 - math.log(2), 0.5 - 1 + math.log(2), 0.0, math.exp(-3) - 1 + 3]
    torch.testing.assert_close(trm.k2_estimator(log_ratio), torch.tensor(expected_k2, dtype=torch.float64))
    torch.testing.assert_close(trm.k3_estimator(log_ratio), torch.tensor(expected_k3, dtype=torch.float64))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-30, 30, allow_nan=False), min_size=1, max_size=20))
def test_k3_non_negative(values):
    assert torch.all(trm.k3_estimator(torch.tensor(values, dtype=torch.float64)) >= 0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_k3_is_unbiased_for_kl(seed):
    """E_{y ~ pi_roll}[r - 1 - log r] = KL(pi_roll || pi_theta), Monte Carlo within 5 standard errors."""
    g = torch.Generator().manual_seed(seed)
    log_p = torch.log_softmax(torch.randn(7, generator=g, dtype=torch.float64), -1)  # rollout
    log_q = torch.log_softmax(log_p + 0.7 * torch.randn(7, generator=g, dtype=torch.float64), -1)  # current
    kl = float((log_p.exp() * (log_p - log_q)).sum())
    y = torch.multinomial(log_p.exp(), 200_000, replacement=True, generator=g)
    k3 = trm.k3_estimator(log_q[y] - log_p[y])
    sem = float(k3.std()) / math.sqrt(k3.numel())
    assert abs(float(k3.mean()) - kl) < 5 * sem
    k1_mean = float((log_p[y] - log_q[y]).mean())  # the plain estimator is unbiased too, k2 is not
    k2_bias = float(trm.k2_estimator(log_q[y] - log_p[y]).mean()) - kl
    assert abs(k1_mean - kl) < 5 * float((log_p[y] - log_q[y]).std()) / math.sqrt(y.numel())
    assert abs(k2_bias) > 5 * sem


# -- masks ------------------------------------------------------------------------------------
def _seq_reduce(values, mask, how):
    out = []
    for row, m in zip(values, mask):
        real = row[m > 0]
        out.append(float(real.max() if how == "max" else real.mean()) if real.numel() else 0.0)
    return torch.tensor(out, dtype=torch.float64)


def _between(values):
    """A threshold halfway between two middle values (no ties with float rounding)."""
    v = values.sort().values
    mid = len(v) // 2
    return float(v[mid - 1] + v[mid]) / 2


@pytest.mark.parametrize("seed", range(4))
def test_exact_masks_match_dense_criteria(seed):
    inp, roll_full = _batch(B=16, T=12, V=9, scale=0.25, seed=seed)
    kl, _ = _dense_kl_tv(inp.logits, roll_full)
    kl_max, kl_mean = _seq_reduce(kl, inp.response_mask, "max"), _seq_reduce(kl, inp.response_mask, "mean")
    delta, delta_avg = _between(kl_max), _between(kl_mean)
    cases = {
        "trm_max": kl_max <= delta,
        "trm_avg": kl_mean <= delta_avg,
        "trm_max_avg": (kl_max <= delta) & (kl_mean <= delta_avg),
    }
    params = {"trm_max": {"delta": delta}, "trm_avg": {"delta_avg": delta_avg}}
    params["trm_max_avg"] = {"delta": delta, "delta_avg": delta_avg}
    for name, expected in cases.items():
        out = MASKS.get(name)(inp, **params[name])
        assert out.seq_mask.tolist() == expected.double().tolist(), name
        assert 0 < out.seq_mask.sum() < len(expected) or name == "trm_max_avg"
        assert out.metrics[metric_names.TRM_MAX_KL] == pytest.approx(float(kl[inp.response_mask > 0].max()))
        assert out.metrics[metric_names.TRM_MEAN_KL] == pytest.approx(float(kl[inp.response_mask > 0].mean()))


def test_exact_mask_without_distributions_names_missing_fields():
    inp, _ = _batch()
    inp.logits = None
    with pytest.raises(ValueError, match=r"'trm_max'.*PolicyInputs\.logits.*trm_max_k2"):
        MASKS.get("trm_max")(inp)


def test_threshold_is_inclusive_and_validated():
    inp, _ = _batch(lengths=[9] * 6)
    k2_max = _seq_reduce(trm.k2_estimator(trm.sample_log_ratio(inp.logp, inp.old_logp)), inp.response_mask, "max")
    out = trm.trm_max_k2_mask(inp, delta=float(k2_max[0]))
    assert out.seq_mask[0] == 1
    with pytest.raises(ValueError, match="delta_ser"):
        trm.ser_mask(inp, delta_ser=-1)


@pytest.mark.verl
@pytest.mark.parametrize("seed", range(5))
def test_sample_masks_agree_with_verl(seed):
    """Same decisions as verl's seq_max_k2 / seq_mean_k3 / both.

    Semantic notes: verl takes log_ratio = log pi_theta - log pi_roll (our direction), clamps it to
    +-20 (so do we), keeps iff stat <= threshold (inclusive, as ours) and divides the mean by
    (count + 1e-8) (ties at the threshold could differ by that epsilon). verl returns a token mask
    that replaces the response mask; we return [B] weights and keep the response mask as the loss
    denominator (eq. 50). verl keeps all-padding rows trivially; so do we (they add nothing).
    """
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_rejection_mask

    inp, _ = _batch(B=64, T=16, V=8, scale=0.4, seed=seed)
    inp.logp[0, 0] = inp.old_logp[0, 0] + 30.0  # beyond verl's safety clamp
    inp.logp[1, 0] = inp.old_logp[1, 0] - 30.0
    log_ratio = inp.logp - inp.old_logp
    stats = trm.sample_log_ratio(inp.logp, inp.old_logp)
    mask = inp.response_mask
    k2_max = _seq_reduce(trm.k2_estimator(stats), mask, "max")
    k3_mean = _seq_reduce(trm.k3_estimator(stats), mask, "mean")
    t_max, t_avg = float(k2_max.quantile(0.6)) * 1.0001, float(k3_mean.quantile(0.6)) * 1.0001
    cases = [
        ("trm_max_k2", {"delta": t_max}, "seq_max_k2", t_max),
        ("trm_avg_k3", {"delta_avg": t_avg}, "seq_mean_k3", t_avg),
        ("trm_max_avg_sample", {"delta": t_max, "delta_avg": t_avg}, "seq_max_k2,seq_mean_k3", f"{t_max},{t_avg}"),
    ]
    for name, params, verl_option, verl_threshold in cases:
        ours = MASKS.get(name)(inp, **params).seq_mask
        verl_mask, _ = compute_rollout_rejection_mask(log_ratio, mask, verl_option, verl_threshold)
        verl_keep = (verl_mask.sum(-1) == mask.sum(-1)).double()
        assert ours.tolist() == verl_keep.tolist(), name
        assert 0 < ours.sum() < len(ours), name  # the thresholds split the batch


def _ln_score_loop(log_ratio_row, length, delta):
    if length == 1:
        return abs(math.exp(log_ratio_row[0]) - 1)
    Z = ln_trm_normaliser(length, delta)
    W = sum(
        abs(math.exp(log_ratio_row[t - 1]) - 1) * min(1.0, math.sqrt((length - t) * delta / 2))
        for t in range(1, length + 1)
    )
    return W / Z


@pytest.mark.parametrize("delta", [1e-4, 0.05, 3.0])
def test_ln_trm_scores_match_loop(delta):
    inp, _ = _batch(B=10, T=20, scale=0.5, seed=7, lengths=[1, 2, 3, 5, 8, 13, 20, 20, 1, 7])
    log_ratio = trm.sample_log_ratio(inp.logp, inp.old_logp)
    scores = trm.ln_trm_scores(log_ratio, inp.response_mask, delta)
    lengths = inp.response_mask.sum(-1).long().tolist()
    expected = [_ln_score_loop(log_ratio[i].tolist(), n, delta) for i, n in enumerate(lengths)]
    np.testing.assert_allclose(scores.numpy(), expected, rtol=1e-10)
    threshold = float(np.median(expected))
    keep = MASKS.get("ln_trm")(inp, delta=delta, delta_w=threshold).seq_mask
    assert keep.tolist() == [float(e <= threshold) for e in expected]


def test_ln_trm_and_ser_are_length_neutral_for_constant_deviation():
    """|r_t - 1| = c at every token: W~ = c and SER's W = c for every length (appendix D.3, D.5)."""
    T = 50
    mask = torch.ones(T, T, dtype=torch.float64).tril()  # row i has length i + 1
    log_ratio = torch.full((T, T), math.log(1.03), dtype=torch.float64)
    np.testing.assert_allclose(trm.ln_trm_scores(log_ratio, mask, 1e-2).numpy(), 0.03, rtol=1e-10)
    inp = PolicyInputs(log_ratio, torch.zeros_like(log_ratio), torch.zeros_like(log_ratio), mask)
    assert trm.ser_mask(inp, delta_ser=0.0301).seq_mask.sum() == T
    assert trm.ser_mask(inp, delta_ser=0.0299).seq_mask.sum() == 0


def test_ser_hand_case():
    rollout_logp = torch.zeros(2, 3, dtype=torch.float64)
    logp = torch.log(torch.tensor([[1.1, 0.9, 1.0], [1.5, 1.0, 9.0]], dtype=torch.float64))
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float64)
    inp = PolicyInputs(logp, rollout_logp, torch.zeros_like(logp), mask)
    # W = (0.1 + 0.1 + 0) / 3 = 0.0667 and (0.5 + 0) / 2 = 0.25 (the padded 9.0 is ignored)
    assert trm.ser_mask(inp, delta_ser=0.07).seq_mask.tolist() == [1.0, 0.0]
    assert trm.ser_mask(inp, delta_ser=0.25).seq_mask.tolist() == [1.0, 1.0]


# -- eq. 50 -----------------------------------------------------------------------------------
def test_masked_gradient_normalised_by_batch_size():
    """grad of (1/N) sum_i M_i A_i sum_t r_t equals the hand-computed -M_i A_i r_t / N (eq. 50)."""
    torch.manual_seed(0)
    B, T = 5, 4
    old_logp = torch.randn(B, T, dtype=torch.float64)
    logp = (old_logp + 0.1 * torch.randn(B, T, dtype=torch.float64)).requires_grad_()
    adv = torch.randn(B, 1, dtype=torch.float64).expand(B, T)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.float64)
    seq_mask = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0], dtype=torch.float64)

    def ratio():
        return torch.exp(logp - old_logp)

    loss = loss_agg.seq_mean_token_sum(trm.apply_sequence_mask(-adv * ratio(), seq_mask), mask)
    (grad,) = torch.autograd.grad(loss, logp)
    expected = -(seq_mask[:, None] * adv * ratio().detach() * mask) / B  # N = 5 sequences, 3 accepted
    torch.testing.assert_close(grad, expected)
    # token-mean keeps the response-mask denominator: all 14 tokens, not the 9 accepted ones
    loss_tm = loss_agg.token_mean(trm.apply_sequence_mask(-adv * ratio(), seq_mask), mask)
    (grad_tm,) = torch.autograd.grad(loss_tm, logp)
    torch.testing.assert_close(grad_tm, expected * B / mask.sum())
    # the pitfall the spec warns about: replacing the response mask renormalises by accepted tokens
    loss_bad = loss_agg.token_mean(-adv * ratio(), mask * seq_mask[:, None])
    (grad_bad,) = torch.autograd.grad(loss_bad, logp)
    assert not torch.allclose(grad_bad, grad_tm)
    with pytest.raises(ValueError, match="seq_mask must be"):
        trm.apply_sequence_mask(ratio(), seq_mask[:-1])


# -- monitoring -------------------------------------------------------------------------------
def test_acceptance_by_length_hand_case():
    seq_mask = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    lengths = torch.tensor([10, 20, 100, 200, 0, 5000])
    out = trm.acceptance_by_length(seq_mask, lengths, edges=[0, 64, 256, 1024])
    assert out == {metric_names.trm_accept_rate_bucket(0, 64): 0.5, metric_names.trm_accept_rate_bucket(64, 256): 1.0}
    with pytest.raises(ValueError, match="strictly increasing"):
        trm.acceptance_by_length(seq_mask, lengths, edges=[0, 64, 64])


def test_log_ppl_gap_hand_case():
    logp = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -0.5, -0.5], [0.0, 0.0, 0.0]])
    rollout_logp = torch.tensor([[-1.5, -1.5, 0.0], [-1.0, -0.1, -0.1], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    # row 0: |-1.5 - (-1.5)| = 0; row 1: |-0.5 - (-0.4)| = 0.1; row 2 empty, left out
    assert trm.log_ppl_gap(logp, rollout_logp, mask) == pytest.approx(0.05)


def test_tv_buckets_reproduce_the_adaptive_bound():
    """Unit-width position buckets -> bounds.dbar_from_position_buckets -> the same Adaptive bound."""
    inp, roll_full = _batch(B=8, T=10, V=7, scale=0.2, seed=5)
    _, tv = _dense_kl_tv(inp.logits, roll_full)
    edges = list(range(0, 11))
    out = trm.trm_max_mask(inp, delta=10.0, position_edges=edges)
    dbar_ref = (tv * inp.response_mask).sum(0) / 8  # ended sequences count 0
    dbar = dbar_from_position_buckets(out.metrics, 10)
    np.testing.assert_allclose(dbar, dbar_ref.numpy(), rtol=1e-9)
    assert adaptive_bound(dbar, 0.05) == pytest.approx(adaptive_bound(dbar_ref.numpy(), 0.05))
    coarse = trm.tv_by_position(tv, inp.response_mask, edges=[0, 4, 16])
    assert coarse[metric_names.trm_tv_position_bucket(4, 16)] == pytest.approx(float(dbar_ref[4:].sum()) / 12)


def test_sample_mask_monitors_exact_kl_when_distributions_are_stored():
    inp, roll_full = _batch()
    kl, _ = _dense_kl_tv(inp.logits, roll_full)
    with_dist = trm.trm_max_k2_mask(inp).metrics
    assert with_dist[metric_names.TRM_MAX_KL] == pytest.approx(float(kl[inp.response_mask > 0].max()))
    inp.logits = None
    without = trm.trm_max_k2_mask(inp).metrics
    k2 = trm.k2_estimator(trm.sample_log_ratio(inp.logp, inp.old_logp))
    assert without[metric_names.TRM_MAX_KL] == pytest.approx(float(k2[inp.response_mask > 0].max()))
    assert not any(k.startswith("trm/tv/") for k in without)
    assert trm.trm_max_k2_mask(inp, monitor=False).metrics == {}


def test_error_bounds_reexported():
    from runners.algorithms import bounds

    assert trm.error_bounds is bounds.error_bounds


# -- robustness ---------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 6), min_size=1, max_size=5),
    seed=st.integers(0, 2**16),
    neg_inf_logits=st.booleans(),
    neg_inf_logp=st.booleans(),
)
def test_no_nan_on_degenerate_batches(lengths, seed, neg_inf_logits, neg_inf_logp):
    """Length-1 rows (LN-TRM's Z(1) = 0), all-padding rows, -inf logits and log-probs: no NaN."""
    B, T = len(lengths), 6
    inp, _ = _batch(B=B, T=T, V=5, K=3, seed=seed, lengths=lengths)
    inp.logp = inp.logp.float()  # float32 like a trainer
    if neg_inf_logits:
        inp.logits[0, 0, :] = float("-inf")  # a fully masked row
        inp.logits[-1, :, 1] = float("-inf")  # a masked vocabulary entry
    if neg_inf_logp:
        inp.logp[0, 0] = float("-inf")
        inp.old_logp[-1, -1] = float("-inf")
        inp.logp[-1, -1] = float("-inf")
    for name in MASKS.names():
        out = MASKS.get(name)(inp)
        assert out.seq_mask.shape == (B,) and out.seq_mask.dtype == inp.logp.dtype, name
        assert set(out.seq_mask.tolist()) <= {0.0, 1.0}, name
        assert not torch.isnan(out.seq_mask).any(), name
        assert not any(math.isnan(v) for v in out.metrics.values()), (name, out.metrics)
        assert out.seq_mask.requires_grad is False


def test_every_registered_mask_resolves():
    assert set(MASKS.names()) == set(SAMPLE_MASKS + EXACT_MASKS)
    inp, _ = _batch()
    for name in MASKS.names():
        out = MASKS.get(name)(inp)
        assert out.metrics[metric_names.TRM_ACCEPT_RATE] == pytest.approx(float(out.seq_mask.mean()))
