"""Training-inference mismatch diagnostics and corrections (runners/algorithms/rollout_correction.py):
edge rows, safety clamps, boundaries, defaults, dtypes and input errors, found by mutation testing.

References are independent of the module: float64 loops over the formulas of verl 0.9.1's
``compute_offpolicy_metrics`` / ``compute_rollout_correction_weights`` / ``compute_rollout_rejection_mask``
(written here with ``math``), hand-computed values, and verl's own helper where its semantics match
(when verl is installed).

- ``offpolicy_metrics`` leaves all-padding rows out of the per-sequence means (perplexities, log-PPL
  differences, chi2_seq) but keeps length-1 rows; log-ratios are clamped to [-20, 20] for rho and for
  the sequence sum; a bfloat16 mask is counted exactly (the denominators are float64);
- ``token_tis``: default cap 2 (verl's ``rollout_is_threshold``), cap must be > 1, the fraction
  metrics are strict (rho > cap, rho < 1/cap), weights come back in the log-probs' dtype;
- ``seq_max_k2`` / ``seq_max_k3``: default threshold 0.05, threshold must be > 0, a sequence whose max
  equals the threshold is kept, padding tokens do not count, k2 = 0.5 (log rho)^2, metrics returned.

Run: ``pytest tests/algorithms/test_rollout_correction_mutants.py``.
"""

from __future__ import annotations

import math

import pytest
import torch

from runners.algorithms.rollout_correction import (
    no_correction,
    offpolicy_metrics,
    seq_max_k2,
    seq_max_k3,
    token_tis,
)

try:  # verl's own helpers, an extra reference where installed (the test extra installs verl 0.9.1)
    from verl.trainer.ppo import rollout_corr_helper as helper
except ImportError:
    helper = None

BOUND = 20.0


def _clip(x: float) -> float:
    return min(max(x, -BOUND), BOUND)


def _ref_offpolicy(old: torch.Tensor, roll: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """verl's off-policy metrics in float64 loops, per-sequence means over non-empty rows only."""
    o, r, m = old.double().tolist(), roll.double().tolist(), mask.double().tolist()
    tok = [(oi, ri, mi) for orow, rrow, mrow in zip(o, r, m) for oi, ri, mi in zip(orow, rrow, mrow)]
    n = math.fsum(mi for _, _, mi in tok)
    mean_old, mean_roll, seq_sum = [], [], []
    for orow, rrow, mrow in zip(o, r, m):
        cnt = math.fsum(mrow)
        if cnt == 0:
            continue
        mean_old.append(math.fsum(a * w for a, w in zip(orow, mrow)) / cnt)
        mean_roll.append(math.fsum(b * w for b, w in zip(rrow, mrow)) / cnt)
        seq_sum.append(math.fsum((a - b) * w for a, b, w in zip(orow, rrow, mrow)))
    rows = len(mean_old)
    diff = [b - a for a, b in zip(mean_old, mean_roll)]
    return {
        "training_ppl": math.fsum(math.exp(-a) for a in mean_old) / rows,
        "training_log_ppl": -math.fsum(mean_old) / rows,
        "kl": math.fsum((ri - oi) * mi for oi, ri, mi in tok) / n,
        "k3_kl": math.fsum((math.exp(oi - ri) - (oi - ri) - 1) * mi for oi, ri, mi in tok) / n,
        "rollout_ppl": math.fsum(math.exp(-b) for b in mean_roll) / rows,
        "rollout_log_ppl": -math.fsum(mean_roll) / rows,
        "log_ppl_diff": math.fsum(diff) / rows,
        "log_ppl_abs_diff": math.fsum(abs(d) for d in diff) / rows,
        "log_ppl_diff_max": max(diff),
        "log_ppl_diff_min": min(diff),
        "ppl_ratio": math.fsum(math.exp(d) for d in diff) / rows,
        "chi2_token": math.fsum(math.exp(2 * _clip(oi - ri)) * mi for oi, ri, mi in tok) / n - 1.0,
        "chi2_seq": math.fsum(math.exp(2 * _clip(s)) for s in seq_sum) / rows - 1.0,
    }


def _assert_metrics(ours: dict[str, float], ref: dict[str, float]) -> None:
    assert set(ours) == set(ref)
    for key, value in ref.items():
        assert ours[key] == pytest.approx(value, rel=1e-10, abs=1e-12), key


def _mask(lengths: list[int], length: int) -> torch.Tensor:
    return (torch.arange(length)[None] < torch.tensor(lengths)[:, None]).double()


def test_offpolicy_metrics_leave_out_empty_rows_and_keep_length_one_rows():
    gen = torch.Generator().manual_seed(11)
    mask = _mask([3, 0, 1, 5, 0, 1], 5)
    old = -torch.rand(6, 5, generator=gen, dtype=torch.float64) * 3
    roll = old + 0.7 * torch.randn(6, 5, generator=gen, dtype=torch.float64)
    ours = offpolicy_metrics(old, roll, mask)
    _assert_metrics(ours, _ref_offpolicy(old, roll, mask))
    # an empty row would add exp(0) = 1 to the perplexity means and 0 to log_ppl_diff_max/min
    kept = [0, 2, 3, 5]
    _assert_metrics(ours, _ref_offpolicy(old[kept], roll[kept], mask[kept]))


def test_offpolicy_metrics_with_length_one_rows_only():
    old = torch.tensor([[-1.0, -9.0], [-2.0, -9.0], [-0.5, -9.0]], dtype=torch.float64)
    roll = torch.tensor([[-1.5, 0.0], [-1.0, 0.0], [-0.5, 0.0]], dtype=torch.float64)
    mask = _mask([1, 1, 1], 2)
    ours = offpolicy_metrics(old, roll, mask)
    # hand: per-row log_ppl_diff = roll - old = -0.5, 1.0, 0.0
    assert ours["log_ppl_diff_max"] == pytest.approx(1.0)
    assert ours["log_ppl_diff_min"] == pytest.approx(-0.5)
    assert ours["training_ppl"] == pytest.approx((math.e + math.e**2 + math.e**0.5) / 3)
    _assert_metrics(ours, _ref_offpolicy(old, roll, mask))


def test_offpolicy_metrics_clamp_token_and_sequence_log_ratios_at_20():
    old = torch.tensor(
        [[-0.1, -0.2, -0.3, -0.4], [-0.1, -0.1, -0.1, -0.1], [-1.0, -2.0, -0.5, -3.0]], dtype=torch.float64
    )
    drift = torch.tensor([[25.0, 0.0, 0.0, 0.0], [8.0, 8.0, 8.0, 0.0], [0.3, -0.2, 0.1, 40.0]], dtype=torch.float64)
    roll = old - drift  # log rho = old - roll = drift
    mask = _mask([2, 3, 3], 4)  # the 40 of row 2 is padding
    ours = offpolicy_metrics(old, roll, mask)
    ref = _ref_offpolicy(old, roll, mask)
    _assert_metrics(ours, ref)
    # hand: rho of the 25 token is clamped to e^20, the sum 24 of row 1 to 20
    tokens = math.exp(40) + 1 + 3 * math.exp(16) + math.exp(0.6) + math.exp(-0.4) + math.exp(0.2)
    assert ours["chi2_token"] == pytest.approx(tokens / 8 - 1)
    assert ours["chi2_seq"] == pytest.approx((2 * math.exp(40) + math.exp(0.4)) / 3 - 1)
    if helper is not None:  # verl 0.9.1 agrees
        theirs = helper.compute_offpolicy_metrics(old, roll, mask)
        for key, value in ours.items():
            assert value == pytest.approx(theirs[key], rel=1e-7), key


def test_offpolicy_metrics_and_token_tis_count_a_bfloat16_mask_exactly():
    # 301 real tokens: bfloat16 cannot hold the count (300 or 302), the float64 sums can
    gen = torch.Generator().manual_seed(5)
    mask = _mask([301, 120], 301).to(torch.bfloat16)
    old = -torch.rand(2, 301, generator=gen, dtype=torch.float64)
    roll = old - 0.3 * torch.rand(2, 301, generator=gen, dtype=torch.float64)
    _assert_metrics(offpolicy_metrics(old, roll, mask), _ref_offpolicy(old, roll, mask))
    out = token_tis(old, roll, mask, cap=1.2)
    m = mask.double()
    rho = torch.exp(old - roll)
    n = float(m.sum())
    w = [min(float(x), 1.2) for x in rho[m > 0]]
    assert out.metrics["rollout_is_mean"] == pytest.approx(math.fsum(w) / n, rel=1e-12)
    assert out.metrics["rollout_is_ratio_fraction_high"] == pytest.approx(sum(x > 1.2 for x in rho[m > 0]) / n)
    var = math.fsum(x * x for x in w) / n - (math.fsum(w) / n) ** 2
    assert out.metrics["rollout_is_std"] == pytest.approx(math.sqrt(var), rel=1e-9)


def test_no_correction_returns_the_batch_and_no_metrics():
    mask = _mask([2, 1], 3)
    old = torch.zeros(2, 3, dtype=torch.float64)
    out = no_correction(old, old - 1.0, mask)
    assert out.is_weights is None and out.response_mask is mask
    assert out.metrics == {}


def test_token_tis_default_cap_is_two():
    log_rho = torch.tensor([[0.5, 1.0, -0.5, 3.0]], dtype=torch.float64)  # rho 1.65, 2.72, 0.61, 20.1
    old = torch.full_like(log_rho, -1.0)
    out = token_tis(old, old - log_rho, torch.ones_like(log_rho))
    expected = torch.tensor([[math.exp(0.5), 2.0, math.exp(-0.5), 2.0]], dtype=torch.float64)
    torch.testing.assert_close(out.is_weights, expected)
    assert out.metrics["rollout_is_ratio_fraction_high"] == 0.5
    assert out.metrics["rollout_is_max"] == 2.0


@pytest.mark.parametrize("cap", [1.0, 0.5, 0.0, -2.0])
def test_token_tis_rejects_cap_not_above_one(cap):
    old = torch.zeros(1, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="token_tis cap must be > 1"):
        token_tis(old, old, torch.ones(1, 2), cap=cap)


def test_token_tis_accepts_a_cap_just_above_one():
    old = torch.zeros(1, 2, dtype=torch.float64)
    out = token_tis(old, old - torch.tensor([[0.5, -0.5]], dtype=torch.float64), torch.ones(1, 2), cap=1.0 + 1e-9)
    torch.testing.assert_close(out.is_weights, torch.tensor([[1.0 + 1e-9, math.exp(-0.5)]], dtype=torch.float64))


def test_token_tis_fractions_are_strict_at_cap_and_inverse_cap():
    # rho = 4 (= cap), 0.25 (= 1/cap), 1, e^2 > 4, e^-2 < 1/4: one token above, one below
    log_rho = torch.tensor([[math.log(4.0), math.log(0.25), 0.0, 2.0, -2.0]], dtype=torch.float64)
    assert log_rho.exp()[0, :2].tolist() == [4.0, 0.25]  # exact in float64
    roll = torch.zeros_like(log_rho)
    out = token_tis(log_rho, roll, torch.ones_like(log_rho), cap=4.0)
    assert out.metrics["rollout_is_ratio_fraction_high"] == pytest.approx(1 / 5)
    assert out.metrics["rollout_is_ratio_fraction_low"] == pytest.approx(1 / 5)
    if helper is not None:  # verl 0.9.1 agrees
        _, theirs = helper.compute_rollout_correction_weights(log_rho, torch.ones_like(log_rho), "token", 4.0)
        assert theirs["rollout_is_ratio_fraction_high"] == pytest.approx(1 / 5)
        assert theirs["rollout_is_ratio_fraction_low"] == pytest.approx(1 / 5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_tis_weights_in_the_log_probs_dtype(dtype):
    old = torch.tensor([[-1.0, -2.0, -0.5]], dtype=dtype)
    roll = torch.tensor([[-1.5, -1.0, -0.5]], dtype=dtype)
    out = token_tis(old, roll, torch.ones(1, 3), cap=2.0)
    assert out.is_weights.dtype == dtype
    expected = torch.tensor([[min(math.exp(0.5), 2.0), math.exp(-1.0), 1.0]]).to(dtype)
    torch.testing.assert_close(out.is_weights, expected)


@pytest.mark.parametrize("fn", [seq_max_k2, seq_max_k3])
@pytest.mark.parametrize("threshold", [0.0, -0.1])
def test_sequence_rejection_rejects_threshold_not_above_zero(fn, threshold):
    old = torch.zeros(1, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match=f"{fn.__name__} threshold must be > 0"):
        fn(old, old, torch.ones(1, 2), threshold=threshold)


@pytest.mark.parametrize("fn", [seq_max_k2, seq_max_k3])
def test_sequence_rejection_default_threshold_is_0_05(fn):
    # log rho 0.28: k2 = 0.0392, k3 = e^0.28 - 1.28 = 0.0431 (kept at 0.05);
    # log rho 0.4: k2 = 0.08, k3 = 0.0918 (rejected at 0.05, kept at 0.1 or above)
    log_rho = torch.tensor([[0.28, 0.0, 0.1], [0.0, 0.4, 0.0], [-0.1, 0.2, 0.0]], dtype=torch.float64)
    old = torch.full_like(log_rho, -1.0)
    mask = torch.ones_like(log_rho)
    out = fn(old, old - log_rho, mask)
    torch.testing.assert_close(out.response_mask, torch.tensor([[1.0] * 3, [0.0] * 3, [1.0] * 3], dtype=torch.float64))
    key = f"rollout_rs_{fn.__name__}_seq_masked_fraction"
    assert out.metrics[key] == pytest.approx(1 / 3)
    if helper is not None:  # verl 0.9.1 agrees
        theirs, _ = helper.compute_rollout_rejection_mask(log_rho, mask, fn.__name__, 0.05)
        torch.testing.assert_close(out.response_mask, theirs)


def test_seq_max_k2_is_half_the_squared_log_ratio():
    # log rho 0.4: k2 = 0.5 * 0.16 = 0.08 <= 0.1 (kept); log rho 0.5: k2 = 0.125 > 0.1 (rejected)
    log_rho = torch.tensor([[0.4, -0.4, 0.0], [0.1, 0.5, 0.0]], dtype=torch.float64)
    old = torch.full_like(log_rho, -2.0)
    out = seq_max_k2(old, old - log_rho, torch.ones_like(log_rho), threshold=0.1)
    assert out.response_mask.sum(-1).tolist() == [3.0, 0.0]


@pytest.mark.parametrize("fn", [seq_max_k2, seq_max_k3])
def test_sequence_rejection_keeps_a_max_equal_to_the_threshold(fn):
    # log rho = 0.5 exactly: k2 = 0.125 exactly; k3 = e^0.5 - 1.5 as computed by torch
    log_rho = torch.tensor([[0.5, 0.0], [0.5, 0.75]], dtype=torch.float64)
    old = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]], dtype=torch.float64)
    roll = old - log_rho
    assert (old - roll).tolist() == log_rho.tolist()
    half = torch.tensor(0.5, dtype=torch.float64)
    threshold = 0.125 if fn is seq_max_k2 else float(half.exp() - 1.0 - half)
    out = fn(old, roll, torch.ones_like(old), threshold=threshold)
    assert out.response_mask.tolist() == [[1.0, 1.0], [0.0, 0.0]]
    if helper is not None:  # verl 0.9.1 agrees
        theirs, _ = helper.compute_rollout_rejection_mask(log_rho, torch.ones_like(old), fn.__name__, threshold)
        assert theirs.tolist() == [[1.0, 1.0], [0.0, 0.0]]


@pytest.mark.parametrize("fn", [seq_max_k2, seq_max_k3])
def test_sequence_rejection_ignores_padding_tokens(fn):
    log_rho = torch.tensor([[0.01, 0.02, 5.0, -5.0], [0.0, 0.03, 0.0, 9.0]], dtype=torch.float64)
    old = torch.full_like(log_rho, -0.7)
    mask = _mask([2, 3], 4)
    out = fn(old, old - log_rho, mask, threshold=0.05)
    torch.testing.assert_close(out.response_mask, mask)  # nothing rejected: the large drifts are padding
    assert out.metrics[f"rollout_rs_{fn.__name__}_masked_fraction"] == 0.0
    assert out.metrics["rollout_rs_seq_masked_fraction"] == 0.0


@pytest.mark.parametrize("fn", [seq_max_k2, seq_max_k3])
def test_sequence_rejection_of_a_single_sequence_batch(fn):
    log_rho = torch.tensor([[0.01, 1.0, 0.0]], dtype=torch.float64)
    old = torch.full_like(log_rho, -0.7)
    mask = _mask([2], 3)
    out = fn(old, old - log_rho, mask, threshold=0.05)
    assert out.response_mask.tolist() == [[0.0, 0.0, 0.0]]
    name = fn.__name__
    expected = {
        f"rollout_rs_{name}_masked_fraction": 1.0,
        f"rollout_rs_{name}_seq_masked_fraction": 1.0,  # one of one sequence
        "rollout_rs_masked_fraction": 1.0,
        "rollout_rs_seq_masked_fraction": 1.0,
    }
    assert out.metrics == pytest.approx(expected)
    if helper is not None:  # verl 0.9.1 agrees
        _, theirs = helper.compute_rollout_rejection_mask(log_rho, mask, name, 0.05)
        for key, value in expected.items():
            assert theirs[key] == pytest.approx(value), key


@pytest.mark.parametrize("fn", [seq_max_k2, seq_max_k3])
def test_sequence_rejection_returns_its_metrics(fn):
    # rows: kept, rejected (2 tokens), kept, rejected (4 tokens): token fraction 6/11, sequence fraction 1/2
    log_rho = torch.tensor(
        [[0.1, 0.0, 0.0, 0.0], [0.0, 0.9, 0.0, 0.0], [0.05, -0.1, 0.1, 0.0], [0.0, 0.0, 0.0, -1.2]],
        dtype=torch.float64,
    )
    old = torch.full_like(log_rho, -1.0)
    mask = _mask([2, 2, 3, 4], 4)
    out = fn(old, old - log_rho, mask, threshold=0.05)
    name = fn.__name__
    expected = {
        f"rollout_rs_{name}_masked_fraction": 6 / 11,
        f"rollout_rs_{name}_seq_masked_fraction": 0.5,
        "rollout_rs_masked_fraction": 6 / 11,
        "rollout_rs_seq_masked_fraction": 0.5,
    }
    assert out.metrics == pytest.approx(expected)
    assert out.response_mask.sum(-1).tolist() == [2.0, 0.0, 3.0, 0.0]


def test_masked_means_over_a_single_real_token():
    # one real token in the batch: every mean divides by exactly 1
    old = torch.tensor([[-0.7, -3.0], [-1.0, -2.0]], dtype=torch.float64)
    roll = torch.tensor([[-1.3, -0.1], [-0.2, -0.4]], dtype=torch.float64)
    mask = _mask([1, 0], 2)
    ours = offpolicy_metrics(old, roll, mask)
    assert ours["kl"] == pytest.approx(-1.3 + 0.7, rel=1e-13)
    assert ours["training_log_ppl"] == pytest.approx(0.7, rel=1e-13)
    assert ours["rollout_log_ppl"] == pytest.approx(1.3, rel=1e-13)
    assert ours["log_ppl_diff"] == pytest.approx(-0.6, rel=1e-13)
    assert ours["k3_kl"] == pytest.approx(math.exp(0.6) - 0.6 - 1, rel=1e-13)
    assert ours["chi2_token"] == pytest.approx(math.exp(1.2) - 1, rel=1e-13)
    out = token_tis(old, roll, mask, cap=1.5)
    assert out.metrics["rollout_is_mean"] == pytest.approx(min(math.exp(0.6), 1.5), rel=1e-13)


def test_token_tis_clamps_the_log_ratio_at_minus_20():
    log_rho = torch.tensor([[-25.0, -20.5, -19.0, 0.5]], dtype=torch.float64)
    old = torch.full_like(log_rho, -0.5)
    mask = torch.ones_like(log_rho)
    out = token_tis(old, old - log_rho, mask, cap=2.0)
    expected = torch.tensor([[math.exp(-20), math.exp(-20), math.exp(-19), math.exp(0.5)]], dtype=torch.float64)
    torch.testing.assert_close(out.is_weights, expected, rtol=1e-12, atol=0)
    assert out.metrics["rollout_is_min"] == pytest.approx(math.exp(-20), rel=1e-12)
    if helper is not None:  # verl 0.9.1 agrees
        theirs, _ = helper.compute_rollout_correction_weights(log_rho, mask, "token", 2.0)
        torch.testing.assert_close(out.is_weights, theirs, rtol=1e-12, atol=0)


@pytest.mark.parametrize(
    ("fn", "stat_at_20"),
    [(seq_max_k2, 0.5 * 20.0**2), (seq_max_k3, math.exp(20.0) - 21.0), (seq_max_k3, math.exp(-20.0) + 19.0)],
)
def test_sequence_rejection_clamps_the_log_ratio_at_20(fn, stat_at_20):
    # log rho +-25 is clamped to +-20 before k2 / k3: kept at a threshold just above the clamped value,
    # rejected just below it
    sign = -1.0 if stat_at_20 < 100 else 1.0
    log_rho = torch.tensor([[sign * 25.0, 0.0], [sign * 20.5, 0.1]], dtype=torch.float64)
    if fn is seq_max_k2:
        log_rho = torch.cat([log_rho, -log_rho])  # k2 is even in log rho
    old = torch.full_like(log_rho, -1.0)
    mask = torch.ones_like(log_rho)
    rows = log_rho.shape[0]
    kept = fn(old, old - log_rho, mask, threshold=stat_at_20 * (1 + 1e-9))
    assert kept.response_mask.sum().item() == 2 * rows
    rejected = fn(old, old - log_rho, mask, threshold=stat_at_20 * (1 - 1e-9))
    assert rejected.response_mask.sum().item() == 0
    if helper is not None:  # verl 0.9.1 agrees
        theirs, _ = helper.compute_rollout_rejection_mask(log_rho, mask, fn.__name__, stat_at_20 * (1 + 1e-9))
        assert theirs.sum().item() == 2 * rows
