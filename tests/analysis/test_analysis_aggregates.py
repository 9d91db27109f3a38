"""IQM, mean, probability of improvement, stratified bootstrap and performance profiles (arXiv 2108.13264)
against independent computations.

References: ``scipy.stats.trim_mean`` (IQM), hand-worked trimmed means (fractional trimming: floor(N/4)
dropped at each end, scipy's and rliable's convention), ``scipy.stats.mannwhitneyu``'s U statistic divided by
n*m (probability of improvement), plain-Python double loops over resamples and tasks replaying the documented
random stream with hand-written percentiles (bootstrap intervals and bands), direct counts (performance
profile), and Monte Carlo coverage of known means over synthetic data sets (the bootstrap's statistical
properties). The table is checked on a synthetic sweep against the curves ``analysis.synthetic`` generated.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis import aggregates as agg
from analysis.synthetic import SyntheticSpec, _m, synthetic_data
from analysis.tables.aggregates import SMALL_N_COVERAGE, aggregate_table
from runners import metric_names


# --- IQM and mean ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(4, 1), (8, 3), (12, 5), (10, 2), (3, 4)])
def test_iqm_matches_scipy_trim_mean_when_n_is_divisible_by_4(shape):
    x = np.random.default_rng(sum(shape)).normal(size=shape)
    assert x.size % 4 == 0
    assert agg.iqm(x) == pytest.approx(stats.trim_mean(x.ravel(), 0.25), abs=1e-12)
    assert agg.mean(x) == pytest.approx(x.mean(), abs=1e-12)


def test_iqm_non_divisible_sizes_by_hand():
    """Convention: floor(0.25 N) scores dropped at each end, no fractional weights."""
    # N = 6: floor(1.5) = 1 dropped at each end -> mean(1, 2, 4, 8) = 3.75
    # (fractional trimming of 1.5 per end would weight 1 and 8 by one half: (0.5 + 2 + 4 + 4) / 3 = 3.5)
    assert agg.iqm(np.array([[16.0, 0.0, 4.0], [1.0, 8.0, 2.0]])) == 3.75
    # N = 7: floor(1.75) = 1 -> mean(1, 2, 3, 4, 5) = 3.0
    assert agg.iqm([np.array([100.0, 0.0, 3.0]), np.array([1.0, 2.0, 4.0, 5.0])]) == 3.0
    # N = 3: floor(0.75) = 0 -> plain mean
    assert agg.iqm(np.array([1.0, 2.0, 9.0])) == 4.0
    for x, hand in (([0, 1, 2, 4, 8, 16], 3.75), ([0, 1, 2, 3, 4, 5, 100], 3.0)):
        assert stats.trim_mean(x, 0.25) == hand  # scipy follows the same convention


def test_mean_averages_per_task_means():
    """Task 1 mean 0.5, task 2 mean 1.0 -> 0.75 (the pooled mean of the six runs would be 5/6)."""
    assert agg.mean([np.array([0.0, 1.0]), np.array([1.0, 1.0, 1.0, 1.0])]) == 0.75


def test_bad_scores_are_rejected():
    with pytest.raises(ValueError, match="finite"):
        agg.iqm(np.array([[1.0], [np.nan]]))
    with pytest.raises(ValueError, match="tasks"):
        agg.probability_of_improvement(np.zeros((3, 2)), np.zeros((3, 1)))
    with pytest.raises(ValueError, match="at least one"):
        agg.mean([np.array([])])


# --- probability of improvement ---------------------------------------------------------------------------
def test_probability_of_improvement_matches_mann_whitney_u():
    rng = np.random.default_rng(3)
    xs = [rng.integers(0, 5, size=n).astype(float) for n in (4, 7, 3)]  # ties on purpose
    ys = [rng.integers(0, 5, size=n).astype(float) for n in (5, 2, 6)]
    expected = np.mean([stats.mannwhitneyu(x, y).statistic / (len(x) * len(y)) for x, y in zip(xs, ys)])
    p, lo, hi = agg.probability_of_improvement(xs, ys, reps=200)
    assert p == pytest.approx(expected, abs=1e-12)
    assert lo <= p <= hi
    assert agg.probability_of_improvement(ys, xs, reps=10)[0] == pytest.approx(1 - expected, abs=1e-12)


def test_probability_of_improvement_detects_a_real_difference_and_not_a_null_one():
    rng = np.random.default_rng(11)
    y = rng.normal(size=(10, 5))
    better = rng.normal(loc=1.0, size=(10, 5))  # one standard deviation better on every task
    same = rng.normal(size=(10, 5))
    p, lo, hi = agg.probability_of_improvement(better, y)
    assert lo > 0.5 and p > 0.7
    p0, lo0, hi0 = agg.probability_of_improvement(same, y)
    assert lo0 < 0.5 < hi0


# --- stratified bootstrap: the same random stream replayed by plain loops ----------------------------------
def _percentile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default quantile), by hand."""
    s = sorted(values)
    h = (len(s) - 1) * q
    i = math.floor(h)
    return s[i] if i + 1 >= len(s) else s[i] + (h - i) * (s[i + 1] - s[i])


def _loop_iqm(pooled: list[float]) -> float:
    s = sorted(pooled)
    k = len(s) // 4
    kept = s[k : len(s) - k]
    return sum(kept) / len(kept)


TASKS = [np.array([0.1, 0.5, 0.2, 0.9, 0.4]), np.array([0.3, 0.8, 0.6]), np.array([0.7, 0.2, 0.25, 0.5, 0.1, 0.0])]


@pytest.mark.parametrize("which", ["iqm", "mean"])
def test_stratified_bootstrap_matches_a_double_loop_on_the_same_stream(which):
    reps, seed, level = 300, 7, 0.9
    rng = np.random.default_rng(seed)
    draws = [rng.integers(0, t.size, size=(reps, t.size)).tolist() for t in TASKS]  # the documented stream
    boot = []
    for b in range(reps):
        resampled = [[float(TASKS[j][i]) for i in draws[j][b]] for j in range(len(TASKS))]
        if which == "iqm":
            boot.append(_loop_iqm([v for task in resampled for v in task]))
        else:
            boot.append(sum(sum(task) / len(task) for task in resampled) / len(resampled))
    statistic = agg.iqm if which == "iqm" else agg.mean
    est, lo, hi = agg.interval_estimate(TASKS, statistic, reps=reps, level=level, seed=seed)
    assert est == pytest.approx(statistic(TASKS), abs=1e-15)
    assert lo == pytest.approx(_percentile(boot, 0.05), abs=1e-12)
    assert hi == pytest.approx(_percentile(boot, 0.95), abs=1e-12)
    # any other statistic goes through the generic (one resample at a time) path: same numbers
    generic = agg.interval_estimate(TASKS, lambda s: statistic(list(s)), reps=reps, level=level, seed=seed)
    assert generic == pytest.approx((est, lo, hi), abs=1e-12)


def test_probability_of_improvement_bootstrap_matches_a_double_loop():
    ys = [t[::-1] + 0.05 for t in TASKS]
    reps, seed = 250, 3
    rng = np.random.default_rng(seed)
    draws = []
    for x, y in zip(TASKS, ys):  # per task: X's draw, then Y's
        draws.append(
            (
                rng.integers(0, x.size, size=(reps, x.size)).tolist(),
                rng.integers(0, y.size, size=(reps, y.size)).tolist(),
            )
        )
    boot = []
    for b in range(reps):
        per_task = []
        for (dx, dy), x, y in zip(draws, TASKS, ys):
            xb, yb = [x[i] for i in dx[b]], [y[i] for i in dy[b]]
            score = sum(1.0 if u > v else 0.5 if u == v else 0.0 for u in xb for v in yb)
            per_task.append(score / (len(xb) * len(yb)))
        boot.append(sum(per_task) / len(per_task))
    _, lo, hi = agg.probability_of_improvement(TASKS, ys, reps=reps, seed=seed)
    assert (lo, hi) == pytest.approx((_percentile(boot, 0.025), _percentile(boot, 0.975)), abs=1e-12)


# --- performance profiles ---------------------------------------------------------------------------------
def test_performance_profile_matches_a_direct_count_and_its_band_a_loop():
    taus = np.array([-0.1, 0.0, 0.1, 0.2, 0.25, 0.5, 0.55, 0.8, 1.0])  # several equal to a score: > not >=
    reps, seed = 200, 5
    point, lo, hi = agg.performance_profile(TASKS, taus, reps=reps, seed=seed)
    direct = [sum(sum(1 for v in t if v > tau) / len(t) for t in TASKS) / len(TASKS) for tau in taus]
    assert point == pytest.approx(direct, abs=1e-12)
    assert point[0] == 1.0 and point[-1] == 0.0 and np.all(np.diff(point) <= 0)
    rng = np.random.default_rng(seed)
    draws = [rng.integers(0, t.size, size=(reps, t.size)).tolist() for t in TASKS]
    for k, tau in enumerate(taus):
        boot = [
            sum(sum(1 for i in draws[j][b] if TASKS[j][i] > tau) / TASKS[j].size for j in range(len(TASKS)))
            / len(TASKS)
            for b in range(reps)
        ]
        assert (lo[k], hi[k]) == pytest.approx((_percentile(boot, 0.025), _percentile(boot, 0.975)), abs=1e-12)


# --- statistical properties: Monte Carlo coverage of a known mean ------------------------------------------
def _coverage(n_runs: int, n_tasks: int, datasets: int, statistic=agg.mean, reps: int = 400) -> float:
    rng = np.random.default_rng(1000 * n_runs + n_tasks)
    hits = 0
    for d in range(datasets):
        scores = rng.normal(size=(n_runs, n_tasks))  # true mean and IQM of the distribution: 0
        _, lo, hi = agg.interval_estimate(scores, statistic, reps=reps, seed=d)
        hits += lo <= 0.0 <= hi
    return hits / datasets


def test_stratified_bootstrap_covers_a_known_mean_at_the_nominal_level():
    """10 runs x 5 tasks of N(0, 1): the 95% interval of the mean and of the IQM contains 0 in 95% +- 4% of
    400 data sets (Monte Carlo sd ~1.1%; the percentile bootstrap's own bias at 10 runs, ~ -1.5%, included)."""
    assert abs(_coverage(10, 5, 400) - 0.95) <= 0.04
    assert abs(_coverage(10, 5, 400, agg.iqm) - 0.95) <= 0.04


def test_few_runs_under_cover_as_the_table_says():
    """The table's caveat: with few runs of one task the 95% interval covers far less (values stated in
    ``SMALL_N_COVERAGE``, each within 3 Monte Carlo sd of 1,500 data sets)."""
    for n, stated in SMALL_N_COVERAGE.items():
        assert abs(_coverage(n, 1, 1500, reps=300) - stated) <= 0.03, n


# --- the report table on a synthetic sweep ------------------------------------------------------------------
METRIC = metric_names.val_acc_mean("embedded_test")
SEEDS = tuple(range(6))


@pytest.fixture(scope="module")
def sweep():
    spec = SyntheticSpec(
        "aggregates_test",
        [
            _m("GRPO", "grpo", final=0.5, seed_sd=0.02),
            _m("GRPO+TROLL", "grpo", "troll", final=0.6, rate=0.08, seed_sd=0.02),
            _m("GRPO+TRM", "grpo", mask="trm_max", final=0.5, seed_sd=0.02),  # same level as the baseline
        ],
        seeds=SEEDS,
        steps=20,
        eval_every=10,
        eval_sets=("embedded_test",),
        model="tiny-qwen2",
        dataset="embedded",
        families=frozenset({"core"}),
    )
    return synthetic_data(spec)


def _last_evals(truth, method) -> np.ndarray:
    return np.array([truth[(method, s)]["curves"][METRIC][1][-1] for s in SEEDS])


def test_aggregate_table_on_a_synthetic_sweep(sweep):
    data, truth = sweep
    table = aggregate_table(data)
    assert table.title.startswith("Aggregate over seeds (IQM, mean, P(improvement)")
    assert list(table.values.index) == ["GRPO", "GRPO+TRM", "GRPO+TROLL"]  # baseline first, then by label
    base = _last_evals(truth, "GRPO")
    for method in ("GRPO", "GRPO+TROLL", "GRPO+TRM"):
        x = _last_evals(truth, method)
        row = table.values.loc[method]
        assert row["runs"] == len(SEEDS)
        assert row["IQM [95% CI]"] == pytest.approx(stats.trim_mean(x, 0.25), abs=1e-12)
        assert row["mean [95% CI]"] == pytest.approx(x.mean(), abs=1e-12)
        for col, lo_key, hi_key in (("IQM [95% CI]", "iqm_lo", "iqm_hi"), ("mean [95% CI]", "mean_lo", "mean_hi")):
            lo, hi = table.aux[lo_key].loc[method, "value"], table.aux[hi_key].loc[method, "value"]
            assert min(x) <= lo <= row[col] <= hi <= max(x)
        if method != "GRPO":
            u = stats.mannwhitneyu(x, base).statistic / (len(x) * len(base))
            assert row["P(improvement) [95% CI]"] == pytest.approx(u, abs=1e-12)
            assert row["baseline"] == "GRPO"
    poi = lambda m: (table.aux["poi_lo"].loc[m, "value"], table.aux["poi_hi"].loc[m, "value"])  # noqa: E731
    assert poi("GRPO+TROLL")[0] > 0.5  # a real difference: the interval excludes 0.5
    lo, hi = poi("GRPO+TRM")
    assert lo < 0.5 < hi  # the same level as the baseline: not detected
    assert table.display.loc["GRPO", "P(improvement) [95% CI]"] == "–"
    assert table.display.loc["GRPO", "baseline"] == "(baseline)"
    shown = table.display.loc["GRPO+TROLL", "mean [95% CI]"]
    assert shown.startswith(f"{_last_evals(truth, 'GRPO+TROLL').mean():.3f} [")
    assert "pass@1 at step 20 (last eval)" in table.caption and "tasks (1): embedded_test" in table.caption
    assert any("too narrow" in n for n in table.notes)  # 6 runs: the small-sample caveat
    assert 'id="table-aggregates"' in table.to_html() and "\\begin{tabular}" in table.to_latex()


def test_aggregate_table_pools_tasks_and_is_registered(sweep):
    data, truth = sweep
    # a second evaluation set as a second task: the statistics follow the two-task definitions
    extra = data.metrics[data.metrics["metric"] == METRIC].copy()
    extra["metric"] = metric_names.val_acc_mean("other_test")
    extra["value"] = 1.0 - extra["value"]
    both = type(data)(runs=data.runs, metrics=pd.concat([data.metrics, extra], ignore_index=True))
    table = aggregate_table(both)
    x = _last_evals(truth, "GRPO+TROLL")
    assert table.values.loc["GRPO+TROLL", "IQM [95% CI]"] == pytest.approx(
        stats.trim_mean(np.concatenate([x, 1 - x]), 0.25), abs=1e-12
    )
    base = _last_evals(truth, "GRPO")
    u = [stats.mannwhitneyu(a, b).statistic / 36 for a, b in ((x, base), (1 - x, 1 - base))]
    assert table.values.loc["GRPO+TROLL", "P(improvement) [95% CI]"] == pytest.approx(np.mean(u), abs=1e-12)
    assert "tasks (2): embedded_test, other_test" in table.caption
    assert not any("IQM equals the mean" in n for n in table.notes)
    # three seeds on one task: nothing is trimmed, and the table says the IQM is the mean
    keep = {truth[(m, s)]["run_id"] for m in ("GRPO", "GRPO+TROLL", "GRPO+TRM") for s in SEEDS[:3]}
    three = type(data)(
        runs=data.runs[data.runs["run_id"].isin(keep)].reset_index(drop=True),
        metrics=data.metrics[data.metrics["run_id"].astype(str).isin(keep)].reset_index(drop=True),
    )
    small = aggregate_table(three)
    assert list(small.values["runs"]) == [3, 3, 3]
    assert list(small.values["IQM [95% CI]"]) == pytest.approx(list(small.values["mean [95% CI]"]), abs=1e-12)
    assert any("IQM equals the mean" in n for n in small.notes)
    from reports.registry import get_report

    for report in ("demo", "generic"):
        assert "analysis.tables.aggregates:aggregate_table" in {i.target for i in get_report(report).items}
