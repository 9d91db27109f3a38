"""Training curves per method: success (train/eval), entropy, response length, clip vs projected
fraction, and small multiples of every metric for experiments without a dedicated report.

Each panel shows, per method, the mean over seeds of the raw curve (faint) and of the per-seed
smoothed curves (full opacity) with a bootstrap 95% band over seeds, as in TROLL (arXiv 2510.03817) section 4
(windows 7 for training and 21 for evaluation curves; capped at half the series length).
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np

from analysis.aggregate import seed_curves
from analysis.figures.style import (
    LINE_STYLE_NOTE,
    RAW_ALPHA,
    Figure,
    method_styles,
    render,
    reproduces_if_run,
    set_log,
    setup,
    step_axis,
)
from analysis.frames import ExperimentData
from analysis.names import eval_metrics
from analysis.skip import SkipItem
from runners import metric_names

TRAIN_WINDOW, EVAL_WINDOW = 7, 21


def _draw(ax, data: ExperimentData, metric: str, window: int, styles: dict, scale: float = 1.0) -> int:
    curves = seed_curves(data, metric, window=window)
    for method, g in curves.groupby("method", sort=False):
        st = styles.get(method, {})
        ax.plot(g["step"], g["raw"] * scale, alpha=RAW_ALPHA, lw=0.8, **st)
        ax.plot(g["step"], g["smooth"] * scale, lw=1.6, label=method, **st)
        if g["lo"].notna().any():
            ax.fill_between(g["step"], g["lo"] * scale, g["hi"] * scale, color=st.get("color"), alpha=0.12, lw=0)
    return int(curves["window"].max()) if len(curves) else 0


def panel_legend(fig, axes, n_panels: int) -> None:
    """Hide the grid's unused axes and draw one legend for all panels under them (each label once, rows of
    ``legend_columns``), then lay the figure out around it."""
    for ax in list(axes.flat)[n_panels:]:
        ax.set_visible(False)
    seen: dict[str, object] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    ncol, by_column = legend_columns(list(seen.items()))
    labels, handles = [label for label, _ in by_column], [handle for _, handle in by_column]
    fig.legend(handles, labels, loc="lower center", ncol=ncol, bbox_to_anchor=(0.5, -0.02 - 0.04 * (len(labels) > 6)))
    fig.tight_layout(rect=(0, 0.08 if len(labels) <= 6 else 0.14, 1, 1))


def legend_columns(entries: list, max_per_row: int = 6) -> tuple[int, list]:
    """(ncol, entries reordered) so that a legend reads left to right in rows of (nearly) equal
    length, at most ``max_per_row`` each: matplotlib fills a legend column by column, so it gets
    the entries column by column (entry k sits in row k // ncol, column k % ncol)."""
    ncol = math.ceil(len(entries) / math.ceil(len(entries) / max_per_row)) if entries else 1
    return ncol, [entries[k] for j in range(ncol) for k in range(j, len(entries), ncol)]


def panels_figure(
    data: ExperimentData,
    panels: list[tuple],
    ylabel: str,
    key: str,
    title: str,
    caption: str,
    reproduces: str = "",
    scale: float = 1.0,
    logy: bool = False,
    ncols: int = 3,
) -> Figure:
    """One panel per (metric, panel title, smoothing window[, y label]); shared legend of methods."""
    available = set(data.metric_names())
    panels = [p for p in panels if p[0] in available]
    if not panels:
        raise SkipItem("none of the plotted metrics is logged")
    setup()
    styles = method_styles(data.labels())
    ncols = min(ncols, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    # a lone panel gets a readable width (the page scales the SVG to its natural size)
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(3.6 * ncols, 6.0), 2.8 * nrows), squeeze=False)
    windows = []
    for ax, (metric, panel_title, window, *panel_ylabel) in zip(axes.flat, panels):
        windows.append(_draw(ax, data, metric, window, styles, scale))
        ax.set_title(panel_title, fontsize=9)
        ax.set_xlabel("training step")
        ax.set_ylabel(panel_ylabel[0] if panel_ylabel else ylabel)
        step_axis(ax)
        if logy:
            set_log(ax, y=True)
    panel_legend(fig, axes, len(panels))
    smoothing = ", ".join(sorted({str(w) for w in windows}))
    return render(fig, key, title, caption + f" Smoothing window(s) used: {smoothing} points.", reproduces)


def success_figure(data: ExperimentData) -> Figure:
    names = data.metric_names()
    panels = [(metric_names.SCORE_MEAN, "training success (critic/score/mean)", TRAIN_WINDOW)]
    panels += [(m, f"eval: {d}", EVAL_WINDOW) for d, m in eval_metrics(names).items()]
    return panels_figure(
        data,
        panels[:9],
        "success rate",
        "success_curves",
        "Training and evaluation success",
        "Success rate per method on training data (critic/score/mean) and each evaluation set (pass@1, val-core/<data>/acc/mean_at_N); "
        "mean over seeds, raw values faint, smoothed values as lines with a bootstrap 95% band over seeds. "
        + LINE_STYLE_NOTE,
        reproduces="TROLL (arXiv 2510.03817) Figures 3, 8, 9",
    )


def entropy_figure(data: ExperimentData) -> Figure:
    return panels_figure(
        data,
        [(metric_names.ENTROPY, "token entropy of the policy (actor/entropy)", TRAIN_WINDOW)],
        "entropy (nats)",
        "entropy_curves",
        "Policy entropy",
        "Mean token entropy of the current policy on the training batch, mean over seeds (raw faint, smoothed as lines, "
        "bootstrap 95% band). " + LINE_STYLE_NOTE,
        reproduces="Entropy-preserving RL (arXiv 2603.11682) Figures 1, 6; TROLL (arXiv 2510.03817) Figure 17",
        ncols=1,
    )


def response_length_figure(data: ExperimentData) -> Figure:
    tppo, note = reproduces_if_run(data.labels(), "tppo", "T-PPO (arXiv 2506.15050) Figure 6")
    return panels_figure(
        data,
        [(metric_names.RESPONSE_LENGTH_MEAN, "mean response length (response_length/mean)", TRAIN_WINDOW)],
        "response length (tokens)",
        "response_length",
        "Response length",
        "Mean generated response length per training batch, mean over seeds. " + LINE_STYLE_NOTE + note,
        reproduces="; ".join(filter(None, ["TROLL (arXiv 2510.03817) Figure 18 (lower row)", tppo])),
        ncols=1,
    )


def clip_projection_figure(data: ExperimentData) -> Figure:
    """Fraction of clipped tokens (Clip runs) and of projected tokens (TROLL runs), in percent."""
    names = set(data.metric_names())
    panels = [
        (m, t, TRAIN_WINDOW)
        for m, t in (
            (metric_names.PG_CLIPFRAC, "clipped tokens (actor/pg_clipfrac)"),
            (metric_names.TROLL_PROJECTED_FRAC, "projected tokens (troll/projected_frac)"),
        )
        if m in names
    ]
    if not panels:
        raise SkipItem(f"no run logs {metric_names.PG_CLIPFRAC} or {metric_names.TROLL_PROJECTED_FRAC}")
    return panels_figure(
        data,
        panels,
        "fraction of tokens (%)",
        "clip_vs_projection",
        "Clipped vs projected token fraction",
        "Percentage of response tokens whose ratio was clipped (Clip objective) or whose distribution was projected onto the trust region (TROLL).",
        reproduces="TROLL (arXiv 2510.03817) Figure 18 (middle row)",
        scale=100.0,
        ncols=2,
    )


def all_metrics_figure(data: ExperimentData, max_panels: int = 24) -> Figure:
    names = [
        m for m in data.metric_names() if np.isfinite(data.metrics.loc[data.metrics["metric"] == m, "value"]).any()
    ]
    if not names:
        raise SkipItem("no metrics logged")
    extra = len(names) - max_panels
    fig = panels_figure(
        data,
        [(m, m, TRAIN_WINDOW) for m in names[:max_panels]],
        "value",
        "all_metrics",
        "Every logged metric",
        "Each logged metric per method (mean over seeds, raw faint, smoothed as lines). "
        + LINE_STYLE_NOTE
        + (f" {extra} further metrics not shown." if extra > 0 else ""),
        ncols=4,
    )
    return fig
