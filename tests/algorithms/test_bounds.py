"""TRM error bounds (runners/algorithms/bounds.py) against the paper's numbers and brute-force sums.

Checks against: TRM (arXiv 2512.23075) section 4's numbers (T = 4096 table, large-divergence case,
Adaptive worst case, Z(T), table D.1), the small-divergence closed forms (eq. 29, 36), and plain
Python loops over positions for the sums.  Run: ``pytest tests/algorithms/test_bounds.py``.
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runners.algorithms.bounds import (
    BOUND_KEYS,
    adaptive_bound,
    adaptive_worst_case,
    dbar_from_position_buckets,
    error_bounds,
    ln_trm_normaliser,
    trm_max_acceptance,
)
from runners.metric_names import trm_tv_position_bucket


def pm_loop(T: int, delta: float, cap: bool = True) -> float:
    """Pinsker-Marginal bound (eq. 28) by a loop over t = 1..T, summed exactly (``math.fsum``)."""
    c = math.sqrt(delta / 2)
    terms = [math.sqrt((t - 1) * delta / 2) for t in range(1, T + 1)]
    if cap:
        c, terms = min(1.0, c), [min(1.0, x) for x in terms]
    return 4 * c * math.fsum(terms)


def z_loop(T: int, delta: float) -> float:
    """LN-TRM normaliser (eq. 77): sum_{t=1..T} min(1, sqrt((T - t) delta / 2)), summed exactly."""
    return math.fsum(min(1.0, math.sqrt((T - t) * delta / 2)) for t in range(1, T + 1))


def test_paper_table_small_divergence():
    """T = 4096, delta = 1e-4, D_seq = 0.01: classical 1677, PM 35.0, linear 115.9, Mixed 8.2."""
    b = error_bounds(4096, 1e-4, d_seq=0.01)
    assert b["classical"] == pytest.approx(1677, abs=0.5)
    # the paper's 35.0 is the simplified form (4/3) T^{3/2} delta = 34.95; the exact sum is 34.946
    assert b["pinsker_marginal"] == pytest.approx(35.0, abs=0.06)
    assert round(4 / 3 * 4096**1.5 * 1e-4, 1) == 35.0
    assert b["linear"] == pytest.approx(115.9, abs=0.05)
    assert b["mixed"] == pytest.approx(8.2, abs=0.05)
    assert b["best"] == b["mixed"]
    assert math.isnan(b["adaptive"])


def test_paper_table_large_divergence():
    """delta = D_seq = 1: classical 1.68e7, linear 11585, PM 3.49e5 (no cap) / 11582 (cap), Mixed 8192."""
    capped = error_bounds(4096, 1.0, d_seq=1.0)
    uncapped = error_bounds(4096, 1.0, d_seq=1.0, cap=False)
    assert capped["classical"] == pytest.approx(1.68e7, rel=2e-3)
    assert capped["linear"] == pytest.approx(11585, abs=0.5)
    assert uncapped["pinsker_marginal"] == pytest.approx(3.49e5, rel=2e-3)
    assert capped["pinsker_marginal"] == pytest.approx(11582, abs=0.5)
    assert capped["mixed"] == pytest.approx(8192, abs=0.5)
    assert capped["best"] == pytest.approx(8192, abs=0.5)


def test_adaptive_worst_case_value_and_identity():
    """~1139 at delta = 0.01 (appendix C.5); equals the capped PM bound (remark 4.7, index reversal)."""
    assert adaptive_worst_case(4096, 0.01) == pytest.approx(1139, abs=1)
    for T, delta in [(1, 0.3), (7, 0.5), (300, 0.01), (4096, 1e-4), (5000, 2.0)]:
        cap = min(1.0, math.sqrt(delta / 2))
        via_dbar = adaptive_bound(np.full(T, cap), delta)
        assert via_dbar == pytest.approx(adaptive_worst_case(T, delta), rel=1e-9)
        assert via_dbar == pytest.approx(pm_loop(T, delta), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("T, expected", [(256, 19.25), (1024, 154.36), (4096, 1235.5)])
def test_ln_trm_normaliser_paper_values(T, expected):
    assert ln_trm_normaliser(T, 1e-4) == pytest.approx(expected, abs=0.05)  # half the printed digit
    assert ln_trm_normaliser(T, 1e-4) == pytest.approx(z_loop(T, 1e-4), rel=1e-10)


def test_ln_trm_normaliser_short_sequences():
    assert ln_trm_normaliser(1, 1e-4) == 0.0
    assert ln_trm_normaliser(0, 1e-4) == 0.0
    assert ln_trm_normaliser(2, 1e-4) == pytest.approx(math.sqrt(0.5e-4))


@pytest.mark.parametrize(
    "p, lengths, table",
    [
        (1e-3, [256, 1024, 4096, 8192], [0.774, 0.358, 0.017, 0.0003]),
        (1e-4, [256, 1024, 4096, 8192, 16384], [0.975, 0.903, 0.663, 0.440, 0.194]),
    ],
)
def test_acceptance_table_d1(p, lengths, table):
    """Table D.1; the paper truncates some entries (0.358 for 0.3590), hence tol 1e-3."""
    got = trm_max_acceptance(p, np.array(lengths))
    np.testing.assert_allclose(got, table, atol=1e-3)
    for T, value in zip(lengths, got):
        assert value == pytest.approx((1 - p) ** T, rel=1e-12)


@pytest.mark.parametrize("T", [64, 500, 4096, 20000])
def test_small_divergence_closed_forms(T):
    """delta <= 2/T: PM -> (4/3) T^{3/2} delta (eq. 29, up to O(1/T)); Mixed = 2 T sqrt(delta D_seq)."""
    for delta in [2.0 / T, 0.1 / T, 1e-3 / T]:
        d_seq = 0.5 * delta * T
        b = error_bounds(T, delta, d_seq=d_seq)
        assert b["pinsker_marginal"] == pytest.approx(4 / 3 * T**1.5 * delta, rel=1.0 / T)
        assert b["pinsker_marginal"] == pytest.approx(pm_loop(T, delta), rel=1e-10)
        assert b["mixed"] == pytest.approx(2 * T * math.sqrt(delta * d_seq), rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    T=st.integers(min_value=0, max_value=3000),
    delta=st.floats(min_value=0.0, max_value=5.0, allow_nan=False),
    d_seq=st.floats(min_value=0.0, max_value=50.0, allow_nan=False),
)
def test_sums_match_loops(T, delta, d_seq):
    """The closed-form/Euler-Maclaurin sums equal plain loops, capped and uncapped."""
    for cap in (True, False):
        b = error_bounds(T, delta, d_seq=d_seq, cap=cap)
        assert b["pinsker_marginal"] == pytest.approx(pm_loop(T, delta, cap), rel=1e-9, abs=1e-9)
        c = math.sqrt(delta / 2)
        c = min(1.0, c) if cap else c
        assert b["linear"] == pytest.approx(4 * T * c, rel=1e-12, abs=1e-12)
        assert b["classical"] == pytest.approx(T * (T - 1) * delta, rel=1e-12, abs=1e-12)
    assert ln_trm_normaliser(T, delta) == pytest.approx(z_loop(T, delta), rel=1e-9, abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(
    T=st.integers(min_value=1, max_value=400),
    delta=st.floats(min_value=1e-6, max_value=3.0),
    seed=st.integers(0, 2**31 - 1),
)
def test_adaptive_ordering(T, delta, seed):
    """Adaptive with Dbar_t <= min(1, sqrt(delta/2)) is <= PM and <= linear (theorem 4.6); best is the min."""
    cap = min(1.0, math.sqrt(delta / 2))
    dbar = np.random.default_rng(seed).uniform(0, cap, size=T)
    b = error_bounds(T, delta, d_seq=delta * T, dbar=dbar)
    assert b["adaptive"] <= b["pinsker_marginal"] * (1 + 1e-12) + 1e-12
    assert b["adaptive"] <= b["linear"] * (1 + 1e-12) + 1e-12
    assert b["best"] == min(b["pinsker_marginal"], b["mixed"], b["adaptive"])
    loop = 4 * sum(dbar[t - 1] * min(1.0, math.sqrt((T - t) * delta / 2)) for t in range(1, T + 1))
    assert b["adaptive"] == pytest.approx(loop, rel=1e-10, abs=1e-12)


def test_vectorised_over_T_and_delta():
    T = np.array([1, 10, 4096])
    delta = np.array([[1e-4], [1.0]])
    b = error_bounds(T, delta)
    assert set(b) == set(BOUND_KEYS)
    assert b["pinsker_marginal"].shape == (2, 3)
    for i, d in enumerate(delta[:, 0]):
        for j, t in enumerate(T):
            assert b["pinsker_marginal"][i, j] == pytest.approx(pm_loop(int(t), float(d)), rel=1e-10, abs=1e-12)
    assert np.all(np.isnan(b["mixed"]))


def test_invalid_inputs_name_the_argument():
    with pytest.raises(ValueError, match="delta"):
        error_bounds(10, -1.0)
    with pytest.raises(ValueError, match="T"):
        error_bounds(2.5, 0.1)
    with pytest.raises(ValueError, match="dbar must have length T = 4"):
        error_bounds(4, 0.1, dbar=[0.1] * 3)
    with pytest.raises(ValueError, match="d_seq"):
        error_bounds(4, 0.1, d_seq=float("nan"))
    with pytest.raises(ValueError, match="p must be"):
        trm_max_acceptance(1.5, 10)


def test_dbar_from_position_buckets():
    metrics = {
        trm_tv_position_bucket(0, 2): 0.1,
        trm_tv_position_bucket(2, 8): 0.3,
        "trm/accept_rate": 0.9,
    }
    np.testing.assert_allclose(dbar_from_position_buckets(metrics, 5), [0.1, 0.1, 0.3, 0.3, 0.3])
    np.testing.assert_allclose(dbar_from_position_buckets({(0, 3): 0.2}, 3), [0.2] * 3)
    with pytest.raises(ValueError, match="do not cover positions 8..9"):
        dbar_from_position_buckets(metrics, 10)


def test_bounds_module_does_not_import_torch():
    code = "import sys, runners.algorithms.bounds; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
