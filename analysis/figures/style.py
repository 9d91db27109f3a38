"""Figure conventions: Agg backend, one style, consistent method colours, SVG/PNG encoding.

Design: every figure builder returns a ``Figure`` (encoded image + title + caption naming the paper
figure it reproduces); reports embed it as an ``<img>`` data URI, so the HTML stays self-contained
and figures cannot clash (SVG ids, CSS). SVG is preferred (sharp in the PDF); a figure whose SVG
would exceed ``MAX_SVG_BYTES`` (thousands of points) is encoded as a 150 dpi PNG instead.

Colours follow the troll.txt convention: one colour per estimator/algorithm, TROLL runs drawn
solid and Clip runs dashed, so "GRPO" and "GRPO+TROLL" share a colour.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from runners import schema  # noqa: E402

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
    return Figure(key=key, title=title, caption=caption, data=data, mime=mime, reproduces=reproduces)


def method_styles(labels: pd.DataFrame) -> dict[str, dict]:
    """{method label: matplotlib kwargs}: colour per algorithm tag and, when the experiment mixes TROLL
    and other objectives, solid lines for TROLL and dashed for the rest (troll.txt's convention);
    otherwise one colour per method, all solid."""
    first = labels.drop_duplicates(schema.TAG_METHOD)
    objectives = first[schema.TAG_OBJECTIVE].astype(str)
    troll = objectives.str.startswith("troll")
    algos = [
        a if isinstance(a, str) and a else m for a, m in zip(first[schema.TAG_ALGORITHM], first[schema.TAG_METHOD])
    ]
    paired = troll.any() and (~troll).any() and len(set(algos)) < len(first)
    styles = {}
    if paired:
        order = list(dict.fromkeys(algos))
        for method, algo, is_troll in zip(first[schema.TAG_METHOD], algos, troll):
            styles[method] = {
                "color": PALETTE[order.index(algo) % len(PALETTE)],
                "linestyle": "-" if is_troll else "--",
            }
    else:
        for i, method in enumerate(first[schema.TAG_METHOD]):
            styles[method] = {"color": PALETTE[i % len(PALETTE)], "linestyle": "-"}
    return styles
