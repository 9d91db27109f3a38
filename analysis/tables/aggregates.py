"""Aggregate table: IQM, mean and probability of improvement over the baseline of the final evaluation,
with 95% stratified-bootstrap intervals (Agarwal et al., arXiv 2108.13264, sections 4.1 and 4.3;
``analysis.aggregates``).

A run's score on a task is its final evaluation (``analysis.aggregate.final_evals``: its last evaluation) of
pass@1 on one evaluation data set; tasks are the evaluation data sets (per training data set when the sweep
has several). Every run is one sample (runs of the same seed are not averaged); the baseline of each method
is the comparison table's (``analysis.tables.compare``).

    from analysis.tables.aggregates import aggregate_table
    table = aggregate_table(data)            # rows: methods; IQM, mean, P(improvement) with 95% CIs
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from analysis import aggregates as agg
from analysis.aggregate import final_eval_label, final_evals
from analysis.arms import Baseline, arm_table, ordered_arms, run_labels
from analysis.frames import ExperimentData
from analysis.names import eval_metrics
from analysis.skip import SkipItem
from analysis.tables.base import MISSING, Table
from analysis.tables.compare import baselines_or_first, make_baseline
from runners import metric_names

COLUMNS = ["runs", "IQM [95% CI]", "mean [95% CI]", "baseline", "P(improvement) [95% CI]"]
# coverage of a nominal 95% percentile-bootstrap interval of the mean of n normal scores on one task
# (Monte Carlo, checked by tests/analysis/test_analysis_aggregates.py)
SMALL_N_COVERAGE = {3: 0.74, 5: 0.83, 10: 0.90}


def task_scores(data: ExperimentData) -> tuple[dict[str, dict[str, np.ndarray]], list[str], list[float]]:
    """({arm: {task: final evaluations of its runs}}, the tasks in order, the steps of those evaluations).

    A task is an evaluation data set ("<training data set> / <eval data set>" when the runs were trained on
    several data sets); runs without a finite final evaluation of a task do not count for it."""
    labels = run_labels(data).set_index("run_id")
    datasets = labels[metric_names.TAG_DATASET].fillna("?").astype(str)
    several = datasets.nunique() > 1
    out: dict[str, dict[str, list[float]]] = {}
    tasks: list[str] = []
    steps: list[float] = []
    for eval_set, metric in eval_metrics(data.metric_names()).items():
        finals = final_evals(data, metric)
        finals = finals[np.isfinite(finals["value"].to_numpy(dtype=float))]
        steps += list(finals["step"])
        for rid, value in zip(finals["run_id"].astype(str), finals["value"].astype(float)):
            task = f"{datasets[rid]} / {eval_set}" if several else eval_set
            if task not in tasks:
                tasks.append(task)
            out.setdefault(str(labels.at[rid, "arm"]), {}).setdefault(task, []).append(value)
    tasks = sorted(tasks)
    return {a: {t: np.asarray(v[t]) for t in tasks if t in v} for a, v in out.items()}, tasks, steps


def _ci_text(est: float, lo: float, hi: float, digits: int = 3) -> str:
    if not np.isfinite(est):
        return MISSING
    return f"{est:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def aggregate_table(
    data: ExperimentData,
    baseline: Baseline | Mapping | None = None,
    reps: int = agg.DEFAULT_REPS,
    level: float = agg.DEFAULT_LEVEL,
    seed: int = 0,
) -> Table:
    """Rows: methods (baselines first); columns ``COLUMNS`` (see module docstring)."""
    scores, tasks, steps = task_scores(data)
    if not tasks:
        raise SkipItem("no run logs a final evaluation (val-core/<data>/acc/mean_at_<n>)")
    spec = make_baseline(baseline)
    arms = arm_table(data)
    arms = arms.loc[[a for a in arms.index if a in scores]]
    bases, notes = baselines_or_first(arms, spec)
    order = ordered_arms(arms, bases)
    index = pd.Index(order, name="Method")
    values = pd.DataFrame(np.nan, index=index, columns=pd.Index(COLUMNS), dtype=object)
    display = pd.DataFrame(MISSING, index=index, columns=values.columns)
    aux_cols = ("iqm_lo", "iqm_hi", "mean_lo", "mean_hi", "poi_lo", "poi_hi")
    aux = {k: pd.DataFrame(np.nan, index=index, columns=["value"]) for k in aux_cols}
    partial = []
    for arm in order:
        own = scores[arm]
        if len(own) < len(tasks):
            partial.append(arm)
        per_task = [own[t] for t in own]
        iqm, iqm_lo, iqm_hi = agg.interval_estimate(per_task, agg.iqm, reps, level, seed)
        mean, mean_lo, mean_hi = agg.interval_estimate(per_task, agg.mean, reps, level, seed)
        base = bases.get(arm)
        poi = poi_lo = poi_hi = np.nan
        shared = [t for t in own if base not in (None, arm) and t in scores.get(base, {})]
        if shared:
            poi, poi_lo, poi_hi = agg.probability_of_improvement(
                [own[t] for t in shared], [scores[base][t] for t in shared], reps, level, seed
            )
        n_runs = sorted({len(v) for v in own.values()})
        runs_text = "/".join(map(str, n_runs)) if len(n_runs) > 1 else str(n_runs[0])
        values.loc[arm] = [n_runs[0] if len(n_runs) == 1 else runs_text, iqm, mean, base, poi]
        for key, v in zip(aux_cols, (iqm_lo, iqm_hi, mean_lo, mean_hi, poi_lo, poi_hi)):
            aux[key].loc[arm, "value"] = v
        display.loc[arm] = [
            runs_text,
            _ci_text(iqm, iqm_lo, iqm_hi),
            _ci_text(mean, mean_lo, mean_hi),
            base if base not in (None, arm) else ("–" if base is None else "(baseline)"),
            _ci_text(poi, poi_lo, poi_hi),
        ]
    if partial:
        notes.append(f"not every task was evaluated for {', '.join(partial)}: their aggregates cover fewer tasks")
    fewest = min(len(v) for own in scores.values() for v in own.values())
    if fewest < 10:
        measured = ", ".join(f"{c:.0%} at {n} runs" for n, c in SMALL_N_COVERAGE.items())
        notes.append(
            f"with {fewest} run(s) per task the percentile bootstrap cannot see the spread it did not sample: its "
            f"95% intervals are too narrow (coverage of a mean of normal scores on one task: {measured}); "
            "treat them as descriptive, and read the t intervals of the comparison table for inference"
        )
    if any(sum(len(v) for v in own.values()) < 4 for own in scores.values()):
        notes.append("with fewer than 4 runs in all, floor(N/4) = 0 scores are trimmed: the IQM equals the mean")
    label = final_eval_label(steps, "pass@1")
    task_text = ", ".join(tasks)
    return Table(
        key="aggregates",
        title="Aggregate over seeds (IQM, mean, P(improvement) over the baseline, 95% stratified-bootstrap CIs)",
        caption=(
            f"Score: each run's final evaluation, {label}; tasks ({len(tasks)}): {task_text}; runs: the number of runs per task. "
            "Following Agarwal et al. (arXiv 2108.13264): IQM = mean of the middle 50% of all runs' scores pooled "
            "over tasks (floor(N/4) dropped at each end), mean = mean over tasks of the per-task mean (section 4.3); "
            "P(improvement) = probability that a run of the method scores above a run of its baseline on the same "
            "task, ties counting one half, averaged over tasks (section 4.3; 0.5 = no difference); "
            f"{level:.0%} percentile intervals from {reps} stratified bootstrap resamples (runs drawn with "
            "replacement within each task; for P(improvement) the method's and the baseline's runs independently; "
            f"section 4.1), seed {seed}. " + spec.describe().capitalize() + "."
        ),
        values=values,
        display=display,
        notes=notes,
        aux={k: v["value"].to_frame() for k, v in aux.items()},
    )
