"""Per-phase time per training step, per method (T-PPO (arXiv 2506.15050) Figure 4): wall clock beside CPU time.

Bars stack the mean over steps (first step excluded as warm-up) and seeds of each phase metric
``timing_s/gen | old_log_prob | update_actor | update_critic`` ("other" is ``timing_s/step`` minus
their sum). When the backend logs CPU time (``timing_cpu_s/<phase>``) each method gets a second,
hatched bar of CPU seconds, so a wall bar inflated by other load on the machine shows as a gap
between the two (``analysis.timing``); the caption names the methods whose wall time was inflated.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from analysis.figures.style import PALETTE, Figure, render, reproduces_if_run, setup
from analysis.frames import ExperimentData
from analysis.timing import inflation_notes
from analysis.timing import phase_times as _phase_times


def phase_times(data: ExperimentData) -> pd.DataFrame:
    """Mean wall seconds per step: rows methods, columns phases (+ "other")."""
    return _phase_times(data).xs("wall", axis=1, level="clock")


def timing_figure(data: ExperimentData) -> Figure:
    times = _phase_times(data)
    phases = list(dict.fromkeys(times.columns.get_level_values("phase")))
    clocks = [c for c in ("wall", "cpu") if c in set(times.columns.get_level_values("clock"))]
    setup()
    n = len(times)
    fig, ax = plt.subplots(figsize=(6.4, 0.5 + 0.45 * n * len(clocks) + 1.0))
    height = 0.8 / len(clocks)
    totals = []
    for k, clock in enumerate(clocks):
        y = np.arange(n) - 0.4 + height * (k + 0.5)
        left = np.zeros(n)
        for i, phase in enumerate(phases):
            vals = times[(phase, clock)].to_numpy() if (phase, clock) in times.columns else np.zeros(n)
            colour = PALETTE[i] if phase != "other" else "0.75"
            ax.barh(y, vals, left=left, height=height * 0.92, color=colour, hatch="///" if clock == "cpu" else None,
                    edgecolor="white" if clock == "cpu" else None, label=phase if k == 0 else None)  # fmt: skip
            left += vals
        for yy, total in zip(y, left):
            ax.text(total, yy, f" {total:.1f} s {clock if len(clocks) > 1 else ''}", va="center", fontsize=7)
        totals.append(left)
    ax.set_yticks(np.arange(n), list(times.index))
    ax.invert_yaxis()
    ax.set_xlabel(
        "mean time per training step (s)" + (": wall (plain) and CPU (hatched)" if len(clocks) > 1 else ", wall clock")
    )
    ax.set_xlim(0, max(t.max() for t in totals) * 1.22 if n else 1)
    ax.legend(fontsize=7, ncol=len(phases), loc="upper center", bbox_to_anchor=(0.5, -0.25 - 0.05 * (n < 3)))
    fig.tight_layout()
    notes = inflation_notes(data)
    reproduces, form = reproduces_if_run(data.labels(), "tppo", "T-PPO (arXiv 2506.15050) Figure 4")
    return render(
        fig,
        "timing_breakdown",
        "Time per training step by phase",
        "Mean seconds per step of each phase (generation, old log-prob recomputation, actor update, critic update; "
        "'other' = the rest of timing_s/step), first step excluded, averaged over seeds"
        + ("; hatched bars: CPU time of the training process (timing_cpu_s/<phase>)." if "cpu" in clocks else ".")
        + (" " + " ".join(notes) if notes else "")
        + form,
        reproduces=reproduces,
    )
