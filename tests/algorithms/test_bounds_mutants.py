"""TRM error bounds (TRM, arXiv 2512.23075, section 4, appendices C-D) on cases aimed at mutation testing
(``make mutation``) of runners/algorithms/bounds.py.

Each test compares the library with values written here by hand or with plain Python loops over positions
(``math.fsum``), on inputs the main tests (``test_bounds.py``) do not reach: the ends of every accepted
range (p = 0 and 1, Dbar = 0 and 1, zero divergence, T = 0), divergences above 2 where the ``min(1, .)`` caps
act, sums just past the exact-prefix length 256 (the Euler-Maclaurin branch), lengths beyond 2^53,
non-float numeric inputs, shapes of broadcast results, and the wording of every error.

Run: ``pytest tests/algorithms/test_bounds_mutants.py``.
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import numpy as np
import pytest

from runners.algorithms.bounds import (
    adaptive_bound,
    adaptive_worst_case,
    dbar_from_position_buckets,
    error_bounds,
    ln_trm_normaliser,
    trm_max_acceptance,
)
from runners.metric_names import trm_tv_position_bucket
from tests.algorithms.test_bounds import pm_loop, z_loop


def sum_sqrt_loop(n: int) -> float:
    """sum_{k=1..n} sqrt(k), each root correctly rounded, summed exactly."""
    return math.fsum(math.sqrt(k) for k in range(1, n + 1))


# -- TRM-Max acceptance (eq. 75) -------------------------------------------------------------------------
def test_acceptance_at_the_ends_of_the_probability_range():
    """p = 0: every sequence is accepted; p = 1: none of positive length; (1 - p)^0 = 1."""
    assert trm_max_acceptance(0.0, 10) == 1.0
    assert trm_max_acceptance(0, 0) == 1.0
    assert trm_max_acceptance(1.0, 3) == 0.0
    assert trm_max_acceptance(1, 0) == 1.0
    np.testing.assert_array_equal(trm_max_acceptance(np.array([0.0, 0.5, 1.0]), 2), [1.0, 0.25, 0.0])
    for p in (-1e-12, 1.0 + 1e-12, 2.0, float("nan")):
        with pytest.raises(ValueError, match=r"^p must be a probability in \[0, 1\], got "):
            trm_max_acceptance(p, 4)


def test_acceptance_takes_any_real_number_type():
    """p as a Fraction, a float32 or integers: converted to float64 before computing (1 - p)^T."""
    assert trm_max_acceptance(Fraction(1, 4), 3) == 27 / 64
    p32 = np.float32(0.1)
    assert trm_max_acceptance(p32, 1000) == pytest.approx((1 - float(p32)) ** 1000, rel=1e-12, abs=0)
    got = trm_max_acceptance([0, 1], np.array([2, 2]))
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, [1.0, 0.0])
    assert isinstance(trm_max_acceptance(0.5, 2), float)


# -- argument checks and their messages ------------------------------------------------------------------
@pytest.mark.parametrize("T", [-1, np.array([3, -2]), 2.5, float("inf"), float("nan"), True, "4", None])
def test_lengths_must_be_non_negative_integers(T):
    for fn in (lambda: error_bounds(T, 0.1), lambda: ln_trm_normaliser(T, 0.1), lambda: adaptive_worst_case(T, 0.1)):
        with pytest.raises(ValueError, match=r"^T must be a non-negative integer \(or an array of them\), got "):
            fn()
    with pytest.raises(ValueError, match=r"^T must be"):
        trm_max_acceptance(0.1, T)


@pytest.mark.parametrize("bad", [-1e-3, float("inf"), float("nan"), np.array([0.1, -0.1])])
def test_divergences_must_be_finite_and_non_negative(bad):
    message = r"^{} must be a finite non-negative divergence, got "
    for fn in (
        lambda: error_bounds(5, bad),
        lambda: ln_trm_normaliser(5, bad),
        lambda: adaptive_worst_case(5, bad),
        lambda: adaptive_bound([0.1] * 5, bad),
    ):
        with pytest.raises(ValueError, match=message.format("delta")):
            fn()
    with pytest.raises(ValueError, match=message.format("d_seq")):
        error_bounds(5, 0.1, d_seq=bad)


def test_divergences_take_any_real_number_type():
    """Fractions and ints are converted to float64: the same bounds as the float inputs."""
    want = error_bounds(300, 0.01, d_seq=0.5)
    got = error_bounds(300, Fraction(1, 100), d_seq=Fraction(1, 2))
    assert got == pytest.approx(want, rel=1e-15, nan_ok=True)
    # and those float bounds are the paper's (eqs. 28 and the classical / linear / mixed forms), not just equal
    c = math.sqrt(0.01 / 2)
    assert got["classical"] == pytest.approx(300 * 299 * 0.01, rel=1e-15)
    assert got["linear"] == pytest.approx(4 * 300 * c, rel=1e-15)
    assert got["pinsker_marginal"] == pytest.approx(pm_loop(300, 0.01), rel=1e-12)
    assert got["mixed"] == pytest.approx(2 * 300 * math.sqrt(0.01 * 0.5), rel=1e-15)
    assert error_bounds(300, 1, d_seq=3) == pytest.approx(error_bounds(300, 1.0, d_seq=3.0), rel=1e-15, nan_ok=True)
    assert ln_trm_normaliser(300, Fraction(1, 100)) == pytest.approx(z_loop(300, 0.01), rel=1e-12)
    assert adaptive_worst_case(300, Fraction(1, 100)) == pytest.approx(pm_loop(300, 0.01), rel=1e-12)
    assert adaptive_bound([Fraction(1, 10)] * 4, Fraction(1, 2)) == pytest.approx(
        4 * 0.1 * (math.sqrt(0.75) + math.sqrt(0.5) + 0.5), rel=1e-15
    )


def test_adaptive_bound_checks_dbar_and_delta():
    for dbar in ([[0.1, 0.2], [0.1, 0.2]], [0.1, float("nan")], [0.1, -0.01], [0.1, 1.01], [1.5, 0.1]):
        with pytest.raises(ValueError, match=r"^dbar must be a 1-D sequence of TV distances in \[0, 1\], got shape"):
            adaptive_bound(dbar, 0.1)
    with pytest.raises(ValueError, match=r"^delta must be a scalar when dbar is given, got shape \(1,\)$"):
        adaptive_bound([0.1, 0.2], [0.5])
    with pytest.raises(ValueError, match=r"^T must be a scalar when dbar is given, got shape \(2,\)$"):
        error_bounds(np.array([2, 2]), 0.1, dbar=[0.1, 0.2])
    with pytest.raises(ValueError, match=r"^dbar must have length T = 3, got 2$"):
        error_bounds(3, 0.1, dbar=[0.1, 0.2])


# -- values ----------------------------------------------------------------------------------------------
def test_adaptive_bound_at_the_ends_of_the_tv_range():
    """Dbar = 0 and 1 are valid TV distances. T = 3, delta = 0.5: future caps min(1, sqrt((3 - t) / 4)) =
    (sqrt(1/2), 1/2, 0); with delta = 8 they are (1, 1, 0)."""
    assert adaptive_bound([0.0, 0.0, 0.0], 0.5) == 0.0
    assert adaptive_bound([1.0, 0.0, 1.0], 0.5) == pytest.approx(4 * math.sqrt(0.5), rel=1e-15)
    assert adaptive_bound([1.0, 1.0, 1.0], 0.5) == pytest.approx(4 * (math.sqrt(0.5) + 0.5), rel=1e-15)
    assert adaptive_bound([0.25, 0.5, 1.0], 8.0) == pytest.approx(4 * (0.25 + 0.5), rel=1e-15)
    b = error_bounds(3, 0.5, dbar=[1.0, 0.0, 1.0])
    assert b["adaptive"] == pytest.approx(4 * math.sqrt(0.5), rel=1e-15)


@pytest.mark.parametrize("delta", [2.5, 8.0, 50.0])
def test_caps_act_above_delta_two(delta):
    """delta > 2: sqrt(delta / 2) > 1, so the capped token TV is 1 (eq. 17); the same for D_seq in Mixed."""
    T = 7
    b = error_bounds(T, delta, d_seq=2 * delta)
    assert b["linear"] == 4.0 * T
    assert b["pinsker_marginal"] == pytest.approx(pm_loop(T, delta), rel=1e-14)
    assert b["pinsker_marginal"] == pytest.approx(4.0 * (T - 1), rel=1e-14)
    assert b["mixed"] == 4.0 * T
    assert b["classical"] == pytest.approx(T * (T - 1) * delta, rel=1e-15)
    assert adaptive_worst_case(T, delta) == pytest.approx(pm_loop(T, delta), rel=1e-14)
    assert ln_trm_normaliser(T, delta) == pytest.approx(z_loop(T, delta), rel=1e-14)
    u = error_bounds(T, delta, d_seq=2 * delta, cap=False)
    c = math.sqrt(delta / 2)
    assert u["linear"] == pytest.approx(4 * T * c, rel=1e-15)
    assert u["mixed"] == pytest.approx(4 * T * c * math.sqrt(delta), rel=1e-15)
    assert u["pinsker_marginal"] == pytest.approx(pm_loop(T, delta, cap=False), rel=1e-14)


@pytest.mark.parametrize("T", [0, 1, 2, 5])
def test_short_and_zero_divergence_sums(T):
    """T = 0 and 1 have no (or a zero) term; delta = 0 gives 0 everywhere except the never-zero caps."""
    for cap in (True, False):
        for delta in (0.0, 0.3, 3.0):
            b = error_bounds(T, delta, cap=cap)
            assert b["pinsker_marginal"] == pytest.approx(pm_loop(T, delta, cap), rel=1e-14, abs=0)
    assert ln_trm_normaliser(T, 0.0) == 0.0
    assert adaptive_worst_case(T, 0.0) == 0.0
    assert ln_trm_normaliser(T, 3.0) == pytest.approx(z_loop(T, 3.0), rel=1e-14, abs=0)


@pytest.mark.parametrize("n", [255, 256, 257, 258, 300, 1000, 5000])
def test_sum_of_roots_past_the_exact_prefix(n):
    """delta = 2: c = sqrt(delta / 2) = 1 and the uncapped PM bound is 4 sum_{k=1..T-1} sqrt(k) exactly; the
    Euler-Maclaurin branch beyond 256 terms agrees with the loop to a few ulps."""
    got = error_bounds(n + 1, 2.0, cap=False)["pinsker_marginal"]
    assert got / 4 == pytest.approx(sum_sqrt_loop(n), rel=2e-15, abs=0)


def test_subnormal_divergence_gives_no_warning():
    """delta / 2 subnormal: 1 / (delta / 2) overflows to inf, which is the right count of terms on the
    sqrt branch (all of them); no RuntimeWarning."""
    delta = 1e-320
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = ln_trm_normaliser(10, delta)
        worst = adaptive_worst_case(10, delta)
        b = error_bounds(10, delta)
    want = math.sqrt(delta / 2) * sum_sqrt_loop(9)
    assert got == pytest.approx(want, rel=1e-12, abs=0) and got > 0
    assert worst == pytest.approx(4 * math.sqrt(delta / 2) * want, rel=1e-12, abs=0)
    assert b["pinsker_marginal"] == pytest.approx(worst, rel=1e-12, abs=0)


def test_lengths_beyond_float_precision_stay_exact():
    """delta = 2: every term of Z(T) but the last is min(1, sqrt(T - t)) = 1, so Z(T) = T - 1 exactly; at
    T = 2^53 + 1 that is 2^53, which needs the length kept as an integer (2^53 + 1 is not a float64)."""
    for T in (5, 2**40 + 1, 2**53 + 1):
        assert ln_trm_normaliser(T, 2.0) == float(T - 1)


# -- return types and shapes -----------------------------------------------------------------------------
def test_scalars_in_floats_out():
    b = error_bounds(10, 0.1, d_seq=0.2, dbar=[0.1] * 10)
    assert all(type(v) is float for v in b.values())
    assert type(error_bounds(10, 0.1)["mixed"]) is float and math.isnan(error_bounds(10, 0.1)["mixed"])
    assert type(ln_trm_normaliser(10, 0.1)) is float
    assert type(adaptive_worst_case(10, 0.1)) is float
    assert type(trm_max_acceptance(0.1, 10)) is float
    one = error_bounds(np.array([10]), 0.1)
    assert all(isinstance(v, np.ndarray) and v.shape == (1,) for v in one.values())


def test_broadcast_shapes_and_best():
    """Every key has the broadcast shape of T, delta and d_seq (NaN where absent); best is the elementwise
    minimum of pinsker_marginal and mixed."""
    T = np.array([4, 50, 400])
    delta = np.array([[1e-3], [0.5]])
    b = error_bounds(T, delta)
    for key, value in b.items():
        assert value.shape == (2, 3), key
        assert value.dtype == np.float64
    assert np.all(np.isnan(b["mixed"])) and np.all(np.isnan(b["adaptive"]))
    np.testing.assert_array_equal(b["best"], b["pinsker_marginal"])
    d_seq = np.array([[1e-4], [50.0]])
    b = error_bounds(T, delta, d_seq=d_seq)
    for i in range(2):
        for j in range(3):
            t, d, s = int(T[j]), float(delta[i, 0]), float(d_seq[i, 0])
            pm = pm_loop(t, d)
            mixed = 4 * t * min(1.0, math.sqrt(d / 2)) * min(1.0, math.sqrt(s / 2))
            assert b["pinsker_marginal"][i, j] == pytest.approx(pm, rel=1e-12)
            assert b["mixed"][i, j] == pytest.approx(mixed, rel=1e-14)
            assert b["best"][i, j] == pytest.approx(min(pm, mixed), rel=1e-12)
    assert b["best"][0, 2] == b["mixed"][0, 2] and b["best"][1, 0] == b["pinsker_marginal"][1, 0]


# -- position buckets -> Dbar ----------------------------------------------------------------------------
def test_buckets_ignore_other_metrics_anywhere_in_the_mapping():
    metrics = {
        "trm/accept_rate": 0.9,
        trm_tv_position_bucket(0, 2): 0.1,
        "trm/tv/pos_x_y": 0.7,
        trm_tv_position_bucket(2, 8): 0.3,
    }
    np.testing.assert_array_equal(dbar_from_position_buckets(metrics, 5), [0.1, 0.1, 0.3, 0.3, 0.3])


def test_bucket_bounds_and_gaps():
    """Empty or reversed buckets are rejected; the error names the first and last uncovered position."""
    for lo, hi in ((3, 3), (4, 2), (-1, 2)):
        with pytest.raises(ValueError, match=rf"^position bucket must satisfy 0 <= lo < hi, got \({lo}, {hi}\)$"):
            dbar_from_position_buckets({(lo, hi): 0.1, (0, 10): 0.2}, 5)
    with pytest.raises(ValueError, match=r"^position buckets do not cover positions 8\.\.11 of T = 12$"):
        dbar_from_position_buckets({(0, 8): 0.1}, 12)
    with pytest.raises(ValueError, match=r"^position buckets do not cover positions 2\.\.6 of T = 9$"):
        dbar_from_position_buckets({(0, 2): 0.1, (4, 5): 0.2, (7, 9): 0.3}, 9)
    np.testing.assert_array_equal(dbar_from_position_buckets({(1, 2): 0.5, (0, 1): 0.25, (2, 3): 1}, 3), [0.25, 0.5, 1])
