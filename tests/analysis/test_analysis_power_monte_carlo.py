"""Power of the paired t-test and seeds needed (analysis.stats) against a Monte Carlo simulation of the test.

Reference: N = 100,000 simulated experiments per (n, effect): n paired differences drawn from
N(delta, sd^2), the two-sided one-sample t-test at alpha applied to each, power = share of rejections.
Monte Carlo standard error sqrt(p (1 - p) / N) <= 0.0016; tolerance 4 standard errors plus one draw (1 / N).
Effect sizes delta / sd run from none to very large (0 ... 30) at n = 2 ... 10, including the range where
scipy's noncentral t CDF returns NaN (nc = delta sqrt(n) / sd above about 7.5), which once made
``seeds_needed`` read NaN as enough power (the demo's "seeds for the minimal effect" said 2 where
Monte Carlo power at n = 2 is 0.505 and 3 seeds are needed).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

import analysis.stats as stats_mod
from analysis.stats import paired_t_power, seeds_needed

DRAWS = 100_000
EFFECTS = (0.0, 0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 6.149, 10.0, 30.0)  # delta / sd
NS = tuple(range(2, 11))


def _t_statistics(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation (ddof 1) of n standard normal draws, DRAWS times (fixed seed)."""
    z = np.random.default_rng(seed).standard_normal((DRAWS, n))
    return z.mean(axis=1), z.std(axis=1, ddof=1)


def _mc_power(n: int, delta: float, sd: float, alpha: float = 0.05, seed: int = 0) -> float:
    """Share of DRAWS simulated paired experiments (differences ~ N(delta, sd^2)) the two-sided t-test rejects."""
    m, s = _t_statistics(n, 1000 * n + seed)
    t = (delta + sd * m) / (sd * s / math.sqrt(n))
    return float((np.abs(t) > st.t.ppf(1 - alpha / 2, n - 1)).mean())


def _tolerance(p: float) -> float:
    return 4.0 * math.sqrt(p * (1.0 - p) / DRAWS) + 1.0 / DRAWS


@pytest.mark.parametrize("alpha", [0.05, 0.01])
def test_paired_t_power_matches_monte_carlo_from_small_to_very_large_effects(alpha):
    for n in NS:
        m, s = _t_statistics(n, 1000 * n)
        crit = st.t.ppf(1 - alpha / 2, n - 1)
        for effect in EFFECTS:
            mc = float((np.abs((effect + m) / (s / math.sqrt(n))) > crit).mean())
            p = paired_t_power(n, effect, 1.0, alpha)
            assert np.isfinite(p) and 0.0 <= p <= 1.0, (n, effect, p)
            assert abs(p - mc) <= _tolerance(p), (n, effect, alpha, p, mc)


def test_paired_t_power_is_finite_and_increasing_where_scipy_returns_nan():
    """On a fine grid of effects, up to far past the NaN region of scipy's nct CDF."""
    effects = np.linspace(0.0, 60.0, 601)
    for n in NS:
        crit = st.t.ppf(0.975, n - 1)
        nan_in_scipy = any(np.isnan(st.nct.cdf(-crit, n - 1, e * math.sqrt(n))) for e in effects)
        powers = np.array([paired_t_power(n, e, 1.0) for e in effects])
        assert np.all(np.isfinite(powers)) and np.all((powers >= 0) & (powers <= 1))
        assert np.all(np.diff(powers) >= -1e-12)  # power never falls as the effect grows
        assert powers[0] == pytest.approx(0.05, abs=1e-12)
        if n == 2:
            assert nan_in_scipy  # the case this guards against is real for the installed scipy


def test_the_reported_case_two_seeds_give_half_the_power():
    """delta / sd = 6.149 at n = 2: scipy gives NaN, the power is 0.505 (Monte Carlo), 3 seeds are needed."""
    mc = _mc_power(2, 6.149, 1.0)
    assert mc == pytest.approx(0.505, abs=_tolerance(0.505))
    assert paired_t_power(2, 6.149, 1.0) == pytest.approx(mc, abs=_tolerance(mc))
    assert seeds_needed(6.149, 1.0) == 3


CASES = [
    # (delta, sd, target power): Monte Carlo power at the smallest n reaching the target and at n - 1
    # both lie more than 4 standard errors from the target, so the Monte Carlo answer is unambiguous
    (0.2, 0.2 / 6.149, 0.8),  # 2 seeds: 0.505, 3: 0.996
    (0.06, 0.02, 0.8),  # effect 3: 3 seeds 0.745, 4: 0.967
    (2.0, 1.0, 0.8),  # 4 seeds 0.755, 5: 0.909
    (4.0, 1.0, 0.9),  # 2 seeds 0.343, 3: 0.909
    (10.0, 1.0, 0.8),  # 2 seeds 0.733, 3: ~1
    (30.0, 1.0, 0.8),  # 2 seeds 0.999
    (1.0, 1.0, 0.7),  # 8 seeds 0.681, 9: 0.748
    (-0.5, 0.5, 0.7),  # negative differences: same as +1 sd
]


@pytest.mark.parametrize("delta,sd,target", CASES)
def test_seeds_needed_is_the_smallest_n_whose_monte_carlo_power_reaches_the_target(delta, sd, target):
    mc = {n: _mc_power(n, delta, sd, seed=7) for n in NS}
    reached = [n for n in NS if mc[n] >= target]
    expected = reached[0]
    assert abs(mc[expected] - target) > _tolerance(target)
    if expected > 2:
        assert abs(mc[expected - 1] - target) > _tolerance(target)
    assert seeds_needed(delta, sd, power=target) == expected


def test_seeds_needed_never_reads_nan_power_as_enough(monkeypatch):
    """A power that is not a number (as scipy's nct once returned at n = 2) is not enough power."""
    real = stats_mod.paired_t_power

    def nan_at_two(n, delta, sd, alpha=0.05):
        return float("nan") if n == 2 else real(n, delta, sd, alpha)

    monkeypatch.setattr(stats_mod, "paired_t_power", nan_at_two)
    assert seeds_needed(6.149, 1.0) == 3
    assert seeds_needed(30.0, 1.0) == 3  # 2 would do, but a NaN power at 2 proves nothing
    monkeypatch.setattr(stats_mod, "paired_t_power", lambda *a, **k: float("nan"))
    assert seeds_needed(1.0, 1.0, n_max=50) is None


def test_paired_t_power_agrees_with_scipy_wherever_scipy_is_finite():
    """Where scipy's noncentral t gives a number, the integral gives the same one (to 1e-12: the
    quadrature's tolerances and break points are what reach that precision)."""
    compared = 0
    for n in (*NS, 30, 200, 1000):
        for effect in (0.0, 0.01, 0.05, 0.2, 0.5, 1.0, 2.0, 4.0, 6.149, 10.0):
            for alpha in (0.01, 0.05, 0.5):
                crit, nc = st.t.ppf(1 - alpha / 2, n - 1), effect * math.sqrt(n)
                ref = st.nct.sf(crit, n - 1, nc) + st.nct.cdf(-crit, n - 1, nc)
                if np.isfinite(ref):
                    assert paired_t_power(n, effect, 1.0, alpha) == pytest.approx(ref, abs=1e-12), (n, effect, alpha)
                    compared += 1
    assert compared > 300


def test_paired_t_power_of_a_missing_effect_is_nan():
    assert math.isnan(paired_t_power(3, float("nan"), 1.0))
    assert math.isnan(paired_t_power(3, 0.5, float("nan")))
