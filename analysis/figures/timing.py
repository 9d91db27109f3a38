"""Per-phase wall-clock time per training step, per method (T-PPO, arXiv 2506.15050, Figure 4).

Bars stack the mean over steps (first step excluded as warm-up) and seeds of each phase metric
``timing_s/gen | old_log_prob | update_actor | update_critic``; "other" is ``timing_s/step`` minus
their sum when the step time is logged.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from analysis.figures.style import PALETTE, Figure, render, setup
from analysis.frames import ExperimentData
from analysis.skip import SkipItem
from analysis.tables.troll import _runtime_per_run
from runners import metric_names


def phase_times(data: ExperimentData) -> pd.DataFrame:
    """Mean seconds per step: rows methods, columns phases (+ "other")."""
    names = set(data.metric_names())
    phases = [p for p in metric_names.TIMING_PHASES if p in names]
    if not phases:
        raise SkipItem(f"no run logs {', '.join(metric_names.TIMING_PHASES)}")
    labels = data.labels().set_index("run_id")
    out = {}
    for p in phases:
        per = _runtime_per_run(data, p)
        out[p.split("/", 1)[1]] = per.groupby(labels[metric_names.TAG_METHOD].reindex(per.index)).mean()
    frame = pd.DataFrame(out).fillna(0.0)
    if metric_names.TIMING_STEP in names:
        step = _runtime_per_run(data, metric_names.TIMING_STEP)
        total = step.groupby(labels[metric_names.TAG_METHOD].reindex(step.index)).mean()
        frame["other"] = (total.reindex(frame.index) - frame.sum(axis=1)).clip(lower=0.0)
    order = list(dict.fromkeys(labels[metric_names.TAG_METHOD]))
    return frame.reindex([m for m in order if m in frame.index])


def timing_figure(data: ExperimentData) -> Figure:
    times = phase_times(data)
    setup()
    fig, ax = plt.subplots(figsize=(6.4, 0.5 + 0.45 * len(times) + 1.0))
    left = np.zeros(len(times))
    for i, col in enumerate(times.columns):
        ax.barh(times.index, times[col], left=left, color=PALETTE[i] if col != "other" else "0.75", label=col)
        left += times[col].to_numpy()
    for y, total in enumerate(left):
        ax.text(total, y, f" {total:.1f} s", va="center", fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("mean wall-clock time per training step (s)")
    ax.set_xlim(0, left.max() * 1.15 if len(left) else 1)
    ax.legend(
        fontsize=7, ncol=len(times.columns), loc="upper center", bbox_to_anchor=(0.5, -0.25 - 0.05 * (len(times) < 3))
    )
    fig.tight_layout()
    return render(
        fig,
        "timing_breakdown",
        "Time per training step by phase",
        "Mean seconds per step of each phase (generation, old log-prob recomputation, actor update, critic update; "
        "'other' = the rest of timing_s/step), first step excluded, averaged over seeds.",
        reproduces="T-PPO (arXiv 2506.15050) Figure 4",
    )
