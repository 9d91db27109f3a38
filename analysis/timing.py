"""Fair timing: wall and CPU seconds per phase, and whether other load on the machine inflated wall time.

Backends log each phase's wall time (``timing_s/<phase>``) and the CPU time of the training process
over the same interval (``timing_cpu_s/<phase>``), plus the 1-minute load average and the cores the
process may use (``perf/load_avg_1m``, ``perf/cpu_count_available``). A step counts as *inflated by
other load* when its wall time exceeds its CPU time by ``INFLATION_RATIO`` (the process waited rather
than computed) while the load average exceeded the available cores (someone else was computing). On
a GPU the process also waits for kernels, so a high wall/CPU ratio alone says nothing; the load
condition is what marks contention.

Means per step exclude the first step (warm-up), as ``TROLL (arXiv 2510.03817)`` Table 5 does.

    from analysis.timing import phase_times, load_inflation
    phase_times(data)        # rows arms, columns (phase, "wall" | "cpu") seconds per step
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.aggregate import run_series
from analysis.arms import run_labels
from analysis.frames import ExperimentData
from analysis.skip import SkipItem
from runners import metric_names

INFLATION_RATIO = 1.5


def runtime_per_run(data: ExperimentData, metric: str) -> pd.Series:
    """Mean of ``metric`` per run over all steps but the first (all steps when there is only one)."""
    out = {}
    for rid, s in run_series(data, metric).items():
        s = s.dropna().sort_index()
        rest = s[s.index > s.index.min()]
        out[rid] = float((rest if len(rest) else s).mean())
    return pd.Series(out, dtype=float)


def phase_times(data: ExperimentData) -> pd.DataFrame:
    """Mean seconds per step: rows arms, columns MultiIndex (phase, "wall" | "cpu"); CPU columns only for
    phases whose ``timing_cpu_s`` twin is logged. "other" = ``timing_s/step`` minus the phases (wall and CPU)."""
    names = set(data.metric_names())
    phases = [p for p in metric_names.TIMING_PHASES if p in names]
    if not phases:
        raise SkipItem(f"no run logs {', '.join(metric_names.TIMING_PHASES)}")
    labels = run_labels(data).set_index("run_id")
    cols: dict[tuple[str, str], pd.Series] = {}

    def by_arm(metric: str) -> pd.Series:
        per = runtime_per_run(data, metric)
        return per.groupby(labels["arm"].reindex(per.index)).mean()

    for p in phases:
        name = p.split("/", 1)[1]
        cols[(name, "wall")] = by_arm(p)
        if metric_names.timing_cpu(p) in names:
            cols[(name, "cpu")] = by_arm(metric_names.timing_cpu(p))
    frame = pd.DataFrame(cols).fillna(0.0)
    frame.columns = pd.MultiIndex.from_tuples(frame.columns, names=["phase", "clock"])
    for clock, metric in (("wall", metric_names.TIMING_STEP), ("cpu", metric_names.TIMING_CPU_STEP)):
        if metric in names and clock in set(frame.columns.get_level_values("clock")):
            total = by_arm(metric).reindex(frame.index)
            parts = frame.xs(clock, axis=1, level="clock").sum(axis=1)
            frame[("other", clock)] = (total - parts).clip(lower=0.0)
    order = sorted(frame.index)
    return frame.reindex(order)


def load_inflation(data: ExperimentData, ratio: float = INFLATION_RATIO) -> pd.DataFrame:
    """Per arm: mean wall/CPU ratio of the step, share of steps inflated by other load, mean load, cores.

    Columns: wall_cpu_ratio, inflated_frac, load, cores, max_ratio (NaN where the metrics are missing).
    """
    names = set(data.metric_names())
    needed = (metric_names.TIMING_STEP, metric_names.TIMING_CPU_STEP)
    if not all(m in names for m in needed):
        raise SkipItem(f"no run logs both {metric_names.TIMING_STEP} and {metric_names.TIMING_CPU_STEP}")
    wall, cpu = run_series(data, metric_names.TIMING_STEP), run_series(data, metric_names.TIMING_CPU_STEP)
    load, cores = run_series(data, metric_names.LOAD_AVG_1M), run_series(data, metric_names.CPU_COUNT_AVAILABLE)
    rows = []
    for rid, arm in zip(*(run_labels(data)[c] for c in ("run_id", "arm"))):
        rid = str(rid)
        if rid not in wall or rid not in cpu:
            continue
        frame = pd.DataFrame({"wall": wall[rid], "cpu": cpu[rid]})
        if rid in load and rid in cores:
            frame["load"], frame["cores"] = load[rid], cores[rid]
        frame = frame.dropna(subset=["wall", "cpu"])
        r = frame["wall"] / frame["cpu"].where(frame["cpu"] > 0)
        contended = frame["load"] > frame["cores"] if "load" in frame else pd.Series(False, index=frame.index)
        rows.append(
            {
                "arm": arm,
                "wall_cpu_ratio": float(frame["wall"].sum() / frame["cpu"].sum()) if frame["cpu"].sum() > 0 else np.nan,
                "max_ratio": float(r.max()),
                "inflated_frac": float(((r > ratio) & contended).mean()) if "load" in frame else np.nan,
                "load": float(frame["load"].mean()) if "load" in frame else np.nan,
                "cores": float(frame["cores"].median()) if "cores" in frame else np.nan,
            }
        )
    if not rows:
        raise SkipItem(f"no run logs both {metric_names.TIMING_STEP} and {metric_names.TIMING_CPU_STEP}")
    out = pd.DataFrame(rows).groupby("arm").mean()
    return out.reindex(sorted(out.index))


def inflation_notes(data: ExperimentData, ratio: float = INFLATION_RATIO) -> list[str]:
    """One sentence per arm whose wall time was inflated by other load on some steps ([] when none or unknown)."""
    try:
        infl = load_inflation(data, ratio)
    except SkipItem:
        return []
    notes = []
    for arm, r in infl.iterrows():
        if np.isfinite(r["inflated_frac"]) and r["inflated_frac"] > 0:
            notes.append(
                f"{arm}: wall time inflated by other load on {r['inflated_frac']:.0%} of steps (wall/CPU up to "
                f"{r['max_ratio']:.1f}, mean load {r['load']:.1f} on {r['cores']:.0f} available cores): compare CPU times"
            )
    return notes


def cumulative_time(data: ExperimentData, metric: str = metric_names.TIMING_STEP) -> dict[str, pd.Series]:
    """{run_id: seconds spent by the end of each step (index step)}."""
    return {rid: s.dropna().sort_index().cumsum() for rid, s in run_series(data, metric).items()}
