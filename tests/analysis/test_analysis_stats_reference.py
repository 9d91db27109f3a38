"""Statistics over seeds (analysis.stats) against independent references and the edge cases a report hits.

References: scipy.stats.ttest_1samp / ttest_rel and the Student-t distribution (p-values, intervals);
the power of the two-sided paired t-test written here from the noncentral t distribution
(P(|T| > t_crit), T ~ nct(n - 1, delta sqrt(n) / sd)) and the smallest n found by scanning n = 2, 3, ...;
exact enumeration of sign patterns with rational arithmetic (sign-flip p-values); Holm's step-down
procedure on Holm (1979)-style examples; properties a p-value must have (0 <= p <= 1, scale invariance,
reproducibility, the (1 + hits) / (1 + resamples) granularity of a Monte Carlo p-value).
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats as st

from analysis.stats import (
    MeanCI,
    holm,
    paired_differences,
    paired_t_power,
    paired_t_pvalue,
    paired_test,
    seeds_needed,
    seeds_text,
    sign_flip_pvalue,
    t_interval,
)

# ----------------------------------------------------------------------------------------------------------------
# paired t-test p-values


@pytest.mark.parametrize(
    "diffs",
    [[0.1, 0.3], [-0.2, 0.05], [0.0, 1.0, 2.0], [0.02, -0.01, 0.03, 0.01], [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]],
)
def test_paired_t_pvalue_matches_scipy_ttest_from_two_pairs_on(diffs):
    """Two pairs already give a t-test (df = 1); [0, 1, 2] has a standard deviation of exactly 1."""
    expected = st.ttest_1samp(diffs, 0.0).pvalue
    assert paired_t_pvalue(diffs) == pytest.approx(expected, rel=1e-12, abs=1e-15)
    for alt in ("greater", "less"):
        assert paired_t_pvalue(diffs, alt) == pytest.approx(
            st.ttest_1samp(diffs, 0.0, alternative=alt).pvalue, rel=1e-12, abs=1e-15
        )


def test_paired_t_pvalue_edge_cases():
    assert math.isnan(paired_t_pvalue([0.3]))
    assert math.isnan(paired_t_pvalue([0.3, float("nan")]))
    # zero spread: every difference the same non-zero number is as significant as it gets; all zero is no effect
    assert paired_t_pvalue([0.25, 0.25, 0.25]) == 0.0
    assert paired_t_pvalue([-0.25, -0.25], "greater") == 1.0
    assert paired_t_pvalue([0.0, 0.0]) == 1.0


def test_p_values_stay_probabilities_when_the_mean_overflows():
    """Finite but huge differences (the mean overflows to inf): whatever comes out is still a probability."""
    with np.errstate(all="ignore"):
        p = paired_t_pvalue([1e308, 1.5e308, 1.7e308])
    assert 0.0 <= p <= 1.0


# ----------------------------------------------------------------------------------------------------------------
# paired_test / paired_differences


def test_paired_test_drops_seeds_missing_on_either_side():
    a = {0: 0.60, 1: 0.70, 2: 0.65, 3: float("nan"), 4: 0.8}
    b = {0: 0.50, 1: 0.55, 2: 0.60, 3: 0.40, 4: float("nan")}
    seeds, d = paired_differences(a, b)
    assert seeds == [0, 1, 2] and d == pytest.approx([0.10, 0.15, 0.05])
    res = paired_test(a, b)
    assert res.seeds == (0, 1, 2) and res.n == 3 and res.test == "t"
    assert res.p == pytest.approx(st.ttest_rel([0.60, 0.70, 0.65], [0.50, 0.55, 0.60]).pvalue, rel=1e-12)


def test_paired_differences_of_integer_metrics_are_floats():
    seeds, d = paired_differences({0: 3, 1: 5}, {0: 1, 1: 1})
    assert seeds == [0, 1] and d.dtype == np.float64 and list(d) == [2.0, 4.0]


def test_paired_test_interval_uses_the_requested_level():
    a, b = {0: 0.6, 1: 0.7, 2: 0.65, 3: 0.62}, {0: 0.5, 1: 0.55, 2: 0.6, 3: 0.6}
    d = np.array([0.1, 0.15, 0.05, 0.02])
    for level in (0.8, 0.9, 0.99):
        res = paired_test(a, b, level=level)
        half = st.t.ppf(0.5 + level / 2, 3) * d.std(ddof=1) / 2.0
        assert res.diff.level == level
        assert (res.diff.lo, res.diff.hi) == (pytest.approx(d.mean() - half), pytest.approx(d.mean() + half))


def test_paired_sign_flip_test_with_one_and_two_pairs():
    """One pair: no test (NaN). Two pairs with non-zero differences: 2 of the 4 sign patterns reach |mean|."""
    one = paired_test({0: 0.7, 1: 0.2}, {0: 0.5, 2: 0.1}, "sign_flip")
    assert one.n == 1 and math.isnan(one.p) and one.test == "sign_flip"
    two = paired_test({0: 0.7, 1: 0.9}, {0: 0.5, 1: 0.6}, "sign_flip")
    assert two.n == 2 and two.p == pytest.approx(0.5) and two.test == "sign_flip"
    with pytest.raises(ValueError):
        paired_test({0: 1.0}, {0: 0.0}, "wilcoxon")


# ----------------------------------------------------------------------------------------------------------------
# sign-flip permutation test


def _exact_sign_flip(d: list[Fraction], alternative: str = "two-sided") -> Fraction:
    """Share of all 2^n sign patterns whose mean reaches the observed one, in exact rational arithmetic."""
    n = len(d)
    observed = sum(d) / n
    hits = 0
    for signs in itertools.product((1, -1), repeat=n):
        m = sum(s * x for s, x in zip(signs, d)) / n
        if alternative == "two-sided":
            hits += abs(m) >= abs(observed)
        elif alternative == "greater":
            hits += m >= observed
        else:
            hits += m <= observed
    return Fraction(hits, 2**n)


def test_sign_flip_is_exact_up_to_16_pairs():
    """16 distinct positive differences: exactly the observed pattern and its mirror reach it, p = 2 / 2^16."""
    assert sign_flip_pvalue(np.arange(1.0, 17.0)) == 2 / 2**16
    assert sign_flip_pvalue(np.arange(1.0, 17.0), "greater") == 1 / 2**16


@pytest.mark.parametrize("alternative", ["two-sided", "greater", "less"])
def test_sign_flip_matches_exact_rational_enumeration_with_ties(alternative):
    """Ties between patterns (equal |differences|, a zero difference) count as reaching the observed mean."""
    for strs in (["0.5", "0.5", "-0.25", "0.25", "0"], ["1", "2", "-3", "0.5"], ["0.3", "-0.1", "-0.2", "0.6"]):
        exact = _exact_sign_flip([Fraction(s) for s in strs], alternative)
        assert sign_flip_pvalue([float(s) for s in strs], alternative) == pytest.approx(float(exact), abs=1e-15)


@pytest.mark.parametrize("scale", [1.0, 1000.0])
def test_sign_flip_counts_differences_within_the_relative_tolerance_as_ties(scale):
    """A difference of 1e-12 (relative to the largest) is float noise: the p-value is that of an exact zero.

    [0.875, 0] by enumeration: two-sided every pattern reaches 0.4375 (p = 1); greater: half of them (p = 1/2).
    The tie rule is inclusive at the tolerance (|mean| >= |observed| - 1e-12 max(1, max|d|)) and relative to the
    scale of the differences (the same case in units 1000 times larger gives the same p-values).
    """
    for tiny in (1e-12, 0.5e-12) if scale == 1.0 else (0.5e-12,):
        d = [0.875 * scale, tiny * 0.875 * scale if scale != 1.0 else tiny]
        assert sign_flip_pvalue(d) == 1.0
        assert sign_flip_pvalue(d, "greater") == 0.5
    assert float(_exact_sign_flip([Fraction(7, 8), Fraction(0)])) == 1.0


def test_sign_flip_monte_carlo_granularity_and_reproducibility():
    """Beyond 16 pairs: p = (1 + hits) / (1 + resamples), default 20000 resamples from seed 0 (reproducible)."""
    ones = np.ones(40)  # no random pattern of 40 signs is all + or all -: hits = 0, the smallest p
    assert sign_flip_pvalue(ones) == 1 / 20001
    assert sign_flip_pvalue(ones, n_resamples=999) == 1 / 1000
    rng = np.random.default_rng(11)
    d = rng.normal(0.1, 1.0, 20)
    p = sign_flip_pvalue(d)
    assert p == sign_flip_pvalue(d) == sign_flip_pvalue(d, seed=0, n_resamples=20000)
    assert abs(p * 20001 - round(p * 20001)) < 1e-6
    assert 0.05 < p < 0.95  # a p-value in the middle: any other seed would change it
    assert sign_flip_pvalue(d, seed=1) != p


def test_sign_flip_tiny_units():
    """Differences of order 1e-12: [4, 1.5] x 1e-12 keeps the p-value of [4, 1.5] (2 of 4 patterns reach it)."""
    assert sign_flip_pvalue([4.0, 1.5]) == 0.5
    assert sign_flip_pvalue([4e-12, 1.5e-12]) == 0.5


# ----------------------------------------------------------------------------------------------------------------
# Holm


def test_holm_caps_adjusted_p_values_at_one():
    """Holm: adjusted p_(i) = max_{j<=i} min(1, (m-j+1) p_(j)); three tests 0.2, 0.5, 0.9 -> 0.6, 1, 1."""
    assert list(holm([0.5, 0.2, 0.9])) == pytest.approx([1.0, 0.6, 1.0])
    assert np.all(holm([0.7, 0.8]) <= 1.0)


def test_holm_tied_p_values_get_the_same_adjusted_value():
    adj = holm([0.02, 0.01, 0.02, 0.02])
    assert list(adj) == pytest.approx([0.06, 0.04, 0.06, 0.06])


def test_holm_missing_p_values_as_none():
    """A missing comparison given as None behaves like NaN: kept missing and not counted in m."""
    adj = holm([0.01, None, 0.04])
    assert adj[0] == pytest.approx(0.02) and adj[2] == pytest.approx(0.04) and np.isnan(adj[1])


# ----------------------------------------------------------------------------------------------------------------
# power and seeds needed


def _power(n: int, delta: float, sd: float, alpha: float) -> float:
    """Two-sided paired t-test power: P(T > c) + P(T < -c), T ~ nct(n - 1, |delta| sqrt(n) / sd), c = t_{1-a/2}."""
    df = n - 1
    c = st.t.ppf(1 - alpha / 2, df)
    nc = abs(delta) * math.sqrt(n) / sd
    return float(st.nct.sf(c, df, nc) + st.nct.cdf(-c, df, nc))


def _seeds(delta: float, sd: float, alpha: float, power: float, n_max: int = 1000) -> int | None:
    """Smallest n >= 2 with power >= the target, by scanning n = 2, 3, ... (None beyond n_max)."""
    for n in range(2, n_max + 1):
        if _power(n, delta, sd, alpha) >= power:
            return n
    return None


@pytest.mark.parametrize(
    "n,delta,sd,alpha", [(2, 1.0, 1.0, 0.05), (5, 0.3, 0.5, 0.05), (12, -0.02, 0.04, 0.1), (30, 0.01, 0.05, 0.01)]
)
def test_paired_t_power_matches_the_noncentral_t(n, delta, sd, alpha):
    assert paired_t_power(n, delta, sd, alpha) == pytest.approx(_power(n, delta, sd, alpha), rel=1e-10)


def test_paired_t_power_edge_cases():
    # no effect: the two-sided test rejects with probability alpha (both tails count)
    for n in (2, 3, 10):
        assert paired_t_power(n, 0.0, 1.0, 0.05) == pytest.approx(0.05, rel=1e-9)
    assert paired_t_power(5, 0.1, 0.0) == 1.0
    assert paired_t_power(5, 0.0, 0.0, 0.05) == 0.05
    assert math.isnan(paired_t_power(1, 0.1, 1.0))


CASES = [
    # (delta, sd, alpha, power)
    (0.03, 0.04, 0.05, 0.8),
    (0.1, 0.05, 0.05, 0.8),
    (0.05, 0.2, 0.05, 0.8),
    (0.05, 0.2, 0.01, 0.8),
    (0.05, 0.2, 0.1, 0.9),
    (0.1, 0.3, 0.05, 0.2),  # low power target: the normal start overshoots when z_power < 0
    (0.3, 0.5, 0.5, 0.8),  # alpha 0.5: z_{1 - alpha/2} = 0.674
    (3.0, 2.0, 0.05, 0.8),  # large delta and sd (only their ratio matters)
    (30.0, 20.0, 0.05, 0.8),
    (1.0, 0.01, 0.05, 0.8),  # two seeds suffice
    (0.1, 0.81, 0.05, 0.04),  # target below alpha: two seeds suffice (the t-test is unbiased)
    (1e-4, 0.01, 0.5, 0.2),  # the same with a normal start far above the answer
    (0.1, 1.0, 0.05, 0.045),
]


@pytest.mark.parametrize("delta,sd,alpha,power", CASES)
def test_seeds_needed_is_the_smallest_n_reaching_the_power(delta, sd, alpha, power):
    expected = _seeds(delta, sd, alpha, power)
    assert expected is not None
    assert seeds_needed(delta, sd, alpha, power) == expected
    assert seeds_needed(-delta, sd, alpha, power) == expected
    # the answer is found even when it is exactly the cap (also where the normal start lies far above
    # it), and None when the cap is below it
    assert seeds_needed(delta, sd, alpha, power, n_max=expected) == expected
    if expected > 2:
        assert seeds_needed(delta, sd, alpha, power, n_max=expected - 1) is None


def test_seeds_needed_cap_above_the_answer_but_below_the_normal_start():
    """Target 0.045 < alpha: 2 seeds reach it (power 0.0500 at n = 2); the normal start is (0.265 / 0.001)^2 = 70000,
    above the cap (this returned None)."""
    assert _power(2, 0.001, 1.0, 0.05) >= 0.045
    assert seeds_needed(0.001, 1.0, power=0.045) == 2
    assert _power(2, 1e-4, 0.01, 0.5) >= 0.2  # alpha 0.5, target 0.2
    assert seeds_needed(1e-4, 0.01, 0.5, 0.2, n_max=2) == 2


@pytest.mark.parametrize("power,alpha", [(1.0, 0.05), (0.0, 0.05), (0.8, 0.0), (0.8, 1.0)])
def test_seeds_needed_rejects_power_or_alpha_outside_the_unit_interval(power, alpha):
    with pytest.raises(ValueError, match="power and alpha must be in"):
        seeds_needed(0.5, 1.0, alpha, power)


@pytest.mark.parametrize("delta,k,alpha", [(0.5, 10, 0.05), (0.1, 10, 0.05), (0.05, 4, 0.05), (0.2, 6, 0.1)])
def test_seeds_needed_inverts_the_power(delta, k, alpha):
    """The power k seeds give (as a target) needs exactly k seeds: 'power >= target' holds with equality at k."""
    target = paired_t_power(k, delta, 1.0, alpha)
    assert _power(k - 1, delta, 1.0, alpha) < target
    assert seeds_needed(delta, 1.0, alpha, target) == k


def test_seeds_needed_default_cap_is_1000():
    """delta = 0.08866, sd = 1: 1000 seeds give power < 0.8, 1001 give >= 0.8."""
    delta = 0.08866
    assert _power(1000, delta, 1.0, 0.05) < 0.8 <= _power(1001, delta, 1.0, 0.05)
    assert seeds_needed(delta, 1.0) is None
    assert seeds_needed(delta, 1.0, n_max=1001) == 1001


def test_seeds_needed_decreases_with_the_effect():
    ns = [seeds_needed(delta, 0.1) for delta in (0.02, 0.03, 0.05, 0.08, 0.13, 0.2, 0.5)]
    assert all(a >= b for a, b in zip(ns, ns[1:])) and ns[0] > ns[-1]
    assert ns == [_seeds(delta, 0.1, 0.05, 0.8) for delta in (0.02, 0.03, 0.05, 0.08, 0.13, 0.2, 0.5)]


# ----------------------------------------------------------------------------------------------------------------
# MeanCI.text


def test_mean_ci_text_formats():
    ci = t_interval([0.61, 0.58, 0.66])
    x = np.array([0.61, 0.58, 0.66])
    half = st.t.ppf(0.975, 2) * x.std(ddof=1) / math.sqrt(3)
    lo, hi = x.mean() - half, x.mean() + half
    # mean 0.6167, half width 4.303 * 0.0404 / sqrt(3) = 0.1003
    assert ci.text() == f"{x.mean():.3f} [{lo:.3f}, {hi:.3f}] (n=3)" == "0.617 [0.516, 0.717] (n=3)"
    assert ci.text(show_n=False) == "0.617 [0.516, 0.717]"
    assert ci.text(2, signed=True) == "+0.62 [+0.52, +0.72] (n=3)"
    assert t_interval([-0.5]).text(signed=True) == "-0.500 (n=1, no CI)"
    assert t_interval([0.5]).text(signed=True) == "+0.500 (n=1, no CI)"
    # a mean that is not finite has no text, whatever n says
    assert MeanCI(float("nan"), float("nan"), float("nan"), 3, float("nan")).text() == "–"


# ----------------------------------------------------------------------------------------------------------------
# t_interval: every field, at every n


def test_t_interval_fields_with_no_one_and_several_values():
    level = 0.9
    empty = t_interval([], level)
    assert empty.n == 0 and empty.level == level
    assert all(math.isnan(v) for v in (empty.mean, empty.lo, empty.hi, empty.std))
    one = t_interval([0.5, float("nan")], level)
    assert (one.n, one.mean, one.level) == (1, 0.5, level)
    assert all(math.isnan(v) for v in (one.lo, one.hi, one.std))
    x = [0.61, 0.58, 0.66, 0.7]
    several = t_interval(x, level)
    half = st.t.ppf(0.95, 3) * st.tstd(x) / 2.0
    assert (several.n, several.level) == (4, level)
    assert several.std == pytest.approx(st.tstd(x), rel=1e-12)
    assert several.mean == pytest.approx(np.mean(x), rel=1e-12)
    assert (several.lo, several.hi) == (pytest.approx(np.mean(x) - half), pytest.approx(np.mean(x) + half))


def test_t_interval_treats_none_as_missing():
    """Missing seeds given as None drop out like NaN."""
    ci = t_interval([0.5, None, 0.7])
    assert ci.n == 2 and ci.mean == pytest.approx(0.6)


def test_seeds_text():
    assert seeds_text(5, have=3) == "5"
    assert seeds_text(None, have=3) == "> 1000"
    assert seeds_text(None, have=3, n_max=50) == "> 50"
    assert seeds_text(5, have=1) == "–"
    assert seeds_text(5, have=2) == "5"  # two paired seeds give a variance


def test_paired_test_names_the_valid_tests():
    with pytest.raises(ValueError, match="test must be one of"):
        paired_test({0: 1.0, 1: 2.0}, {0: 0.5, 1: 1.0}, test="wilcoxon")


def test_seeds_needed_target_met_exactly_at_the_cap():
    """A target equal to the power n_max seeds give is met there ('power >= target'), also when the
    normal start lies above the cap."""
    target = paired_t_power(2, 1e-3, 1.0, 0.05)
    assert ((st.norm.ppf(0.975) + st.norm.ppf(target)) / 1e-3) ** 2 > 2
    assert seeds_needed(1e-3, 1.0, 0.05, target, n_max=2) == 2
