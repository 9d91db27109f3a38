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
    """{method label: matplotlib kwargs}: colour by algorithm tag, dashed unless objective is troll."""
    algos = []
    styles = {}
    for _, row in labels.drop_duplicates(schema.TAG_METHOD).iterrows():
        algo = row[schema.TAG_ALGORITHM] if pd.notna(row[schema.TAG_ALGORITHM]) else row[schema.TAG_METHOD]
        objectives = labels[schema.TAG_OBJECTIVE].dropna().unique()
        if algo not in algos:
            algos.append(algo)
        color = PALETTE[algos.index(algo) % len(PALETTE)]
        dashed = "troll" in set(objectives) and row[schema.TAG_OBJECTIVE] != "troll"
        styles[row[schema.TAG_METHOD]] = {"color": color, "linestyle": "--" if dashed else "-"}
    if len(set(map(lambda s: tuple(s["color"]), styles.values()))) < len(styles) and "troll" not in set(
        labels[schema.TAG_OBJECTIVE].dropna()
    ):
        # several methods share an algorithm but not by objective: give each its own colour
        styles = {m: {"color": PALETTE[i % len(PALETTE)], "linestyle": "-"} for i, m in enumerate(styles)}
    return styles
