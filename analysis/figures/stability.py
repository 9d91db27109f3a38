"""Figures of the stability map (``analysis.stability``): the score map as a heatmap (methods x regimes, colour =
IQM difference from GRPO of the same regime, each cell annotated with the difference and its verdict), the
share of seeds with any instability (letters: which indicators fired), and held-out learning curves with one
panel per regime.

    from analysis.figures.stability import score_map_figure, stability_figure, regime_curves_figure
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from analysis import aggregates as agg
from analysis import stability as st
from analysis.aggregate import run_series
from analysis.arms import run_labels
from analysis.figures.curves import panel_legend
from analysis.figures.style import Figure, method_styles, render, setup, step_axis
from analysis.frames import ExperimentData
from analysis.names import eval_metrics
from analysis.skip import SkipItem
from analysis.tables.stability import score_caption, stability_caption
from runners import metric_names

# the verdict's mark in a score-map cell ("needs N" for underpowered cells)
MARKS = {
    st.BETTER: "better",
    st.WORSE: "worse",
    st.NOT_DISTINGUISHABLE: "n.d.",
    st.IDENTICAL: "= GRPO",
    st.TOO_FEW_SEEDS: "few seeds",
    st.NO_BASELINE: "no GRPO",
}


def verdict_mark(verdict: str, seeds_needed: object, pairs: int) -> str:
    """'better', 'n.d.', 'needs 12', 'needs >1000', ... (the cell annotation under the difference)."""
    if verdict == st.UNDERPOWERED:
        n = seeds_needed if isinstance(seeds_needed, (int, np.integer, float)) and np.isfinite(seeds_needed) else None
        return f"needs {int(n)}" if n is not None else "needs >1000"
    return MARKS.get(verdict, verdict)


def _grid(frame: pd.DataFrame, column: str) -> tuple[pd.DataFrame, list[str], list[str]]:
    methods = list(dict.fromkeys(frame["method"]))
    regimes = st.regime_order(frame["regime"])
    grid = frame.pivot_table(index="method", columns="regime", values=column, aggfunc="first", dropna=False)
    return grid.reindex(index=methods, columns=regimes), methods, regimes


def _heatmap(
    values: np.ndarray, methods: list[str], regimes: list[str], cmap: str, vmin: float, vmax: float, label: str
):
    setup()
    fig, ax = plt.subplots(figsize=(1.9 * len(regimes) + 3.0, 0.55 * len(methods) + 1.6))
    masked = np.ma.masked_invalid(values.astype(float))
    im = ax.imshow(masked, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    ax.set_xticks(range(len(regimes)), regimes, rotation=20, ha="right")
    ax.set_yticks(range(len(methods)), methods)
    ax.grid(False)
    fig.colorbar(im, ax=ax, label=label, fraction=0.05)
    return fig, ax


def score_map_figure(data: ExperimentData, margin: float = st.DEFAULT_MARGIN, reps: int = agg.DEFAULT_REPS) -> Figure:
    smap = st.score_map(data, margin, reps)
    if not len(smap):
        raise SkipItem("no run logs a final evaluation besides GRPO's")
    grid, methods, regimes = _grid(smap, "iqm_diff")
    lim = float(np.nanmax(np.abs(grid.to_numpy(dtype=float)))) if np.isfinite(grid.to_numpy(dtype=float)).any() else 0.1
    lim = max(lim, margin)
    fig, ax = _heatmap(grid.to_numpy(dtype=float), methods, regimes, "RdBu", -lim, lim, "Δ IQM vs GRPO (pass@1)")
    for _, r in smap.iterrows():
        i, j = methods.index(r["method"]), regimes.index(r["regime"])
        diff = f"{r['iqm_diff']:+.3f}" if np.isfinite(r["iqm_diff"]) else "–"
        mark = verdict_mark(r["verdict"], r["seeds_needed"], int(r["pairs"]))
        dark = np.isfinite(r["iqm_diff"]) and abs(r["iqm_diff"]) > 0.6 * lim
        ax.text(j, i, f"{diff}\n{mark}", ha="center", va="center", fontsize=7, color="white" if dark else "black")
    return render(
        fig,
        "score_map_heatmap",
        "Score map: Δ IQM of the final pass@1 vs GRPO, per method and off-policy regime",
        "Colour and first line: IQM of the method's final evaluations minus GRPO's in the same regime; second line: "
        "the verdict of the paired t interval ('n.d.' = not distinguishable, 'needs N' = underpowered, N paired seeds "
        "needed, '= GRPO' = every seed scored exactly as GRPO: the method did not act). " + score_caption(margin, reps),
        reproduces="stability map (IQM and P(improvement): arXiv 2108.13264; seed variance: arXiv 2504.07086)",
    )


def stability_figure(data: ExperimentData) -> Figure:
    stab = st.stability(data)
    if not len(stab):
        raise SkipItem("no runs")
    stab = stab.assign(share=[r["any_k"] / r["any_n"] if r["any_n"] else np.nan for _, r in stab.iterrows()])
    grid, methods, regimes = _grid(stab, "share")
    fig, ax = _heatmap(
        grid.to_numpy(dtype=float), methods, regimes, "Reds", 0.0, 1.0, "share of seeds with any instability"
    )
    for _, r in stab.iterrows():
        i, j = methods.index(r["method"]), regimes.index(r["regime"])
        text = st.k_of_n(int(r["any_k"]), int(r["any_n"])) + (f"\n{r['fired']}" if r["fired"] else "")
        dark = np.isfinite(r["share"]) and r["share"] > 0.6
        ax.text(j, i, text, ha="center", va="center", fontsize=7, color="white" if dark else "black")
    return render(
        fig,
        "stability_heatmap",
        "Share of seeds with any instability, per method and off-policy regime",
        "Colour and first line: runs in which at least one indicator fired, of the runs where one could be evaluated; "
        "second line: the letters of the indicators that fired. " + stability_caption(),
    )


def regime_curves(data: ExperimentData) -> pd.DataFrame:
    """Held-out pass@1 per (regime, method, step): mean over seeds of each run's mean over evaluation sets.
    Columns regime, method, step, value, runs."""
    metrics = list(eval_metrics(data.metric_names()).values())
    labels = run_labels(data).set_index("run_id")
    per_run = {}
    for metric in metrics:
        for rid, s in run_series(data, metric).items():
            per_run.setdefault(rid, []).append(s)
    rows = []
    for rid, series in per_run.items():
        if rid not in labels.index:
            continue
        mean = pd.concat(series, axis=1).mean(axis=1, skipna=False).dropna()
        for step, value in mean.items():
            rows.append(
                (
                    labels.at[rid, metric_names.TAG_REGIME],
                    labels.at[rid, metric_names.TAG_METHOD],
                    int(step),
                    value,
                    rid,
                )
            )
    frame = pd.DataFrame(rows, columns=["regime", "method", "step", "value", "run_id"])
    return (
        frame.groupby(["regime", "method", "step"], sort=False)
        .agg(value=("value", "mean"), runs=("run_id", "nunique"))
        .reset_index()
    )


def regime_curves_figure(data: ExperimentData) -> Figure:
    curves = regime_curves(data)
    if not len(curves):
        raise SkipItem("no run logs an evaluation (val-core/<data>/acc/mean_at_<n>)")
    setup()
    styles = method_styles(data.labels())
    regimes = st.regime_order(curves["regime"])
    ncols = min(3, len(regimes))
    nrows = math.ceil(len(regimes) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(3.6 * ncols, 6.0), 2.8 * nrows), squeeze=False, sharey=True)
    for ax, regime in zip(axes.flat, regimes):
        for method, g in curves[curves["regime"] == regime].groupby("method", sort=False):
            ax.plot(g["step"], g["value"], lw=1.4, marker="o", ms=2.5, label=method, **styles.get(method, {}))
        ax.set_title(regime, fontsize=9)
        ax.set_xlabel("training step")
        ax.set_ylabel("held-out pass@1")
        step_axis(ax)
    panel_legend(fig, axes, len(regimes))
    return render(
        fig,
        "regime_curves",
        "Held-out pass@1 over training, one panel per off-policy regime",
        "Each run's pass@1 averaged over the evaluation sets at each evaluation step (step 0 = the initial policy), "
        "then the mean over seeds per method; no smoothing (evaluations every few steps).",
    )
