"""Entropy controllers over training, with their caps: where ADAPO's eps_high and REPO-R's zeta went.

An adaptive controller that sits at one of its caps no longer adapts: the run is its baseline with a fixed
setting (ADAPO at ``eps_high_max`` is DAPO with a wider clip; REPO-R at ``zeta_max`` is GRPO with a fixed
entropy term; Entropy-preserving RL, arXiv 2603.11682, section 5 and appendix D.2). The claims table flags
such runs ("pinned at a cap", ``analysis.stability_indicators.controller_pinned``); this figure shows them:
one panel per controller logged (``CONTROLLERS``: ``entropy/eps_high``, ``entropy/zeta``), one line per run
(not averaged over seeds: pinning is a property of a run), the caps of the runs' config as dashed lines.
REPO-R's zeta changes sign (appendix D.2), so its panel draws |zeta| against the caps' magnitudes, as the
pinning rule compares them.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from analysis.aggregate import run_series
from analysis.arms import run_params
from analysis.figures.style import Figure, method_styles, render, setup, step_axis
from analysis.frames import ExperimentData
from analysis.skip import SkipItem
from analysis.stability_indicators import CONTROLLERS, controller_pinned
from runners import metric_names


def _caps(data: ExperimentData, lo_key: str, hi_key: str, runs: list[str]) -> dict[str, tuple[float, float]]:
    """{run_id: (|min cap|, |max cap|)} for the runs that logged both caps."""
    lows, highs = run_params(data, lo_key), run_params(data, hi_key)
    return {r: (abs(float(lows[r])), abs(float(highs[r]))) for r in runs if r in lows and r in highs}


def controller_figure(data: ExperimentData) -> Figure:
    names = set(data.metric_names())
    logged = [(ctl, spec) for ctl, spec in CONTROLLERS.items() if spec[0] in names]
    if not logged:
        raise SkipItem("no run logs an entropy controller (entropy/eps_high of ADAPO, entropy/zeta of REPO-R)")
    setup()
    labels = data.labels()
    method_of = dict(zip(labels["run_id"].astype(str), labels[metric_names.TAG_METHOD]))
    styles = method_styles(labels)
    fig, axes = plt.subplots(1, len(logged), figsize=(max(4.2 * len(logged), 6.0), 3.0), squeeze=False)
    counts = []
    for ax, (ctl, (metric, lo_key, hi_key)) in zip(axes.flat, logged):
        series = run_series(data, metric)
        runs = sorted(r for r, s in series.items() if s.notna().any())
        caps = _caps(data, lo_key, hi_key, runs)
        shown = set()
        for rid in runs:
            s = series[rid].dropna().sort_index()
            method = method_of.get(rid, rid)
            style = styles.get(method, {})
            ax.plot(s.index, np.abs(s.to_numpy(dtype=float)), color=style.get("color"), linewidth=1.0, alpha=0.8,
                    label=None if method in shown else method)  # fmt: skip
            shown.add(method)
        for cap in sorted({c for pair in caps.values() for c in pair}):
            ax.axhline(cap, color="0.45", linestyle="--", linewidth=0.8)
        pinned = [controller_pinned(series[r], *caps[r]) for r in runs if r in caps]
        counts.append(f"{metric}: {sum(bool(p) for p in pinned)} of {len(pinned)} runs pinned")
        name = "|zeta|" if ctl == "repo_r" else metric.split("/")[-1]
        ax.set_title(f"{metric} ({ctl})", fontsize=9)
        ax.set_xlabel("training step")
        ax.set_ylabel(name)
        step_axis(ax)
        ax.legend(fontsize=7, frameon=False)
    caption = (
        "Each run's controller value per training step (one line per run, coloured by method), and the caps of its "
        "config (dashed: entropy_control.eps_high_min/max, entropy_control.zeta_min/max; REPO-R's |zeta| against the "
        "caps' magnitudes). A run is pinned when every value of its last quarter sits at one cap: the controller no "
        "longer adapts and the run is its baseline with a fixed setting. " + "; ".join(counts) + "."
    )
    return render(fig, "entropy_controllers", "Entropy controllers and their caps", caption)
