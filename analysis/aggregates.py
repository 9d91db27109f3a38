"""Aggregate statistics over runs and tasks, after Agarwal et al., "Deep Reinforcement Learning at the Edge of
the Statistical Precipice" (NeurIPS 2021, arXiv 2108.13264): IQM and mean, stratified-bootstrap confidence
intervals, probability of improvement and performance profiles. numpy only (the ``rliable`` package that
implements the paper does not import with pandas 3: its dependency ``arch`` < 8 calls a changed pandas API).

Scores: one method's scores are a [runs, tasks] array, or a sequence of 1-D arrays, one per task, when tasks
have different numbers of runs (each task's runs are its own stratum). Every value must be finite.

Conventions (each as in the paper and its reference implementation, ``rliable``):
- *IQM* (section 4.3): the 25% trimmed mean of all runs' scores pooled over tasks. For N pooled scores,
  ``floor(0.25 N)`` scores are dropped at each end (``scipy.stats.trim_mean``'s convention, which ``rliable``
  calls; no fractional weights): N = 6 drops one score at each end and averages the middle four.
- *mean* (section 4.3): the mean over tasks of each task's mean score (the pooled mean when every task has
  the same number of runs).
- *stratified bootstrap* (section 4.1): a resample draws, for each task independently, that task's number of
  runs with replacement from its runs; the statistic is recomputed on every resample and the interval is
  the percentile interval ``np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])`` (linear interpolation).
  Random stream (so a test can replay it): ``rng = np.random.default_rng(seed)``; then, task after task in
  order, ``rng.integers(0, n_task, size=(reps, n_task))`` (for two methods: X's draw, then Y's, per task).
- *probability of improvement* (section 4.3): P(X > Y) = (1/M) sum over tasks m of
  (1 / (N_m K_m)) sum_i sum_j S(x_{m,i}, y_{m,j}), S = 1 if x > y, 1/2 if x = y, 0 otherwise: per task the
  Mann-Whitney U statistic of X over Y divided by N_m K_m, averaged over the M tasks. Its interval resamples
  X's and Y's runs independently within each task (``rliable``'s StratifiedIndependentBootstrap).
- *performance profile* (section 4.2, run-score distribution): F(tau) = (1/M) sum_m (1/N_m) sum_n
  1[x_{m,n} > tau], the fraction of runs scoring above tau (per task, averaged over tasks), with pointwise
  stratified-bootstrap bands.

Caveat on few runs: the percentile bootstrap of a statistic over 3 runs of one task cannot see the spread
it did not sample, and its 95% intervals cover the true value far less often than 95% (Monte Carlo with
normal scores, tests/analysis/test_analysis_aggregates.py: about 74% at 3 runs, 83% at 5, 90% at 10; 94% for
10 runs on each of 5 tasks).

    from analysis.aggregates import iqm, interval_estimate, probability_of_improvement
    est, lo, hi = interval_estimate(scores, iqm)              # scores: [runs, tasks]
    p, lo, hi = probability_of_improvement(scores_x, scores_y)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

DEFAULT_REPS = 2000
DEFAULT_LEVEL = 0.95
TRIM = 0.25

Scores = np.ndarray | Sequence[np.ndarray]


def as_tasks(scores: Scores) -> list[np.ndarray]:
    """One 1-D float array of runs per task: a numpy array is [runs, tasks] (1-D: one task); any other
    sequence holds one array of runs per task (tasks may have different numbers of runs)."""
    if isinstance(scores, np.ndarray):
        arr = scores.astype(float)
        arr = arr[:, None] if arr.ndim == 1 else arr
        if arr.ndim != 2:
            raise ValueError(f"scores must be [runs, tasks], got shape {arr.shape}")
        tasks = [arr[:, j] for j in range(arr.shape[1])]
    else:
        tasks = [np.asarray(t, dtype=float).ravel() for t in scores]
    if not tasks or any(t.size == 0 for t in tasks):
        raise ValueError("scores need at least one task with at least one run")
    if not all(np.isfinite(t).all() for t in tasks):
        raise ValueError("scores must be finite (drop missing runs first)")
    return tasks


def trimmed_mean(x: np.ndarray, proportion: float = TRIM) -> float:
    """Mean of ``x`` after dropping ``floor(proportion * len(x))`` values at each end (see module docstring)."""
    s = np.sort(np.asarray(x, dtype=float).ravel())
    k = int(np.floor(proportion * s.size))
    return float(np.mean(s[k : s.size - k]))


def iqm(scores: Scores) -> float:
    """Interquartile mean (arXiv 2108.13264, section 4.3): the mean of the middle 50% of all runs' scores
    pooled over tasks (25% trimmed mean, ``floor(N / 4)`` dropped at each end)."""
    return trimmed_mean(np.concatenate(as_tasks(scores)))


def mean(scores: Scores) -> float:
    """Mean score (arXiv 2108.13264, section 4.3): the mean over tasks of each task's mean over runs."""
    return float(np.mean([t.mean() for t in as_tasks(scores)]))


def _batched_iqm(pooled: np.ndarray) -> np.ndarray:
    """IQM of every row of [reps, N]."""
    s = np.sort(pooled, axis=1)
    k = int(np.floor(TRIM * s.shape[1]))
    return s[:, k : s.shape[1] - k].mean(axis=1)


def _batched_mean(per_task: list[np.ndarray]) -> np.ndarray:
    return np.mean([t.mean(axis=1) for t in per_task], axis=0)


def percentile_interval(stats: np.ndarray, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
    """Percentile interval of bootstrap statistics (linear interpolation between order statistics)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    lo, hi = np.quantile(np.asarray(stats, dtype=float), [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return float(lo), float(hi)


def stratified_resamples(scores: Scores, reps: int = DEFAULT_REPS, seed: int = 0, rng=None) -> list[np.ndarray]:
    """Stratified bootstrap (arXiv 2108.13264, section 4.1): per task, a [reps, n_task] array of that task's
    runs drawn with replacement, tasks drawn in order from ``rng`` (default ``np.random.default_rng(seed)``)."""
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    rng = np.random.default_rng(seed) if rng is None else rng
    return [t[rng.integers(0, t.size, size=(reps, t.size))] for t in as_tasks(scores)]


# the statistics ``interval_estimate`` knows how to compute on all resamples at once
_BATCHED: dict[Callable, Callable[[list[np.ndarray]], np.ndarray]] = {
    iqm: lambda per_task: _batched_iqm(np.concatenate(per_task, axis=1)),
    mean: _batched_mean,
}


def bootstrap_stats(
    scores: Scores, statistic: Callable[[Scores], float] = iqm, reps: int = DEFAULT_REPS, seed: int = 0
) -> np.ndarray:
    """``statistic`` on each of ``reps`` stratified resamples of ``scores``: [reps]."""
    per_task = stratified_resamples(scores, reps, seed)
    batched = _BATCHED.get(statistic)
    if batched is not None:
        return batched(per_task)
    return np.array([statistic([t[b] for t in per_task]) for b in range(reps)])


def interval_estimate(
    scores: Scores,
    statistic: Callable[[Scores], float] = iqm,
    reps: int = DEFAULT_REPS,
    level: float = DEFAULT_LEVEL,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(point estimate, lower, upper): ``statistic`` (``iqm``, ``mean`` or any function of per-task runs) of
    ``scores`` and its stratified-bootstrap percentile interval (arXiv 2108.13264, section 4.1)."""
    lo, hi = percentile_interval(bootstrap_stats(scores, statistic, reps, seed), level)
    return float(statistic(scores)), lo, hi


def _task_poi(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Mann-Whitney P(X > Y) + P(X = Y) / 2 over the last axis pairs: x [..., N], y [..., K] -> [...]."""
    diff = x[..., :, None] - y[..., None, :]
    return ((diff > 0).sum(axis=(-2, -1)) + 0.5 * (diff == 0).sum(axis=(-2, -1))) / (x.shape[-1] * y.shape[-1])


def probability_of_improvement(
    scores_x: Scores,
    scores_y: Scores,
    reps: int = DEFAULT_REPS,
    level: float = DEFAULT_LEVEL,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(P(X > Y), lower, upper): the probability that a run of method X scores above a run of method Y on
    a task drawn at random (arXiv 2108.13264, section 4.3; ties count one half), and its stratified
    bootstrap interval (X's and Y's runs resampled independently within each task; stream in the module
    docstring). 0.5: no improvement; an interval excluding 0.5 says X and Y differ."""
    xs, ys = as_tasks(scores_x), as_tasks(scores_y)
    if len(xs) != len(ys):
        raise ValueError(f"X has {len(xs)} tasks and Y {len(ys)}: the tasks must be the same")
    point = float(np.mean([_task_poi(x, y) for x, y in zip(xs, ys)]))
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    rng = np.random.default_rng(seed)
    per_task = []
    for x, y in zip(xs, ys):
        bx = x[rng.integers(0, x.size, size=(reps, x.size))]
        by = y[rng.integers(0, y.size, size=(reps, y.size))]
        per_task.append(_task_poi(bx, by))
    lo, hi = percentile_interval(np.mean(per_task, axis=0), level)
    return point, lo, hi


def _profile(per_task: list[np.ndarray], taus: np.ndarray) -> np.ndarray:
    """Fraction of runs > tau per task, averaged over tasks: per_task [..., n] -> [..., n_tau]."""
    return np.mean([(t[..., None] > taus).mean(axis=-2) for t in per_task], axis=0)


def performance_profile(
    scores: Scores,
    taus: np.ndarray | Sequence[float],
    reps: int = DEFAULT_REPS,
    level: float = DEFAULT_LEVEL,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(profile, lower, upper), each [len(taus)]: the run-score distribution F(tau) = fraction of runs with
    score > tau (per task, averaged over tasks; arXiv 2108.13264, section 4.2) and its pointwise
    stratified-bootstrap percentile band."""
    tasks = as_tasks(scores)
    taus = np.asarray(taus, dtype=float).ravel()
    point = _profile([t[None, :] for t in tasks], taus)[0]
    boot = _profile(stratified_resamples(tasks, reps, seed), taus)  # [reps, n_tau]
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    lo, hi = np.quantile(boot, [(1.0 - level) / 2.0, (1.0 + level) / 2.0], axis=0)
    return point, lo, hi
