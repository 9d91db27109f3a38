"""Time per training step by phase, wall-clock beside CPU time, and whether other load inflated wall time.

Rows are methods; columns the phases (``timing_s/<phase>`` and ``timing_cpu_s/<phase>``), the whole
step with its 95% t interval over seeds, and the machine load: wall/CPU ratio of the step, share of
steps inflated by other load (wall/CPU > 1.5 while the 1-minute load average exceeded the available
cores, ``analysis.timing``), mean load and cores. First step excluded (warm-up).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.arms import per_seed
from analysis.frames import ExperimentData
from analysis.skip import SkipItem
from analysis.stats import t_interval
from analysis.tables.base import MISSING, Table
from analysis.timing import INFLATION_RATIO, inflation_notes, load_inflation, phase_times
from runners import metric_names


def _after_first(s: pd.Series) -> float:
    s = s.sort_index()
    rest = s[s.index > s.index.min()]
    return float((rest if len(rest) else s).mean())


def timing_table(data: ExperimentData) -> Table:
    times = phase_times(data)
    names = set(data.metric_names())
    cols = [(p, c) for p, c in times.columns]
    step_cols = []
    if metric_names.TIMING_STEP in names:
        step_cols.append(("step", "wall [95% CI]"))
    if metric_names.TIMING_CPU_STEP in names:
        step_cols.append(("step", "cpu [95% CI]"))
    try:
        infl = load_inflation(data)
    except SkipItem:
        infl = None
    load_cols = [("load", "wall/CPU"), ("load", "inflated steps"), ("load", "load / cores")] if infl is not None else []
    columns = pd.MultiIndex.from_tuples(cols + step_cols + load_cols, names=["phase", "clock"])
    values = pd.DataFrame(np.nan, index=pd.Index(times.index, name="Method"), columns=columns)
    display = pd.DataFrame(MISSING, index=values.index, columns=columns)
    for col in cols:
        values[col] = times[col]
        display[col] = [f"{v:.2f}" for v in times[col]]
    for col, metric in zip(step_cols, (metric_names.TIMING_STEP, metric_names.TIMING_CPU_STEP)):
        per = per_seed(data, metric, _after_first)
        for arm in values.index:
            ci = t_interval(list(per.get(arm, {}).values()))
            values.loc[arm, col] = ci.mean
            display.loc[arm, col] = ci.text(2)
    if infl is not None:
        for arm in values.index.intersection(infl.index):
            r = infl.loc[arm]
            values.loc[arm, ("load", "wall/CPU")] = r["wall_cpu_ratio"]
            values.loc[arm, ("load", "inflated steps")] = r["inflated_frac"]
            values.loc[arm, ("load", "load / cores")] = r["load"]
            display.loc[arm, ("load", "wall/CPU")] = f"{r['wall_cpu_ratio']:.2f}"
            display.loc[arm, ("load", "inflated steps")] = (
                f"{r['inflated_frac']:.0%}" if np.isfinite(r["inflated_frac"]) else MISSING
            )
            display.loc[arm, ("load", "load / cores")] = (
                f"{r['load']:.1f} / {r['cores']:.0f}" if np.isfinite(r["load"]) else MISSING
            )
    notes = inflation_notes(data)
    if not any(c == "cpu" for _, c in cols):
        notes.append(f"no {metric_names.TIMING_CPU_PREFIX}<phase> logged: wall time only, load inflation unknown")
    return Table(
        key="timing",
        title="Time per training step: wall clock and CPU",
        caption=(
            "Mean seconds per step of each phase (wall = timing_s/<phase>, cpu = timing_cpu_s/<phase>: CPU time of the "
            "training process), first step excluded, mean over seeds; the whole step with its 95% t interval over seeds. "
            f"Load: wall/CPU of the step, share of steps whose wall time exceeded CPU time by {INFLATION_RATIO}x while the "
            "1-minute load average exceeded the available cores (wall time inflated by other work: compare CPU times), "
            "mean load / cores."
        ),
        values=values,
        display=display,
        notes=notes,
    )
