"""Statistics over seeds: t intervals, paired tests against a baseline, Holm-Bonferroni, seed counts.

Why: a sweep with one seed per method ranks noise (the same demo on another machine reordered the
methods). Every comparison a report prints therefore goes through these functions:

- ``t_interval``: mean and Student-t confidence interval over seeds (n stated; none for n < 2).
- ``paired_test``: each method against the sweep's baseline on the seeds both ran (paired by seed),
  either the paired t-test (default; its interval is the t interval of the differences, so
  "p < alpha" and "CI excludes 0" agree) or the exact sign-flip permutation test (all 2^n sign
  patterns of the differences; Monte Carlo beyond 16 pairs). The exact test needs no normality but
  cannot reach p < 0.05 two-sided with fewer than 6 pairs (its smallest p is 2 / 2^n).
- ``holm``: Holm-Bonferroni adjusted p-values over the comparisons of one table (step-down,
  controls the family-wise error rate; Holm 1979).
- ``seeds_needed``: smallest number of paired seeds whose paired t-test reaches the wanted power
  (default 0.8 at alpha 0.05, two-sided) for a difference ``delta`` with per-seed standard deviation
  ``sd`` of the differences (noncentral t power, integrated numerically: scipy's noncentral t CDF
  returns NaN for large effects; the observed difference or a stated minimal effect).

    from analysis.stats import t_interval, paired_test, holm
    t_interval([0.61, 0.58, 0.66]).text()            # '0.617 [0.516, 0.717] (n=3)'
    paired_test({0: 0.6, 1: 0.7}, {0: 0.5, 1: 0.55})  # PairedTest(n=2, mean=0.125, ...)
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import integrate as _integrate
from scipy import special as _special
from scipy import stats as _st

LEVEL = 0.95
ALPHA = 0.05
POWER = 0.8
# exact enumeration of the sign-flip test up to this many pairs (2^16 = 65536 patterns)
MAX_EXACT_PAIRS = 16
TESTS = ("t", "sign_flip")
TEST_NAMES = {"t": "paired t-test", "sign_flip": "exact sign-flip permutation test"}


@dataclass(frozen=True)
class MeanCI:
    """Mean over seeds with its t interval (lo, hi NaN when n < 2)."""

    mean: float
    lo: float
    hi: float
    n: int
    std: float
    level: float = LEVEL

    @property
    def has_interval(self) -> bool:
        return self.n >= 2 and np.isfinite(self.lo) and np.isfinite(self.hi)

    def text(self, digits: int = 3, signed: bool = False, show_n: bool = True) -> str:
        """'0.617 [0.516, 0.717] (n=3)'; '0.617 (n=1, no CI)'; '–' without values (``show_n=False``: no "(n=3)")."""
        if self.n == 0 or not np.isfinite(self.mean):
            return "–"
        f = f"{{:{'+' if signed else ''}.{digits}f}}"
        if not self.has_interval:
            return f"{f.format(self.mean)} (n={self.n}, no CI)"
        n = f" (n={self.n})" if show_n else ""
        return f"{f.format(self.mean)} [{f.format(self.lo)}, {f.format(self.hi)}]{n}"


def _finite(values: Sequence[float] | np.ndarray) -> np.ndarray:
    x = np.asarray(values, dtype=float).ravel()
    return x[np.isfinite(x)]


def t_interval(values: Sequence[float] | np.ndarray, level: float = LEVEL) -> MeanCI:
    """Mean and two-sided Student-t interval ``mean +- t_{(1+level)/2, n-1} s / sqrt(n)`` of the finite values."""
    x = _finite(values)
    n = len(x)
    if n == 0:
        return MeanCI(float("nan"), float("nan"), float("nan"), 0, float("nan"), level)
    mean = float(x.mean())
    if n < 2:
        return MeanCI(mean, float("nan"), float("nan"), 1, float("nan"), level)
    sd = float(x.std(ddof=1))
    half = float(_st.t.ppf(0.5 + level / 2.0, n - 1)) * sd / math.sqrt(n)
    return MeanCI(mean, mean - half, mean + half, n, sd, level)


def paired_differences(a: Mapping[int, float], b: Mapping[int, float]) -> tuple[list[int], np.ndarray]:
    """(seeds both have a finite value for, a[seed] - b[seed] on those seeds), seeds sorted."""
    seeds = sorted(s for s in set(a) & set(b) if np.isfinite(a[s]) and np.isfinite(b[s]))
    return seeds, np.array([a[s] - b[s] for s in seeds], dtype=float)


def paired_t_pvalue(diffs: Sequence[float] | np.ndarray, alternative: str = "two-sided") -> float:
    """p-value of the one-sample t-test of mean(diffs) = 0 (NaN for fewer than 2 differences).

    Zero spread: p = 1 when every difference is 0, else 0 (the differences are all the same non-zero number).
    """
    d = _finite(diffs)
    n = len(d)
    if n < 2:
        return float("nan")
    sd = float(d.std(ddof=1))
    mean = float(d.mean())
    if sd == 0.0:
        if mean == 0.0:
            return 1.0
        t = math.copysign(math.inf, mean)
    else:
        t = mean / (sd / math.sqrt(n))
    return _tail_p(t, n - 1, alternative)


def _tail_p(t: float, df: int, alternative: str) -> float:
    if alternative == "two-sided":
        return float(min(1.0, 2.0 * _st.t.sf(abs(t), df)))
    if alternative == "greater":
        return float(_st.t.sf(t, df))
    if alternative == "less":
        return float(_st.t.cdf(t, df))
    raise ValueError(f"alternative must be two-sided, greater or less, got {alternative!r}")


def sign_flip_pvalue(
    diffs: Sequence[float] | np.ndarray,
    alternative: str = "two-sided",
    max_exact: int = MAX_EXACT_PAIRS,
    n_resamples: int = 20000,
    seed: int = 0,
) -> float:
    """Sign-flip permutation test of a zero-centred symmetric distribution of paired differences.

    Statistic: the mean difference. Exact over all 2^n sign patterns for n <= ``max_exact`` (the
    observed pattern included, so p >= 2 / 2^n two-sided); beyond, ``n_resamples`` random patterns
    with the (1 + hits) / (1 + resamples) correction. NaN for no differences.
    """
    d = _finite(diffs)
    n = len(d)
    if n == 0:
        return float("nan")
    observed = float(d.mean())
    if n <= max_exact:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))  # [2^n, n]
    else:
        rng = np.random.default_rng(seed)
        signs = rng.choice((1.0, -1.0), size=(n_resamples, n))
    means = signs @ d / n
    tol = 1e-12 * max(1.0, float(np.abs(d).max()))
    if alternative == "two-sided":
        hits = np.abs(means) >= abs(observed) - tol
    elif alternative == "greater":
        hits = means >= observed - tol
    elif alternative == "less":
        hits = means <= observed + tol
    else:
        raise ValueError(f"alternative must be two-sided, greater or less, got {alternative!r}")
    if n <= max_exact:
        return float(hits.mean())
    return float((1 + hits.sum()) / (1 + n_resamples))


@dataclass(frozen=True)
class PairedTest:
    """A method minus its baseline on the seeds both ran: mean difference, its t interval, the p-value."""

    n: int
    diff: MeanCI
    p: float
    test: str  # "t" | "sign_flip"
    seeds: tuple[int, ...]


def paired_test(a: Mapping[int, float], b: Mapping[int, float], test: str = "t", level: float = LEVEL) -> PairedTest:
    """Paired comparison of ``a`` ({seed: value}) with ``b`` on their common seeds (two-sided)."""
    if test not in TESTS:
        raise ValueError(f"test must be one of {TESTS}, got {test!r}")
    seeds, d = paired_differences(a, b)
    p = paired_t_pvalue(d) if test == "t" else (sign_flip_pvalue(d) if len(d) >= 2 else float("nan"))
    return PairedTest(len(d), t_interval(d, level), p, test, tuple(seeds))


def holm(pvalues: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values (same order; NaN entries stay NaN and are not counted in m).

    Sorted ascending p_(1) <= ... <= p_(m): adjusted p_(i) = max_{j <= i} min(1, (m - j + 1) p_(j));
    rejecting where adjusted p <= alpha is Holm's step-down procedure at family-wise level alpha.
    """
    p = np.asarray(pvalues, dtype=float)
    out = np.full(p.shape, np.nan)
    idx = np.flatnonzero(np.isfinite(p))
    m = len(idx)
    if m == 0:
        return out
    order = idx[np.argsort(p[idx], kind="stable")]
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    out[order] = np.maximum.accumulate(scaled)
    return out


def paired_t_power(n: int, delta: float, sd: float, alpha: float = ALPHA) -> float:
    """Power of the two-sided paired t-test with ``n`` pairs for a true mean difference ``delta`` and
    per-pair standard deviation ``sd``: P(|T| > c), T ~ noncentral t(n - 1, nc = |delta| sqrt(n) / sd),
    c = t_{1 - alpha/2, n - 1}. Finite in [0, 1] for every n >= 2 (NaN for n < 2).

    Computed as an expectation over the sample standard deviation, not with ``scipy.stats.nct``: scipy's
    noncentral t CDF returns NaN at scattered points of its far lower tail once nc exceeds about 7.5
    (scipy 1.17: ``nct.cdf(-t_{0.975,1}, 1, 6.149 sqrt(2))``, the power of 2 seeds at delta / sd = 6.149),
    which made the power NaN exactly where it is large. With
    T = (Z + nc) / S, Z ~ N(0, 1) independent of S = sqrt(chi2_df / df),

        P(|T| > c) = E_S[ Phi(nc - c S) + Phi(-nc - c S) ],

    integrated numerically (``scipy.integrate.quad``) against the density of S,
    f(s) = 2 (df/2)^(df/2) / Gamma(df/2) s^(df-1) exp(-df s^2 / 2). Agrees with scipy's nct wherever
    scipy's value is finite: to 1e-13 up to n = 1000, 1e-10 at n = 100000.
    """
    if n < 2 or math.isnan(delta) or math.isnan(sd):
        return float("nan")
    if sd <= 0:
        return 1.0 if delta != 0 else alpha
    df = n - 1
    crit = float(_st.t.ppf(1.0 - alpha / 2.0, df))
    nc = abs(delta) * math.sqrt(n) / sd
    return _power_integral(df, crit, nc)


def _power_integral(df: int, crit: float, nc: float) -> float:
    """E_S[Phi(nc - crit S) + Phi(-nc - crit S)], S = sqrt(chi2_df / df) (see ``paired_t_power``)."""
    log_k = math.log(2.0) + 0.5 * df * math.log(0.5 * df) - float(_special.gammaln(0.5 * df))

    def integrand(s: float) -> float:
        if s <= 0.0:
            dens = math.exp(log_k) if df == 1 else 0.0
        else:
            dens = math.exp(log_k + (df - 1) * math.log(s) - 0.5 * df * s * s)
        return dens * float(_special.ndtr(nc - crit * s) + _special.ndtr(-nc - crit * s))

    # S beyond s_hi has probability 1e-18; the break points are the mode of S and where Phi(nc - c S) falls
    s_hi = math.sqrt(float(_st.chi2.isf(1e-18, df)) / df)
    points = [p for p in (math.sqrt(max(df - 1, 0) / df), 1.0, nc / crit) if 0.0 < p < s_hi]
    value, _ = _integrate.quad(integrand, 0.0, s_hi, points=points or None, epsabs=1e-15, epsrel=1e-12, limit=200)
    return float(np.clip(value, 0.0, 1.0))  # quadrature error can step outside [0, 1] by ~1e-13


def seeds_needed(delta: float, sd: float, alpha: float = ALPHA, power: float = POWER, n_max: int = 1000) -> int | None:
    """Smallest n >= 2 with ``paired_t_power(n, delta, sd, alpha) >= power``; None if above ``n_max``
    (or if delta or sd are not finite, or delta is 0). ``power`` and ``alpha`` must be in (0, 1).
    A power that is not a number never counts as reaching the target."""
    if not (0 < power < 1 and 0 < alpha < 1):
        raise ValueError(f"seeds_needed: power and alpha must be in (0, 1), got power={power!r}, alpha={alpha!r}")
    if not (np.isfinite(delta) and np.isfinite(sd)) or delta == 0:
        return None
    if sd == 0:
        return 2

    def reaches(k: int) -> bool:
        return bool(paired_t_power(k, delta, sd, alpha) >= power)  # False for NaN

    # normal approximation as the starting point, then walk to the exact noncentral-t answer; the
    # start can overshoot (a target power near alpha): then the answer is at most n_max exactly when
    # n_max seeds reach the target (power grows with n), and the walk starts there
    z = _st.norm.ppf(1 - alpha / 2) + _st.norm.ppf(power)
    start = (z * sd / abs(delta)) ** 2
    if start > n_max:
        if not reaches(n_max):
            return None
        start = n_max
    n = max(2, int(math.floor(start)))
    while n > 2 and reaches(n - 1):
        n -= 1
    while not reaches(n):
        n += 1
        if n > n_max:
            return None
    return n


def seeds_text(n: int | None, have: int, n_max: int = 1000) -> str:
    """'5', '> 1000', or '–' when the variance is unknown (fewer than 2 paired seeds)."""
    if have < 2:
        return "–"
    if n is None:
        return f"> {n_max}"
    return str(n)
