"""Statistics over seeds (analysis.stats) against computations that share nothing with it: Student's t
distribution integrated numerically from its density (no scipy), brute-force enumeration of sign
patterns with itertools loops, Holm's step-down rule applied literally, and simulations of coverage,
type-I error and power."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from analysis.stats import (
    holm,
    paired_t_power,
    paired_t_pvalue,
    paired_test,
    seeds_needed,
    sign_flip_pvalue,
    t_interval,
)


def _t_cdf(x: float, df: int, n: int = 20001) -> float:
    """Student-t CDF by Simpson's rule on the density Γ((ν+1)/2) / (√(νπ) Γ(ν/2)) (1 + t²/ν)^(-(ν+1)/2)."""
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
    a = abs(x)
    if a == 0:
        return 0.5
    # substitute t = tan(u) so that the heavy tails of small df integrate on a finite interval
    u = np.linspace(0.0, math.atan(a), n)
    t = np.tan(u)
    f = c * (1 + t * t / df) ** (-(df + 1) / 2) / np.cos(u) ** 2
    h = u[1] - u[0]
    integral = h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())
    return 0.5 + math.copysign(integral, x)


def _t_quantile(q: float, df: int) -> float:
    lo, hi = 0.0, 1000.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_cdf(mid, df) < q else (lo, mid)
    return (lo + hi) / 2


@pytest.mark.parametrize("values", [[0.61, 0.58, 0.66], [1.0, 2.0], [0.3, 0.31, 0.29, 0.35, 0.33, 0.2]])
def test_t_interval_matches_the_integrated_t_density(values):
    ci = t_interval(values)
    x = np.asarray(values)
    n = len(x)
    half = _t_quantile(0.975, n - 1) * x.std(ddof=1) / math.sqrt(n)
    assert (ci.n, ci.mean) == (n, pytest.approx(x.mean()))
    assert ci.lo == pytest.approx(x.mean() - half, rel=1e-6)
    assert ci.hi == pytest.approx(x.mean() + half, rel=1e-6)


def test_t_interval_with_one_seed_has_no_interval_and_says_so():
    ci = t_interval([0.5, float("nan")])
    assert ci.n == 1 and not ci.has_interval and ci.text() == "0.500 (n=1, no CI)"
    assert t_interval([]).text() == "–"


def test_t_interval_covers_the_true_mean_95_percent_of_the_time():
    """4000 experiments of 3 normal seeds: the 95% interval covers the true mean 95% +- 3 standard errors."""
    rng = np.random.default_rng(1)
    samples = rng.normal(0.4, 0.05, size=(4000, 3))
    covered = [t_interval(s).lo <= 0.4 <= t_interval(s).hi for s in samples]
    se = math.sqrt(0.95 * 0.05 / 4000)
    assert abs(np.mean(covered) - 0.95) < 3 * se


@pytest.mark.parametrize("diffs", [[0.1, 0.15, 0.05], [0.02, -0.01, 0.03, 0.01], [1.0, -2.0, 0.5, 0.25, 0.1]])
def test_paired_t_pvalue_matches_the_integrated_t_density(diffs):
    d = np.asarray(diffs)
    n = len(d)
    t = d.mean() / (d.std(ddof=1) / math.sqrt(n))
    expected = 2 * (1 - _t_cdf(abs(t), n - 1))
    assert paired_t_pvalue(d) == pytest.approx(expected, rel=1e-6, abs=1e-9)
    assert paired_t_pvalue(d, "greater") == pytest.approx(1 - _t_cdf(t, n - 1), rel=1e-6, abs=1e-9)


def test_paired_t_rejects_at_the_nominal_rate_under_the_null():
    rng = np.random.default_rng(2)
    p = np.array([paired_t_pvalue(rng.normal(0, 1, 4)) for _ in range(4000)])
    se = math.sqrt(0.05 * 0.95 / 4000)
    assert abs((p <= 0.05).mean() - 0.05) < 3 * se


def _brute_force_sign_flip(d: list[float]) -> float:
    """Literal definition: over every sign pattern, the share whose |mean| reaches the observed |mean|."""
    observed = abs(sum(d) / len(d))
    hits = total = 0
    for signs in itertools.product((1, -1), repeat=len(d)):
        m = abs(sum(s * x for s, x in zip(signs, d)) / len(d))
        hits += m >= observed - 1e-12
        total += 1
    return hits / total


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 11])
def test_sign_flip_matches_brute_force_enumeration(n):
    rng = np.random.default_rng(n)
    d = list(rng.normal(0.3, 1.0, n))
    assert sign_flip_pvalue(d) == pytest.approx(_brute_force_sign_flip(d), abs=1e-12)


def test_sign_flip_smallest_p_is_two_over_two_to_the_n():
    """All differences positive: only the observed pattern and its mirror reach the statistic."""
    for n in (3, 5, 6):
        assert sign_flip_pvalue(np.arange(1.0, n + 1)) == pytest.approx(2 / 2**n)
    assert sign_flip_pvalue([1.0, 2.0, 3.0], "greater") == pytest.approx(1 / 8)


def test_sign_flip_monte_carlo_beyond_the_exact_limit_agrees_with_enumeration():
    rng = np.random.default_rng(7)
    d = rng.normal(0.25, 1.0, 18)
    exact = sign_flip_pvalue(d, max_exact=18)
    approx = sign_flip_pvalue(d, max_exact=16, n_resamples=40000)
    assert abs(approx - exact) < 4 * math.sqrt(exact * (1 - exact) / 40000) + 1e-4


def test_paired_test_pairs_by_seed_and_ignores_unmatched_seeds():
    a = {0: 0.60, 1: 0.70, 2: 0.65, 5: 0.9}
    b = {0: 0.50, 1: 0.55, 2: 0.60, 3: 0.1}
    res = paired_test(a, b)
    assert res.seeds == (0, 1, 2) and res.n == 3
    assert res.diff.mean == pytest.approx(np.mean([0.10, 0.15, 0.05]))
    assert res.p == pytest.approx(paired_t_pvalue([0.10, 0.15, 0.05]))
    assert paired_test(a, b, "sign_flip").p == pytest.approx(0.25)


def _holm_rejections(p: list[float], alpha: float) -> set[int]:
    """Holm (1979) step-down: walk the sorted p-values, reject while p_(k) <= alpha / (m - k + 1)."""
    order = sorted(range(len(p)), key=lambda i: p[i])
    rejected = set()
    for k, i in enumerate(order):
        if p[i] > alpha / (len(p) - k):
            break
        rejected.add(i)
    return rejected


def test_holm_adjusted_p_values_reproduce_the_step_down_procedure():
    rng = np.random.default_rng(3)
    for _ in range(300):
        p = list(rng.uniform(0, 0.2, rng.integers(1, 9)) ** 2)
        adj = holm(p)
        for alpha in (0.01, 0.05, 0.1):
            assert {i for i, a in enumerate(adj) if a <= alpha} == _holm_rejections(p, alpha)


def test_holm_textbook_example_and_nans():
    # four tests at alpha 0.05: 0.005 and 0.01 are rejected (<= 0.0125, <= 0.0167); 0.03 > 0.025 stops
    adj = holm([0.01, 0.04, 0.03, 0.005, float("nan")])
    assert adj[:4] == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert np.isnan(adj[4])


def _simulated_power(n: int, delta: float, sd: float, reps: int, rng) -> float:
    d = rng.normal(delta, sd, size=(reps, n))
    t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(n))
    return float((np.abs(t) > _t_quantile(0.975, n - 1)).mean())


@pytest.mark.parametrize("delta,sd", [(0.03, 0.04), (0.1, 0.05), (0.02, 0.05)])
def test_seeds_needed_reaches_80_percent_power_in_simulation(delta, sd):
    """The suggested n reaches 80% power in 6000 simulated experiments and n - 1 does not (+- 3 se)."""
    rng = np.random.default_rng(4)
    n = seeds_needed(delta, sd)
    assert n is not None and n >= 2
    se = math.sqrt(0.8 * 0.2 / 6000)
    assert _simulated_power(n, delta, sd, 6000, rng) > 0.8 - 3 * se
    assert abs(_simulated_power(n, delta, sd, 6000, rng) - paired_t_power(n, delta, sd)) < 3.5 * se
    if n > 2:
        assert _simulated_power(n - 1, delta, sd, 6000, rng) < 0.8 + 3 * se


def test_seeds_needed_edge_cases():
    assert seeds_needed(0.0, 0.1) is None  # no difference: no finite n
    assert seeds_needed(0.001, 1.0, n_max=1000) is None
    assert seeds_needed(0.1, 0.0) == 2
    assert seeds_needed(float("nan"), 0.1) is None
