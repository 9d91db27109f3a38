"""Figure conventions: Agg backend, one style, consistent method colours, SVG/PNG encoding.

Design: every figure builder returns a ``Figure`` (encoded image + title + caption naming the paper
figure it reproduces); reports embed it as an ``<img>`` data URI, so the HTML stays self-contained
and figures cannot clash (SVG ids, CSS). SVG is preferred (sharp in the PDF); a figure whose SVG
would exceed ``MAX_SVG_BYTES`` (thousands of points) is encoded as a 150 dpi PNG instead.

Colours follow the TROLL (arXiv 2510.03817) convention: one colour per estimator/algorithm, TROLL runs drawn
solid and Clip runs dashed, so "GRPO" and "GRPO+TROLL" share a colour.
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
PALETTE = sns.color_palette("tab10") + sns.color_palette("Dark2")
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
    """{method label: matplotlib kwargs}, one distinct style per method.

    the TROLL paper's convention where it applies: a Clip method and its TROLL counterpart (same tags
    except the objective) share a colour, TROLL solid and Clip dashed. Every other method gets its
    own colour, solid.
    """
    first = labels.drop_duplicates(metric_names.TAG_METHOD)
    keys = [
        metric_names.TAG_ALGORITHM,
        metric_names.TAG_ESTIMATOR,
        metric_names.TAG_MASK,
        metric_names.TAG_ENTROPY_CONTROL,
        metric_names.TAG_ROLLOUT_CORRECTION,
        metric_names.TAG_MODEL,
    ]
    groups: dict[tuple, dict[str, list[str]]] = {}
    for _, row in first.iterrows():
        key = tuple(str(row.get(k)) for k in keys)
        kind = "troll" if str(row[metric_names.TAG_OBJECTIVE]).startswith("troll") else "other"
        groups.setdefault(key, {"troll": [], "other": []})[kind].append(row[metric_names.TAG_METHOD])
    styles: dict[str, dict] = {}
    colour = 0
    for members in groups.values():
        if members["troll"] and members["other"]:
            c = PALETTE[colour % len(PALETTE)]
            colour += 1
            styles[members["other"][0]] = {"color": c, "linestyle": "--"}
            styles[members["troll"][0]] = {"color": c, "linestyle": "-"}
        for method in members["other"] + members["troll"]:
            if method not in styles:
                styles[method] = {"color": PALETTE[colour % len(PALETTE)], "linestyle": "-"}
                colour += 1
    return {m: styles[m] for m in first[metric_names.TAG_METHOD]}


def step_axis(ax) -> None:
    """Integer ticks for training-step axes."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
