"""Figure conventions: Agg backend, one style, consistent method colours, SVG/PNG encoding.

Design: every figure builder returns a ``Figure`` (encoded image + title + caption naming the paper
figure it reproduces); reports embed it as an ``<img>`` data URI, so the HTML stays self-contained
and figures cannot clash (SVG ids, CSS). SVG is preferred (sharp in the PDF); a figure whose SVG
would exceed ``MAX_SVG_BYTES`` (thousands of points) is encoded as a 150 dpi PNG instead.

Colours: one per method, from colour-blind-safe palettes (Okabe and Ito's eight, then Paul Tol's "muted"
nine), in the order methods first appear. Line style says one thing in every figure: dashed for TROLL's
projection objective (``objective=troll*``), solid for every other objective (``LINE_STYLE_NOTE``, which
captions quote).
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass, field

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from runners import metric_names  # noqa: E402

MAX_SVG_BYTES = 700_000
# Okabe & Ito (2008), "Color Universal Design" (black moved last: it reads as a reference line), then Paul
# Tol's "muted" scheme: 17 colour-blind-safe colours before any repeats
OKABE_ITO = ["#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#000000"]
TOL_MUTED = ["#332288", "#88CCEE", "#44AA99", "#117733", "#999933", "#DDCC77", "#CC6677", "#882255", "#AA4499"]
PALETTE = [matplotlib.colors.to_rgb(c) for c in OKABE_ITO + TOL_MUTED]
LINE_STYLE_NOTE = (
    "Each method its own colour; dashed lines: TROLL's projection objective, solid: every other objective."
)
RAW_ALPHA = 0.25


@dataclass
class Figure:
    key: str
    title: str
    caption: str
    data: bytes
    mime: str
    reproduces: str = ""
    # the matplotlib figure itself (closed to pyplot, still drawable): the PDF route without a browser
    # (reports/pdf.py) draws it again as vector graphics
    mpl: object = field(default=None, repr=False, compare=False)

    def data_uri(self) -> str:
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode()}"

    @property
    def extension(self) -> str:
        return "svg" if self.mime == "image/svg+xml" else "png"


def setup() -> None:
    sns.set_theme(context="paper", style="whitegrid", font_scale=1.05)
    plt.rcParams.update(
        {"figure.dpi": 100, "svg.hashsalt": "trustbench", "axes.titleweight": "bold", "legend.frameon": False}
    )


def set_log(ax, x: bool = False, y: bool = False) -> None:
    """Log scale with major (decade) ticks only: minor log ticks cost ~0.5 s per figure to lay out."""
    from matplotlib.ticker import NullLocator

    for on, axis, set_scale in ((x, ax.xaxis, ax.set_xscale), (y, ax.yaxis, ax.set_yscale)):
        if on:
            set_scale("log")
            axis.set_minor_locator(NullLocator())


def render(fig, key: str, title: str, caption: str, reproduces: str = "") -> Figure:
    """Encode and close ``fig`` (SVG unless too large, then PNG)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    data, mime = buf.getvalue(), "image/svg+xml"
    if len(data) > MAX_SVG_BYTES:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=150, bbox_inches="tight")
        data, mime = buf.getvalue(), "image/png"
    plt.close(fig)
    return Figure(key=key, title=title, caption=caption, data=data, mime=mime, reproduces=reproduces, mpl=fig)


def method_styles(labels: pd.DataFrame) -> dict[str, dict]:
    """{method label: matplotlib kwargs}: one colour per method (``PALETTE``, in order of first appearance),
    dashed for a TROLL objective and solid otherwise (``LINE_STYLE_NOTE``)."""
    first = labels.drop_duplicates(metric_names.TAG_METHOD)
    styles: dict[str, dict] = {}
    for i, (_, row) in enumerate(first.iterrows()):
        troll = str(row.get(metric_names.TAG_OBJECTIVE, "")).startswith("troll")
        styles[row[metric_names.TAG_METHOD]] = {"color": PALETTE[i % len(PALETTE)], "linestyle": "--" if troll else "-"}
    return styles


def reproduces_if_run(labels: pd.DataFrame, algorithm: str, ref: str) -> tuple[str, str]:
    """(``reproduces`` text, caption note) for a figure drawn after a paper's figure of ``algorithm``: it
    reproduces ``ref`` only when the sweep ran that algorithm; otherwise the caption says it is drawn in that
    figure's form."""
    if algorithm in set(labels.get(metric_names.TAG_ALGORITHM, pd.Series(dtype=str)).astype(str)):
        return ref, ""
    return "", f" Drawn in the form of {ref}; this sweep has no {algorithm.upper().replace('TPPO', 'T-PPO')} run."


def step_axis(ax) -> None:
    """Integer ticks for training-step axes."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
