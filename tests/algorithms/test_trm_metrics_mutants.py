"""TRM's sample divergences and monitoring metrics (runners/algorithms/trm_metrics.py, TRM, arXiv 2512.23075,
appendices B and D) on small hand-made batches, against values computed here in float64 loops (k2 / k3 from
the loop references of tests/algorithms/test_ref_trm.py) or written by hand.

Written for mutation testing (``make mutation``): each test pins a behaviour the broader tests leave open:

- ``sample_log_ratio``: NaN -> +20, +-inf -> +-20, finite values clamped to [-20, 20], float32, detached;
- the masked per-sequence reductions (max / mean over real tokens, 0 on all-padding rows, length-1 rows);
- bucket edges: validation (two edges suffice; equal, decreasing or negative edges raise, naming the rule);
- acceptance by length at the bucket boundaries (``lo <= length < hi``, length 0 left out);
- mean token TV by position (eq. 13, 40): ended sequences count 0, empty sequences are not counted,
  positions past the batch's width count 0;
- ``log_ppl_gap`` (eq. 52) with -inf log-probs and without any real token;
- ``compute_trm_metrics``: the whole metric set, from the sample estimators or the exact KL, with the
  rollout log-probs or (absent) the old ones, on batches with an empty row, a single token, no token;
- ``apply_sequence_mask`` (eq. 50): values, dtype, shape errors.

Run: ``pytest tests/algorithms/test_trm_metrics_mutants.py``.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from runners import metric_names
from runners.algorithms import trm_metrics as tm
from runners.algorithms.types import PolicyInputs
from tests.algorithms.test_ref_trm import ref_k2, ref_k3

BOUND = 20.0  # |log r| clamp (verl's rollout correction): exp(20) ~ 4.9e8


# -- references (float64 loops) -------------------------------------------------------------------
def _rows(mask: np.ndarray) -> list[list[int]]:
    """Per row, the columns of its real tokens (mask > 0)."""
    return [[t for t in range(mask.shape[1]) if mask[i, t] > 0] for i in range(mask.shape[0])]


def ref_clamped_log_ratio(logp: float, roll: float) -> float:
    x = logp - roll
    if math.isnan(x):
        return BOUND
    return min(max(x, -BOUND), BOUND)


def ref_seq_max(values: np.ndarray, mask: np.ndarray) -> list[float]:
    return [max(values[i, t] for t in cols) if cols else 0.0 for i, cols in enumerate(_rows(mask))]


def ref_seq_mean(values: np.ndarray, mask: np.ndarray) -> list[float]:
    return [sum(values[i, t] for t in cols) / len(cols) if cols else 0.0 for i, cols in enumerate(_rows(mask))]


def ref_tv_by_position(tv: np.ndarray, mask: np.ndarray, edges) -> dict[str, float]:
    """Dbar_k = (1/N) sum over the N non-empty sequences of TV at k (0 where a sequence ended); a bucket
    is the mean of Dbar_k over its hi - lo positions, 0 past the batch's width (TRM eq. 13, 40)."""
    rows = _rows(mask)
    n = sum(1 for cols in rows if cols)
    T = tv.shape[1]
    dbar = [sum(tv[i, k] for i, cols in enumerate(rows) if k in cols) / max(n, 1) for k in range(T)]
    return {
        metric_names.trm_tv_position_bucket(lo, hi): sum(dbar[k] for k in range(lo, hi) if k < T) / (hi - lo)
        for lo, hi in zip(edges, edges[1:])
    }


def ref_accept_by_length(keep, lengths, edges) -> dict[str, float]:
    out = {}
    for lo, hi in zip(edges, edges[1:]):
        sel = [k for k, n in zip(keep, lengths) if n > 0 and lo <= n < hi]
        if sel:
            out[metric_names.trm_accept_rate_bucket(lo, hi)] = sum(sel) / len(sel)
    return out


def ref_trm_metrics(logp, roll, mask, keep, edges, *, token_kl=None, token_tv=None, position_edges=None):
    """The metric set of TRM (section 7, appendix D.1, eq. 52) in loops."""
    rows = _rows(mask)
    lengths = [len(cols) for cols in rows]
    live = [i for i, n in enumerate(lengths) if n > 0]
    lr = [[ref_clamped_log_ratio(logp[i, t], roll[i, t]) for t in cols] for i, cols in enumerate(rows)]
    out = {
        metric_names.TRM_ACCEPT_RATE: sum(keep[i] for i in live) / len(live) if live else 1.0,
        metric_names.TRM_PPL_GAP: sum(abs(sum(lr[i]) / len(lr[i])) for i in live) / len(live) if live else 0.0,
    }
    if token_kl is not None:
        max_src = mean_src = [[token_kl[i, t] for t in cols] for i, cols in enumerate(rows)]
    else:
        max_src = [[ref_k2(x) for x in row] for row in lr]
        mean_src = [[ref_k3(x) for x in row] for row in lr]
    n_tok = sum(lengths)
    out[metric_names.TRM_MAX_KL] = max(x for row in max_src for x in row) if n_tok else 0.0
    out[metric_names.TRM_MEAN_KL] = sum(x for row in mean_src for x in row) / n_tok if n_tok else 0.0
    out.update(ref_accept_by_length(keep, lengths, edges))
    if token_tv is not None:
        out.update(ref_tv_by_position(token_tv, mask, position_edges))
    return out


def _t(x) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x, dtype=np.float64))


def _close(got: dict, expected: dict, rel: float = 1e-6) -> None:
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=rel, abs=1e-9), key


# -- a batch -----------------------------------------------------------------------------------------
# lengths 4, 1, 0, 3, 2, 4 (T = 4): an empty row, a length-1 row; padding log-ratios far from the real ones
MASK = np.array(
    [
        [1, 1, 1, 1],
        [1, 0, 0, 0],
        [0, 0, 0, 0],
        [1, 1, 1, 0],
        [1, 1, 0, 0],
        [1, 1, 1, 1],
    ],
    dtype=np.float64,
)
LOG_R = np.array(
    [
        [0.10, -0.30, 0.05, 0.20],
        [-0.45, 3.0, -3.0, 3.0],
        [2.5, -2.5, 2.5, -2.5],
        [0.02, 0.60, -0.15, 3.0],
        [-0.25, -0.05, 3.0, -3.0],
        [0.01, 0.03, -0.02, 0.35],
    ]
)
ROLL = -0.4 - 2.0 * np.linspace(0.0, 1.0, LOG_R.size).reshape(LOG_R.shape)
LOGP = ROLL + LOG_R
OLD = ROLL - 0.2  # a stale anchor: the metrics must read the rollout log-probs
KEEP = [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]  # the empty row (index 2) rejected: it must not count
EDGES = (0, 2, 4, 8, 16)  # [0,2): length 1; [2,4): 2, 3; [4,8): 4; [8,16): empty
POS_EDGES = (0, 1, 3, 6)  # [3,6): position 3 and two past the width
TV = np.array(
    [
        [0.10, 0.20, 0.30, 0.40],
        [0.50, 0.90, 0.90, 0.90],
        [0.90, 0.90, 0.90, 0.90],
        [0.05, 0.15, 0.25, 0.90],
        [0.35, 0.45, 0.90, 0.90],
        [0.01, 0.02, 0.03, 0.04],
    ]
)
KL = np.array(
    [
        [0.010, 0.300, 0.020, 0.040],
        [0.200, 9.000, 9.000, 9.000],
        [9.000, 9.000, 9.000, 9.000],
        [0.001, 0.005, 0.450, 9.000],
        [0.060, 0.070, 9.000, 9.000],
        [0.002, 0.003, 0.004, 0.005],
    ]
)


def _inputs(logp, roll, mask, *, old=None, with_rollout=True) -> PolicyInputs:
    logp_t = _t(logp)
    return PolicyInputs(
        logp=logp_t,
        old_logp=_t(old if old is not None else roll),
        advantages=torch.zeros_like(logp_t),
        response_mask=_t(mask),
        rollout_logp=_t(roll) if with_rollout else None,
    )


# -- sample estimators ---------------------------------------------------------------------------
def test_sample_log_ratio_maps_nan_and_infinities_to_the_bound_and_clamps():
    inf = math.inf
    # log r = 0.5, NaN (-inf - -inf), +inf, -inf, +35, -35, +19.5, -19.5
    logp = [[0.3, -inf, 0.0, -inf, 5.0, -40.0, 9.5, -29.5]]
    roll = [[-0.2, -inf, -inf, 0.0, -30.0, -5.0, -10.0, -10.0]]
    leaf = _t(logp).requires_grad_(True)
    out = tm.sample_log_ratio(leaf, _t(roll))
    assert out.dtype == torch.float32 and not out.requires_grad
    expected = [0.5, BOUND, BOUND, -BOUND, BOUND, -BOUND, 19.5, -19.5]
    assert out[0].tolist() == pytest.approx(expected, rel=1e-6)
    assert [ref_clamped_log_ratio(a, b) for a, b in zip(logp[0], roll[0])] == pytest.approx(expected)


def test_k2_k3_on_both_signs():
    x = torch.tensor([-0.7, -0.1, 0.0, 0.3, 1.2], dtype=torch.float64)
    assert tm.k2_estimator(x).tolist() == pytest.approx([ref_k2(v) for v in x.tolist()], rel=1e-12)
    assert tm.k3_estimator(x).tolist() == pytest.approx([ref_k3(v) for v in x.tolist()], rel=1e-12, abs=1e-15)


# -- masked reductions ------------------------------------------------------------------------------
def test_seq_max_and_mean_read_only_real_tokens():
    # negative real values (a fill of 0 would win the max), large padding, an empty and a length-1 row
    values = np.array([[-0.5, -0.2, -0.9, 7.0, 7.0], [0.3, 8.0, 8.0, 8.0, 8.0], [9.0, 9.0, 9.0, 9.0, 9.0]])
    values = np.concatenate([values, [[0.1, 0.4, 0.2, 0.3, 6.0]]])
    mask = np.array([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 0]], dtype=np.float64)
    got_max = tm._seq_max(_t(values), _t(mask))
    got_mean = tm._seq_mean(_t(values), _t(mask))
    assert got_max.shape == (4,) and got_mean.shape == (4,)
    assert got_max.tolist() == pytest.approx(ref_seq_max(values, mask), rel=1e-12)
    assert got_mean.tolist() == pytest.approx(ref_seq_mean(values, mask), rel=1e-12)
    assert ref_seq_max(values, mask) == [-0.2, 0.3, 0.0, 0.4]
    assert ref_seq_mean(values, mask) == pytest.approx([-1.6 / 3, 0.3, 0.0, 0.25])


# -- bucket edges ------------------------------------------------------------------------------------
def test_two_edges_make_one_bucket():
    keep = torch.tensor([1.0, 0.0, 1.0])
    lengths = torch.tensor([3, 5, 9])
    assert tm.acceptance_by_length(keep, lengths, (0, 6)) == {metric_names.trm_accept_rate_bucket(0, 6): 0.5}
    tv = torch.tensor([[0.2, 0.4, 0.6]], dtype=torch.float64)
    out = tm.tv_by_position(tv, torch.ones(1, 3), (1, 3))
    assert out == {metric_names.trm_tv_position_bucket(1, 3): pytest.approx(0.5)}


@pytest.mark.parametrize(
    "edges",
    [(5,), (), (0, 4, 4, 8), (0, 8, 4, 16), (0, 5, 3, 8), (-1, 5), (-4, -2, 8)],
    ids=["one", "none", "equal", "decreasing", "decreasing-inside", "negative", "negative-first"],
)
def test_bad_edges_raise_naming_the_rule(edges):
    rule = r"bucket edges must be >= 0 and strictly increasing \(at least two\)"
    with pytest.raises(ValueError, match=rule):
        tm.acceptance_by_length(torch.ones(2), torch.tensor([1, 2]), edges)
    with pytest.raises(ValueError, match=rule):
        tm.tv_by_position(torch.ones(1, 2), torch.ones(1, 2), edges)


# -- acceptance by length -------------------------------------------------------------------------
def test_acceptance_by_length_at_the_bucket_boundaries():
    lengths = [0, 1, 2, 4, 5, 7, 8, 9, 16]
    keep = [0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    edges = (0, 4, 8, 16, 32, 64)
    got = tm.acceptance_by_length(torch.tensor(keep), torch.tensor(lengths), edges)
    expected = ref_accept_by_length(keep, lengths, edges)
    # [0,4): lengths 1, 2; [4,8): 4, 5, 7; [8,16): 8, 9; [16,32): 16; [32,64): empty, left out
    assert expected == {
        metric_names.trm_accept_rate_bucket(0, 4): 0.5,
        metric_names.trm_accept_rate_bucket(4, 8): pytest.approx(2 / 3),
        metric_names.trm_accept_rate_bucket(8, 16): 0.5,
        metric_names.trm_accept_rate_bucket(16, 32): 1.0,
    }
    _close(got, expected)
    # a bucket starting at 1: length 1 counts, length 0 never does
    got = tm.acceptance_by_length(torch.tensor([1.0, 0.0, 0.0]), torch.tensor([1, 0, 2]), (1, 2, 3))
    assert got == {metric_names.trm_accept_rate_bucket(1, 2): 1.0, metric_names.trm_accept_rate_bucket(2, 3): 0.0}


# -- TV by position ------------------------------------------------------------------------------------
def test_tv_by_position_counts_ended_sequences_as_zero_and_skips_empty_ones():
    got = tm.tv_by_position(_t(TV), _t(MASK), POS_EDGES)
    expected = ref_tv_by_position(TV, MASK, POS_EDGES)
    # five non-empty sequences; position 0: (0.10 + 0.50 + 0.05 + 0.35 + 0.01) / 5
    assert expected[metric_names.trm_tv_position_bucket(0, 1)] == pytest.approx(1.01 / 5)
    # positions 3..5: only position 3 exists, (0.40 + 0.04) / 5, over 3 positions
    assert expected[metric_names.trm_tv_position_bucket(3, 6)] == pytest.approx(0.44 / 5 / 3)
    _close(got, expected, rel=1e-12)
    # unit buckets past the width report 0; a bucket not starting at 0
    edges = (0, 1, 2, 3, 4, 5, 7)
    _close(tm.tv_by_position(_t(TV), _t(MASK), edges), ref_tv_by_position(TV, MASK, edges), rel=1e-12)


def test_tv_by_position_with_one_sequence_and_without_any():
    tv = np.array([[0.2, 0.6, 0.9], [0.9, 0.9, 0.9]])
    mask = np.array([[1, 1, 0], [0, 0, 0]], dtype=np.float64)
    got = tm.tv_by_position(_t(tv), _t(mask), (0, 1, 2, 4))
    expected = {
        metric_names.trm_tv_position_bucket(0, 1): 0.2,
        metric_names.trm_tv_position_bucket(1, 2): 0.6,
        metric_names.trm_tv_position_bucket(2, 4): 0.0,
    }
    assert ref_tv_by_position(tv, mask, (0, 1, 2, 4)) == pytest.approx(expected)
    _close(got, expected, rel=1e-12)
    none = tm.tv_by_position(_t(tv), torch.zeros(2, 3), (0, 2, 5))
    assert none == {metric_names.trm_tv_position_bucket(0, 2): 0.0, metric_names.trm_tv_position_bucket(2, 5): 0.0}


# -- log PPL gap --------------------------------------------------------------------------------------
def test_log_ppl_gap_matches_eq_52_with_clamped_infinite_log_probs():
    inf = math.inf
    logp = np.array([[-1.0, -inf, -2.0], [-0.5, -0.7, -9.0], [-1.0, -1.0, -1.0], [-0.2, -0.1, -0.3]])
    roll = np.array([[-1.5, -0.5, -9.0], [-inf, -0.2, 0.0], [-3.0, -3.0, -3.0], [-0.3, -0.4, -0.3]])
    mask = np.array([[1, 1, 0], [1, 1, 0], [0, 0, 0], [1, 1, 1]], dtype=np.float64)
    # row 0: (0.5 - 20) / 2; row 1: (20 - 0.5) / 2; row 3: (0.1 + 0.3 + 0) / 3; row 2 empty
    expected = (19.5 / 2 + 19.5 / 2 + 0.4 / 3) / 3
    assert tm.log_ppl_gap(_t(logp), _t(roll), _t(mask)) == pytest.approx(expected, rel=1e-6)
    assert tm.log_ppl_gap(_t(logp), _t(roll), torch.zeros(4, 3)) == 0.0


# -- the metric set ----------------------------------------------------------------------------------
def test_metrics_from_the_sample_estimators_with_tv():
    inp = _inputs(LOGP, ROLL, MASK, old=OLD)
    got = tm.compute_trm_metrics(inp, torch.tensor(KEEP), token_tv=_t(TV), length_edges=EDGES, position_edges=POS_EDGES)
    expected = ref_trm_metrics(LOGP, ROLL, MASK, KEEP, EDGES, token_tv=TV, position_edges=POS_EDGES)
    assert expected[metric_names.TRM_ACCEPT_RATE] == pytest.approx(3 / 5)
    assert expected[metric_names.TRM_MAX_KL] == pytest.approx(0.5 * 0.6**2)
    _close(got, expected)


def test_metrics_from_the_exact_kl_without_tv():
    inp = _inputs(LOGP, ROLL, MASK, old=OLD)
    got = tm.compute_trm_metrics(inp, torch.tensor(KEEP), token_kl=_t(KL), length_edges=EDGES)
    expected = ref_trm_metrics(LOGP, ROLL, MASK, KEEP, EDGES, token_kl=KL)
    assert expected[metric_names.TRM_MAX_KL] == 0.45
    assert not any(key.startswith("trm/tv/") for key in got)
    _close(got, expected)


def test_metrics_read_the_old_log_probs_without_rollout_log_probs():
    inp = _inputs(LOGP, ROLL, MASK, old=OLD, with_rollout=False)
    assert inp.rollout_or_old_logp() is inp.old_logp
    got = tm.compute_trm_metrics(inp, torch.tensor(KEEP), length_edges=EDGES)
    _close(got, ref_trm_metrics(LOGP, OLD, MASK, KEEP, EDGES))
    with_roll = _inputs(LOGP, ROLL, MASK, old=OLD)
    assert with_roll.rollout_or_old_logp() is with_roll.rollout_logp


def test_metrics_of_a_single_token_batch():
    logp = np.array([[-1.0, -0.5], [-2.0, -2.0]])
    roll = np.array([[-1.4, -3.0], [-0.1, -0.1]])
    mask = np.array([[1, 0], [0, 0]], dtype=np.float64)
    keep = [0.0, 1.0]  # the kept row is empty: the acceptance rate is the single real row's 0
    tv = np.array([[0.3, 0.8], [0.8, 0.8]])
    got = tm.compute_trm_metrics(
        _inputs(logp, roll, mask), torch.tensor(keep), token_tv=_t(tv), length_edges=(0, 2), position_edges=(0, 2)
    )
    expected = {
        metric_names.TRM_ACCEPT_RATE: 0.0,
        metric_names.TRM_PPL_GAP: 0.4,
        metric_names.TRM_MAX_KL: ref_k2(0.4),
        metric_names.TRM_MEAN_KL: ref_k3(0.4),
        metric_names.trm_accept_rate_bucket(0, 2): 0.0,
        metric_names.trm_tv_position_bucket(0, 2): 0.15,
    }
    assert ref_trm_metrics(logp, roll, mask, keep, (0, 2), token_tv=tv, position_edges=(0, 2)) == pytest.approx(
        expected
    )
    _close(got, expected)


def test_metrics_of_an_all_padding_batch():
    logp = np.array([[-1.0, -0.5, -0.2], [-2.0, -2.0, -0.1]])
    roll = np.array([[-4.0, -3.0, -5.0], [-0.1, -0.1, -6.0]])
    mask = np.zeros((2, 3))
    got = tm.compute_trm_metrics(_inputs(logp, roll, mask), torch.tensor([0.0, 0.0]), token_tv=_t(np.ones((2, 3))))
    expected = {
        metric_names.TRM_ACCEPT_RATE: 1.0,
        metric_names.TRM_PPL_GAP: 0.0,
        metric_names.TRM_MAX_KL: 0.0,
        metric_names.TRM_MEAN_KL: 0.0,
    }
    expected.update(
        {metric_names.trm_tv_position_bucket(lo, hi): 0.0 for lo, hi in zip(tm.DEFAULT_EDGES, tm.DEFAULT_EDGES[1:])}
    )
    assert got == expected


def test_default_edges():
    assert tm.DEFAULT_EDGES == (0, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
    got = tm.compute_trm_metrics(_inputs(LOGP, ROLL, MASK), torch.tensor(KEEP), token_tv=_t(TV))
    assert metric_names.trm_accept_rate_bucket(0, 64) in got
    assert metric_names.trm_tv_position_bucket(32, 64) not in got
    assert metric_names.trm_tv_position_bucket(16384, 32768) in got
    # every real row (lengths 1..4) lies in [0, 64)
    assert got[metric_names.trm_accept_rate_bucket(0, 64)] == pytest.approx(3 / 5)


# -- sequence mask -------------------------------------------------------------------------------------
def test_apply_sequence_mask_scales_rows_and_keeps_the_loss_dtype():
    loss = torch.arange(1.0, 13.0, dtype=torch.float32).reshape(3, 4)
    keep = torch.tensor([1.0, 0.0, 0.5], dtype=torch.float64)
    out = tm.apply_sequence_mask(loss, keep)
    assert out.dtype == torch.float32
    expected = [[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 0.0], [4.5, 5.0, 5.5, 6.0]]
    assert out.tolist() == expected


@pytest.mark.parametrize("shape", [(3, 1), (4,), (2,), (1, 3)])
def test_apply_sequence_mask_shape_errors_name_the_batch_size(shape):
    loss = torch.ones(3, 4)
    with pytest.raises(ValueError, match=r"^seq_mask must be \[B\] = \[3\], got " + re.escape(str(shape))):
        tm.apply_sequence_mask(loss, torch.ones(shape))
