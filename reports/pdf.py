"""The report's PDF without a browser: matplotlib's PdfPages renders the same tables and figures.

Why: headless Chromium prints the very HTML a reader opens (``reports.chromium``) but is a system
package a fresh machine may lack; a report must not fail, after a whole sweep ran, for want of it.
matplotlib is always installed: figures are drawn again from their matplotlib objects (vector
graphics, ``Figure.mpl``), tables are laid out as matplotlib tables (rows and columns split over
pages when they do not fit an A4 landscape page), with captions and notes beneath. The page says it
is the fallback rendering; the HTML report stays the reference.

    from reports.pdf import render_pdf
    render_pdf("report.pdf", result_title, description, meta, built_items)
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.backends.backend_pdf import PdfPages  # noqa: E402

A4_LANDSCAPE = (11.69, 8.27)
LINE_HEIGHT = 0.028  # of the table axes, per text line of a cell
LINES_PER_PAGE = 34
CHARS_PER_PAGE = 220  # table width budget (characters of the widest cell per column)
CELL_WRAP = 48


def _wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.fill(p, width) for p in str(text).split("\n"))


def _text_page(pdf: PdfPages, heading: str, lines: list[str]) -> None:
    fig = plt.figure(figsize=A4_LANDSCAPE)
    fig.text(0.04, 0.95, _wrap(heading, 75), fontsize=16, weight="bold", va="top")
    fig.text(
        0.04,
        0.95 - 0.045 * (_wrap(heading, 75).count("\n") + 1),
        "\n".join(_wrap(line, 150) for line in lines),
        fontsize=8.5,
        va="top",
        linespacing=1.5,
    )
    pdf.savefig(fig)
    plt.close(fig)


def _column_chunks(widths: list[int], n_index: int) -> list[list[int]]:
    """Column indices per page: index columns on every page, the rest within CHARS_PER_PAGE."""
    fixed = sum(widths[:n_index])
    chunks, current, used = [], [], fixed
    for j in range(n_index, len(widths)):
        if current and used + widths[j] > CHARS_PER_PAGE:
            chunks.append(current)
            current, used = [], fixed
        current.append(j)
        used += widths[j]
    return [list(range(n_index)) + c for c in (chunks + [current] if current else chunks or [[]])]


def _row_chunks(cells: list[list[str]], budget: int) -> list[list[list[str]]]:
    """Rows per page so that the text lines of a page stay within ``budget``."""
    chunks, current, used = [], [], 0
    for row in cells:
        lines = max((c.count("\n") + 1 for c in row), default=1)
        if current and used + lines > budget:
            chunks.append(current)
            current, used = [], 0
        current.append(row)
        used += lines
    return chunks + [current] if current else chunks or [[]]


def _table_pages(pdf: PdfPages, label: str, table) -> None:
    """One or more pages holding ``table`` (an ``analysis.tables.base.Table``)."""
    names = table._index_names()
    header = [_wrap(h, 24) for h in [*names, *(" / ".join(c) for c in table._column_tuples())]]
    cells, prev = [], ()
    for r, idx in enumerate(table._index_tuples()):
        # a repeated outer index value is left blank, as in the HTML table
        shown = ["" if i < len(idx) - 1 and prev[: i + 1] == idx[: i + 1] else v for i, v in enumerate(idx)]
        cells.append([_wrap(c, CELL_WRAP) for c in [*shown, *(str(v) for v in table.display.iloc[r])]])
        prev = idx
    widths = [max(len(line) for text in [header[j], *(row[j] for row in cells)] for line in text.split("\n")) + 2
              for j in range(len(header))]  # fmt: skip
    head_lines = max(h.count("\n") + 1 for h in header)
    pages = [
        (rc, cc) for rc in _row_chunks(cells, LINES_PER_PAGE - head_lines) for cc in _column_chunks(widths, len(names))
    ]
    for k, (rchunk, cols) in enumerate(pages):
        fig = plt.figure(figsize=A4_LANDSCAPE)
        part = f"  (part {k + 1} of {len(pages)})" if len(pages) > 1 else ""
        fig.text(0.03, 0.965, f"{label} {table.title}{part}", fontsize=12, weight="bold", va="top")
        ax = fig.add_axes([0.03, 0.2, 0.94, 0.72])
        ax.axis("off")
        if rchunk:
            body = [[row[j] for j in cols] for row in rchunk]
            mpl_table = ax.table(cellText=body, colLabels=[header[j] for j in cols], loc="upper left", cellLoc="left")
            mpl_table.auto_set_font_size(False)
            mpl_table.set_fontsize(6.5)
            total = sum(widths[j] for j in cols)
            lines = [head_lines] + [max(t.count("\n") + 1 for t in row) for row in body]
            for (r, c), cell in mpl_table.get_celld().items():
                cell.set_width(widths[cols[c]] / max(total, 1))
                cell.set_height(LINE_HEIGHT * lines[r])
                cell.set_linewidth(0.3)
                if r == 0:
                    cell.set_facecolor("#f4f6f9")
        caption = [_wrap(f"{label} {table.caption}", 190)] + [_wrap("• " + n, 190) for n in table.notes]
        fig.text(0.03, 0.17, "\n".join(caption), fontsize=6.5, va="top", color="#444444")
        pdf.savefig(fig)
        plt.close(fig)


def _figure_page(pdf: PdfPages, label: str, figure) -> None:
    fig = figure.mpl
    fig.suptitle(f"{label} {figure.title}", fontsize=10, weight="bold", y=1.02)
    fig.text(0.0, -0.02, _wrap(f"{label} {figure.caption}", 150), fontsize=6.5, va="top", color="#444444")
    pdf.savefig(fig, bbox_inches="tight")


def render_pdf(path: str | Path, title: str, description: str, meta: list[tuple[str, str]], items: list) -> Path:
    """Write ``items`` (``reports.build.BuiltItem``) to ``path`` as a multi-page PDF; returns the path."""
    path = Path(path)
    path.unlink(missing_ok=True)
    counters = {"table": 0, "figure": 0}
    labels = []
    for it in items:
        counters[it.kind] += 1
        labels.append(f"{'Table' if it.kind == 'table' else 'Figure'} {counters[it.kind]}.")
    with PdfPages(path, metadata={"Title": title, "Creator": "trustbench (matplotlib rendering)"}) as pdf:
        contents = [
            f"{lab} {it.title}" + ("" if it.status == "ok" else f"  ({it.status})") for lab, it in zip(labels, items)
        ]
        intro = [description, "", *(f"{k}: {v}" for k, v in meta), "",
                 "This PDF is the matplotlib rendering of report.html (no Chromium was found); the HTML file is the "
                 "reference. Contents:", *contents]  # fmt: skip
        _text_page(pdf, title, intro)
        for lab, it in zip(labels, items):
            if it.status != "ok":
                continue
            if it.kind == "figure" and getattr(it.obj, "mpl", None) is not None:
                _figure_page(pdf, lab, it.obj)
            elif it.kind == "table":
                _table_pages(pdf, lab, it.obj)
        missing = [f"{lab} {it.title}: {it.status}: {it.reason.splitlines()[0] if it.reason else ''}"
                   for lab, it in zip(labels, items) if it.status != "ok"]  # fmt: skip
        if missing:
            _text_page(pdf, "Items not built", missing)
    return path
