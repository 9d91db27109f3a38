"""A reproduced table and its three renderings (HTML, Markdown, LaTeX).

Design: a builder returns ``Table(values=<numeric frame>, display=<string frame>)`` with the same
shape; tests read ``values`` (numbers), renderers read ``display`` (formatted cells such as
"0.53 ± 0.05"). Columns may be a MultiIndex; a level value "paper" or "ours" marks the source of a
column (HTML gives those cells the classes ``paper`` / ``ours``). The renderers are written here
rather than taken from pandas so that merged headers, the ours/paper classes and LaTeX escaping
behave the same in all three formats without optional dependencies (tabulate).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

MISSING = "–"


def fmt_num(x: object, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return MISSING
    if isinstance(x, (int, np.integer)):
        return str(x)
    try:
        return f"{float(x):.{digits}f}"
    except (TypeError, ValueError):
        return str(x)


def fmt_mean_std(mean: float, std: float, digits: int = 2) -> str:
    if not np.isfinite(mean):
        return MISSING
    if not np.isfinite(std):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def fmt_change(abs_change: float, rel_change: float, digits: int = 2) -> str:
    """the Entropy-preserving RL paper's "+0.13 (+91%)" format."""
    if not np.isfinite(abs_change):
        return MISSING
    rel = f" ({rel_change * 100:+.0f}%)" if np.isfinite(rel_change) else ""
    return f"{abs_change:+.{digits}f}{rel}"


@dataclass
class Table:
    """A table of the report: numbers, their display strings, and what it reproduces."""

    key: str
    title: str
    caption: str
    values: pd.DataFrame
    display: pd.DataFrame | None = None
    reproduces: str = ""
    notes: list[str] = field(default_factory=list)
    digits: int = 3
    # secondary numbers shown inside display cells (e.g. "std" of a "mean ± std" cell), same shape
    aux: dict[str, pd.DataFrame] = field(default_factory=dict)
    # extra CSS classes of display cells (same shape; "" for none), e.g. "verdict-supported"
    cell_classes: pd.DataFrame | None = None

    def __post_init__(self) -> None:
        if self.display is None:
            self.display = self.values.map(lambda v: fmt_num(v, self.digits))
        if self.display.shape != self.values.shape:
            raise ValueError(
                f"table {self.key!r}: display shape {self.display.shape} != values shape {self.values.shape}"
            )

    # -- rendering ----------------------------------------------------------------------------
    def _column_tuples(self) -> list[tuple[str, ...]]:
        cols = self.display.columns
        return [tuple(map(str, c)) if isinstance(c, tuple) else (str(c),) for c in cols]

    def _index_tuples(self) -> list[tuple[str, ...]]:
        idx = self.display.index
        return [tuple(map(str, i)) if isinstance(i, tuple) else (str(i),) for i in idx]

    def _index_names(self) -> list[str]:
        return [str(n) if n is not None else "" for n in self.display.index.names]

    def to_html(self) -> str:
        cols, rows = self._column_tuples(), self._index_tuples()
        names = self._index_names()
        n_levels = len(cols[0]) if cols else 1
        out = [f'<table class="tb-table" id="table-{html.escape(self.key)}">', "<thead>"]
        for level in range(n_levels):
            cells = []
            for name in names:
                text = name if level == n_levels - 1 else ""
                cells.append(f'<th class="idx">{html.escape(text)}</th>')
            for label, span, classes in _spans(cols, level):
                cls = f' class="{" ".join(classes)}"' if classes else ""
                colspan = f' colspan="{span}"' if span > 1 else ""
                cells.append(f"<th{cls}{colspan}>{html.escape(label)}</th>")
            out.append("<tr>" + "".join(cells) + "</tr>")
        out.append("</thead><tbody>")
        prev: tuple[str, ...] = ()
        for r, row in enumerate(rows):
            cells = []
            for i, value in enumerate(row):
                same = i < len(row) - 1 and prev[: i + 1] == row[: i + 1]
                cells.append(f'<th class="idx">{"" if same else html.escape(value)}</th>')
            for c, col in enumerate(cols):
                classes = [s for s in ("ours", "paper") if s in col]
                if self.cell_classes is not None and self.cell_classes.iat[r, c]:
                    classes.append(str(self.cell_classes.iat[r, c]))
                cls = f' class="{" ".join(classes)}"' if classes else ""
                cells.append(f"<td{cls}>{html.escape(str(self.display.iat[r, c]))}</td>")
            out.append("<tr>" + "".join(cells) + "</tr>")
            prev = row
        out.append("</tbody></table>")
        return "\n".join(out)

    def to_markdown(self) -> str:
        cols, rows = self._column_tuples(), self._index_tuples()
        header = self._index_names() + [" / ".join(c) for c in cols]
        lines = [f"**{self.title}**", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for r, row in enumerate(rows):
            cells = list(row) + [str(self.display.iat[r, c]) for c in range(len(cols))]
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
        lines += ["", self.caption]
        return "\n".join(lines) + "\n"

    def to_latex(self) -> str:
        cols, rows = self._column_tuples(), self._index_tuples()
        names = self._index_names()
        n_levels = len(cols[0]) if cols else 1
        spec = "l" * len(names) + "r" * len(cols)
        out = [r"\begin{table}[t]", r"\centering", r"\small", rf"\begin{{tabular}}{{{spec}}}", r"\toprule"]
        for level in range(n_levels):
            cells = [_tex(n) if level == n_levels - 1 else "" for n in names]
            for label, span, _ in _spans(cols, level):
                cells.append(rf"\multicolumn{{{span}}}{{c}}{{{_tex(label)}}}" if span > 1 else _tex(label))
            out.append(" & ".join(cells) + r" \\")
        out.append(r"\midrule")
        prev: tuple[str, ...] = ()
        for r, row in enumerate(rows):
            cells = ["" if (i < len(row) - 1 and prev[: i + 1] == row[: i + 1]) else _tex(v) for i, v in enumerate(row)]
            cells += [_tex(str(self.display.iat[r, c])) for c in range(len(cols))]
            out.append(" & ".join(cells) + r" \\")
            prev = row
        out += [
            r"\bottomrule",
            r"\end{tabular}",
            rf"\caption{{{_tex(self.caption)}}}",
            rf"\label{{tab:{self.key}}}",
            r"\end{table}",
        ]
        return "\n".join(out) + "\n"


def _spans(cols: list[tuple[str, ...]], level: int) -> list[tuple[str, int, list[str]]]:
    """Merged header cells of one level: (label, colspan, css classes); merges equal neighbours
    whose higher levels are equal too."""
    spans: list[tuple[str, int, list[str]]] = []
    prev_key = None
    for col in cols:
        key = col[: level + 1]
        if key == prev_key:
            label, span, classes = spans[-1]
            spans[-1] = (label, span + 1, classes)
        else:
            label = col[level]
            spans.append((label, 1, [label] if label in ("ours", "paper") else []))
        prev_key = key
    return spans


_TEX_ESCAPES = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "±": r"$\pm$",
    "–": "--",
    "Δ": r"$\Delta$",
    "≤": r"$\le$",
    "≥": r"$\ge$",
    "×": r"$\times$",
}


def _tex(text: str) -> str:
    return "".join(_TEX_ESCAPES.get(ch, ch) for ch in str(text))
