"""TRM figures: acceptance rate and log PPL gap over training, acceptance by response length.

Reproduce the monitoring the paper recommends (TRM, arXiv 2512.23075, sections 6-7, appendix D.1): the overall
acceptance rate, the log absolute PPL gap (Figures 1-3), and acceptance stratified by length
compared with the i.i.d. model (1 - p)^T of Table D.1.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from analysis.aggregate import per_run
from analysis.figures.curves import TRAIN_WINDOW, panels_figure
from analysis.figures.style import Figure, method_styles, render, set_log, setup
from analysis.frames import ExperimentData
from analysis.names import accept_rate_buckets
from analysis.skip import SkipItem
from runners import metric_names
from runners.algorithms.bounds import trm_max_acceptance


def acceptance_figure(data: ExperimentData) -> Figure:
    return panels_figure(
        data,
        [
            (
                metric_names.TRM_ACCEPT_RATE,
                "sequences accepted (trm/accept_rate)",
                TRAIN_WINDOW,
                "fraction of sequences",
            ),
            (
                metric_names.TRM_PPL_GAP,
                "log absolute PPL gap (trm/ppl_gap)",
                TRAIN_WINDOW,
                "|log PPL(train) − log PPL(roll)|",
            ),
        ],
        "value",
        "trm_acceptance_curves",
        "TRM acceptance rate and PPL gap",
        "Left: fraction of sequences kept by the mask (1 for unmasked methods when logged). Right: log absolute PPL gap, "
        "the mean over sequences of |mean log-prob under the training policy − under the rollout policy|; mean over seeds.",
        reproduces="TRM (arXiv 2512.23075) Figures 1-3",
        ncols=2,
    )


def acceptance_by_length_figure(data: ExperimentData) -> Figure:
    buckets = accept_rate_buckets(data.metric_names())
    if not buckets:
        raise SkipItem("no run logs trm/accept_rate/len_<lo>_<hi> metrics")
    setup()
    styles = method_styles(data.labels())
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    mids = np.array([0.5 * (lo + hi) for lo, hi, _ in buckets])
    methods = None
    table = {}
    for j, (_, _, metric) in enumerate(buckets):
        f = per_run(data, metric, "mean")
        methods = list(dict.fromkeys(f[metric_names.TAG_METHOD])) if methods is None else methods
        for m, g in f.groupby(metric_names.TAG_METHOD):
            table.setdefault(m, np.full(len(buckets), np.nan))[j] = g["value"].mean()
    for m in methods:
        ax.plot(mids, table[m], marker="o", label=m, **styles.get(m, {}))
    T = np.geomspace(max(16, mids.min() / 2), max(mids.max() * 2, 16384), 200)
    for p, ls in ((1e-3, ":"), (1e-4, "-.")):
        ax.plot(
            T,
            trm_max_acceptance(p, T.round().astype(int)),
            color="0.3",
            ls=ls,
            lw=1,
            label=f"i.i.d. model (1-p)^T, p={p:g}",
        )
    set_log(ax, x=True)
    ax.set_xlabel("response length T (tokens, bucket midpoint)")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return render(
        fig,
        "trm_acceptance_by_length",
        "TRM acceptance by response length",
        "Mean acceptance rate (over steps and seeds) of the responses in each length bucket, plotted at the bucket "
        "midpoint, against the i.i.d. "
        "per-token violation model of TRM (arXiv 2512.23075) eq. 75 / Table D.1 for p = 1e-3 and 1e-4.",
        reproduces="TRM (arXiv 2512.23075) Table D.1 (appendix D.1)",
    )
