"""Learning-curve table: area under the evaluation curve and time to a stated target, per method.

A final evaluation says where a method ended; the curve says how it got there. Per run, on the primary
evaluation set (the first pass@1 logged, ``analysis.names.eval_metrics``):

- **AUC**: the area under the pass@1 curve over its evaluation steps (trapezoid rule) divided by the steps
  it spans, so the mean pass@1 over training in pass@1 units; every evaluation counts, step 0 included.
- **time to target**: the first evaluation step whose pass@1 reaches ``fraction`` (default 0.9) of the best
  method's mean final evaluation (each run's last), and the CPU seconds of training spent by then
  (``timing_cpu_s/step``, cumulative; wall seconds ``timing_s/step`` when CPU time is not logged). A run that
  never reaches it is counted as not reached, never given a time.

Rows are methods (baselines first); AUC is shown as its mean with a 95% t interval over seeds and, against
the method's baseline (the comparison table's), as the paired-by-seed difference with its interval.

    from analysis.tables.learning import learning_table
    learning_table(data)                  # AUC, its paired difference, steps and CPU seconds to 90% of the best
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from analysis.aggregate import final_evals, run_series
from analysis.arms import Baseline, arm_table, ordered_arms, run_labels
from analysis.frames import ExperimentData
from analysis.names import eval_metrics
from analysis.skip import SkipItem
from analysis.stats import t_interval
from analysis.tables.base import MISSING, Table
from analysis.tables.compare import baselines_or_first, make_baseline
from analysis.timing import cumulative_time
from runners import metric_names

COLUMNS = ["seeds", "AUC [95% CI]", "Δ AUC vs baseline [95% CI]", "steps to target", "CPU s to target"]
DEFAULT_FRACTION = 0.9


def curve_auc(series: pd.Series) -> float:
    """Mean of a curve over the steps it spans: trapezoid area / (last step - first step); NaN below 2 points."""
    s = series.dropna().sort_index()
    if len(s) < 2:
        return float("nan")
    x, y = s.index.to_numpy(dtype=float), s.to_numpy(dtype=float)
    span = x[-1] - x[0]
    return float(np.sum((y[1:] + y[:-1]) * np.diff(x)) / 2.0 / span) if span > 0 else float("nan")


def first_reaching(series: pd.Series, target: float) -> float | None:
    """The first step whose value is at least ``target`` (None when none is)."""
    s = series.dropna().sort_index()
    hit = s.index[s.to_numpy(dtype=float) >= target]
    return float(hit[0]) if len(hit) else None


def _seconds_at(cum: pd.Series | None, step: float) -> float:
    """Seconds spent by the end of ``step`` (0 for step 0, before any training); NaN without timing."""
    if cum is None or cum.empty:
        return float("nan")
    done = cum[cum.index <= step]
    return float(done.iloc[-1]) if len(done) else 0.0


def _median_text(values: list[float], n: int, digits: int) -> str:
    reached = [v for v in values if np.isfinite(v)]
    if not reached:
        return f"not reached (0 of {n})"
    text = f"{np.median(reached):.{digits}f}"
    return text if len(reached) == n else f"{text} ({len(reached)} of {n} reached)"


def learning_table(
    data: ExperimentData, baseline: Baseline | Mapping | None = None, fraction: float = DEFAULT_FRACTION
) -> Table:
    """Rows: methods; columns ``COLUMNS`` (module docstring)."""
    evals = eval_metrics(data.metric_names())
    if not evals:
        raise SkipItem("no run logs an evaluation (val-core/<data>/acc/mean_at_<n>)")
    eval_set, metric = next(iter(evals.items()))
    labels = run_labels(data)
    series = run_series(data, metric)
    clock = (
        metric_names.TIMING_CPU_STEP
        if metric_names.TIMING_CPU_STEP in data.metric_names()
        else metric_names.TIMING_STEP
    )
    cum = cumulative_time(data, clock)
    finals = final_evals(data, metric).merge(labels[["run_id", "arm"]], on="run_id")
    best = finals.groupby("arm")["value"].mean().max()
    if not np.isfinite(best):
        raise SkipItem(f"no run has a final evaluation of {metric}")
    target = fraction * float(best)
    runs: dict[str, dict[int, dict[str, float]]] = {}
    for rid, arm, seed in zip(labels["run_id"].astype(str), labels["arm"], labels[metric_names.TAG_SEED]):
        s = series.get(rid)
        if s is None or s.notna().sum() < 2:
            continue
        step = first_reaching(s, target)
        runs.setdefault(arm, {})[int(seed)] = {
            "auc": curve_auc(s),
            "step": float("nan") if step is None else step,
            "seconds": float("nan") if step is None else _seconds_at(cum.get(rid), step),
        }
    if not runs:
        raise SkipItem(f"no run has two evaluations of {metric}: no curve to summarise")
    arms = arm_table(data)
    arms = arms.loc[[a for a in arms.index if a in runs]]
    bases, notes = baselines_or_first(arms, make_baseline(baseline))
    order = ordered_arms(arms, bases)
    index = pd.Index(order, name="Method")
    display = pd.DataFrame(MISSING, index=index, columns=pd.Index(COLUMNS))
    values = pd.DataFrame(np.nan, index=index, columns=pd.Index(COLUMNS), dtype=float)
    for arm in order:
        own = runs[arm]
        auc = t_interval([r["auc"] for r in own.values()])
        base = bases.get(arm)
        diff_text, diff = "(baseline)" if base == arm else MISSING, float("nan")
        if base not in (None, arm) and base in runs:
            shared = sorted(set(own) & set(runs[base]))
            d = t_interval([own[s]["auc"] - runs[base][s]["auc"] for s in shared])
            diff, diff_text = d.mean, f"{d.text(3, signed=True, show_n=False)} vs {base} ({d.n} paired)"
        steps = [r["step"] for r in own.values()]
        seconds = [r["seconds"] for r in own.values()]
        display.loc[arm] = [str(len(own)), auc.text(3, show_n=False), diff_text, _median_text(steps, len(own), 0),
                            _median_text(seconds, len(own), 0)]  # fmt: skip
        values.loc[arm] = [len(own), auc.mean, diff, np.nanmedian(steps) if np.isfinite(steps).any() else np.nan,
                           np.nanmedian(seconds) if np.isfinite(seconds).any() else np.nan]  # fmt: skip
    word = "CPU" if clock == metric_names.TIMING_CPU_STEP else "wall-clock"
    return Table(
        key="learning",
        title="Learning curves: area under the evaluation curve and time to target",
        caption=(
            f"Evaluation set {eval_set} ({metric}). AUC: area under each run's pass@1 curve over its evaluation steps "
            "(trapezoid rule, step 0 included) divided by the steps it spans, i.e. its mean pass@1 over training; mean "
            "with its 95% t interval over seeds, and the paired-by-seed difference from the method's baseline. Target: "
            f"{fraction:.0%} of the best method's mean final evaluation ({float(best):.3f}), so pass@1 ≥ {target:.3f}; "
            f"steps to target: the first evaluation step reaching it (median over seeds); {word} seconds to target: "
            f"the training {word} time ({clock}, cumulative) spent by that step (median). Runs that never reach it are "
            "counted, never timed."
        ),
        values=values,
        display=display,
        notes=notes,
    )
