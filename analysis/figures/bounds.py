"""TRM error bounds vs sequence length (log-log), for several delta, and at a run's measured divergence.

The curves come from ``runners.algorithms.bounds.error_bounds`` (TRM, arXiv 2512.23075, section 4); this module
only plots. ``plot_bounds`` is shared by the report and ``trustbench bounds --out``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from analysis.figures.style import PALETTE, Figure, render, set_log, setup
from analysis.frames import ExperimentData
from analysis.skip import SkipItem
from runners.algorithms.bounds import error_bounds

CURVES = (
    ("classical", "Classical (TRPO)"),
    ("linear", "Linear"),
    ("pinsker_marginal", "Pinsker-Marginal"),
    ("mixed", "Mixed"),
)


def plot_bounds(deltas: list[float], d_seq: float | None = 0.01, t_max: int = 16384, runs: pd.DataFrame | None = None):
    """One panel per delta (bounds vs T) and, when ``runs`` is given, a second row with the runs' bounds.

    runs: rows with method, delta, T, d_seq, dbar ([T] array or None) (``analysis.tables.trm.run_bound_inputs``).
    """
    setup()
    with_runs = runs is not None and len(runs) > 0
    n = len(deltas)
    fig = plt.figure(figsize=(max(3.4 * n, 6.5), 3.4 + (3.0 if with_runs else 0.0)))
    grid = fig.add_gridspec(2 if with_runs else 1, n, height_ratios=[1, 0.95] if with_runs else [1])
    T = np.unique(np.geomspace(2, t_max, 200).round().astype(int))  # T = 1 has zero error (log axis)
    axes = []
    for j, delta in enumerate(deltas):
        ax = fig.add_subplot(grid[0, j], sharey=axes[0] if axes else None)
        axes.append(ax)
        b = error_bounds(T, delta, d_seq=d_seq)
        for i, (key, label) in enumerate(CURVES):
            if np.all(np.isnan(b[key])):
                continue
            ax.plot(T, b[key], color=PALETTE[i], label=label + (f" (D_seq={d_seq:g})" if key == "mixed" else ""))
        ax.axhline(1.0, color="0.4", lw=0.8, ls=":")
        ax.set_title(f"δ = {delta:g}", fontsize=9)
        set_log(ax, x=True, y=True)
        ax.set_xlabel("sequence length T (tokens)")
    axes[0].set_ylabel("bound on |J − J_roll − L|\n(reward units)")
    axes[0].legend(fontsize=7, loc="upper left")
    if with_runs:
        ax = fig.add_subplot(grid[1, :])
        for j, (_, r) in enumerate(runs.iterrows()):
            if not r["T"]:
                continue
            Tr = np.unique(np.geomspace(2, int(r["T"]), 80).round().astype(int))
            color = PALETTE[(j + len(CURVES)) % len(PALETTE)]
            pm = error_bounds(Tr, r["delta"])["pinsker_marginal"]
            ax.plot(Tr, pm, color=color, ls="--", lw=1, label=f"{r['method']}: Pinsker-Marginal (δ={r['delta']:.1e})")
            if r["dbar"] is not None:
                adaptive = [error_bounds(int(t), r["delta"], dbar=r["dbar"][: int(t)])["adaptive"] for t in Tr]
                ax.plot(Tr, adaptive, color=color, lw=1.8, label=f"{r['method']}: Adaptive (measured Dbar)")
        ax.axhline(1.0, color="0.4", lw=0.8, ls=":")
        ax.set_title("our runs: bounds at the measured max token KL δ and per-position TV Dbar", fontsize=9)
        set_log(ax, x=True, y=True)
        ax.set_xlabel("sequence length T (tokens)")
        ax.set_ylabel("bound (reward units)")
        ax.legend(fontsize=6.5, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    return fig


def bounds_figure(data: ExperimentData | None = None, deltas: tuple[float, ...] = (1e-5, 1e-4, 1e-3)) -> Figure:
    runs = None
    note = ""
    if data is not None:
        from analysis.tables.trm import run_bound_inputs

        try:
            runs = run_bound_inputs(data)
        except SkipItem as exc:
            note = f" No run-specific panel: {exc}."
    fig = plot_bounds(list(deltas), d_seq=0.01, t_max=16384, runs=runs)
    return render(
        fig,
        "trm_bounds",
        "TRM error bounds vs sequence length",
        "Bounds of TRM (arXiv 2512.23075) section 4 (rewards in [0,1], dotted line = 1) vs T for several max token KL δ; Mixed with D_seq = 0.01. "
        "Bottom panel: each TRM run's Pinsker-Marginal bound at its measured δ (max over steps of trm/max_kl) and its Adaptive bound "
        "from the measured per-position TV (trm/tv/pos_<lo>_<hi>)." + note,
        reproduces="TRM (arXiv 2512.23075) section 4 (bound comparison), Table 1",
    )
