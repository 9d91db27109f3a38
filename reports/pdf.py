"""The report's PDF without a browser: reportlab lays out the same tables and figures on A4 pages.

Why: headless Chromium prints the very HTML a reader opens (``reports.chromium``) but is a system
package a fresh machine may lack; a report must not fail, after a whole sweep ran, for want of it.
reportlab is pure Python and always installed. Layout rules:

- A4 portrait pages for text, figures and the tables that fit its width (body 9 pt, cells 8 to
  7 pt); a table too wide for that goes on landscape pages, where the tables after it stay while
  they fit (cells down to 6.5 pt for the widest ones, which may also break long words).
- A table is never split by column: every column is on the page and cells wrap. A short column
  (numbers, intervals, verdicts) keeps its cells on one line, the columns of longer text share
  the rest of the width; rows continue on the next page under a repeated header. A repeated
  outer index value is left blank, as in the HTML table; the caption and notes follow directly
  under the table (the last rows come along to the next page rather than leave them alone).
- A figure is its matplotlib object (``Figure.mpl``) drawn to PNG at 200 dpi (or the build's PNG),
  at the page width keeping its aspect (smaller if the page is too short), with its title above
  and its caption below, on one page.
- The first page holds the title, description, meta lines, contents and a line saying this is the
  fallback rendering and how to get the Chromium PDF; items not built are listed at the end.

Text is set in DejaVu Sans (shipped with matplotlib), which has the ±, Δ, ≥ of the cells.

    from reports.pdf import render_pdf
    render_pdf("report.pdf", result_title, description, meta, built_items)
"""

from __future__ import annotations

import io
from pathlib import Path
from xml.sax.saxutils import escape

from reportlab.lib import colors
from reportlab.lib.enums import TA_LEFT
from reportlab.lib.pagesizes import A4, landscape
from reportlab.lib.styles import ParagraphStyle
from reportlab.lib.units import mm
from reportlab.lib.utils import ImageReader
from reportlab.pdfbase import pdfmetrics
from reportlab.pdfbase.ttfonts import TTFont
from reportlab.platypus import (
    BaseDocTemplate,
    CondPageBreak,
    Frame,
    Image,
    KeepTogether,
    NextPageTemplate,
    PageBreak,
    PageTemplate,
    Paragraph,
    Spacer,
    Table,
    TableStyle,
)

from reports.chromium import chromium_hint
from reports.pdf_flowables import Captioned

MARGIN = 14 * mm
BODY_PT = 9.0
CAPTION_PT = 8.0
# table cell sizes tried in order: portrait first, then landscape; the last one only for the widest tables
PORTRAIT_SIZES = (8.0, 7.5, 7.0)
LANDSCAPE_SIZES = (8.0, 7.5, 7.0, 6.5)
MIN_CELL_PT = 6.5
CELL_PAD = 2.5  # points left and right of a cell's text
SHORT_EM = 16  # a column whose widest cell is narrower than this many ems (of the cell size) does not wrap
LONG_EM = 11  # the least width of a wrapping column, in ems
FIGURE_DPI = 200
INK, MUTED, LINE, HEAD, PAPER = "#1d2430", "#5b6575", "#d7dce3", "#f4f6f9", "#8a5a00"
VERDICT_COLOURS = {
    "verdict-supported": "#1e7b34",
    "verdict-contradicted": "#c0392b",
    "verdict-underpowered": "#8a5a00",
    "verdict-pinned-at-a-cap": "#8a5a00",
    "verdict-not-evidence": "#5b3f8c",
}

FONT, BOLD, ITALIC = "DejaVuSans", "DejaVuSans-Bold", "DejaVuSans-Oblique"


def _register_fonts() -> None:
    if FONT in pdfmetrics.getRegisteredFontNames():
        return
    import matplotlib

    ttf = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    for name in (FONT, BOLD, ITALIC):
        pdfmetrics.registerFont(TTFont(name, str(ttf / f"{name}.ttf")))
    pdfmetrics.registerFontFamily(FONT, normal=FONT, bold=BOLD, italic=ITALIC, boldItalic=BOLD)


def _styles() -> dict[str, ParagraphStyle]:
    base = ParagraphStyle("body", fontName=FONT, fontSize=BODY_PT, leading=BODY_PT * 1.3, textColor=INK)
    return {
        "body": base,
        "title": ParagraphStyle("title", base, fontName=BOLD, fontSize=17, leading=21, spaceAfter=6),
        "heading": ParagraphStyle(
            "heading", base, fontName=BOLD, fontSize=11, leading=14, spaceBefore=10, spaceAfter=4, keepWithNext=True
        ),  # fmt: skip
        "caption": ParagraphStyle(
            "caption", base, fontSize=CAPTION_PT, leading=CAPTION_PT * 1.3, textColor=MUTED, spaceBefore=3
        ),  # fmt: skip
        "note": ParagraphStyle(
            "note", base, fontSize=CAPTION_PT, leading=CAPTION_PT * 1.3, textColor=MUTED, leftIndent=10, bulletIndent=2
        ),  # fmt: skip
        "meta": ParagraphStyle("meta", base, leftIndent=10),
    }


def _text(value: object) -> str:
    """Paragraph markup of plain text (escaped; line breaks kept)."""
    return escape(str(value)).replace("\n", "<br/>")


# -- tables ---------------------------------------------------------------------------------------
def _table_cells(table) -> tuple[list[list[str]], list[list[str]], int]:
    """(header rows, body rows, number of index columns) as plain strings, outer index repeats blank."""
    from analysis.tables.base import _spans

    names = table._index_names()
    cols = table._column_tuples()
    levels = len(cols[0]) if cols else 1
    header = []
    for level in range(levels):
        row = [name if level == levels - 1 else "" for name in names]
        for label, span, _ in _spans(cols, level):
            row += [label] + [""] * (span - 1)
        header.append(row)
    body, prev = [], ()
    for r, idx in enumerate(table._index_tuples()):
        shown = ["" if i < len(idx) - 1 and prev[: i + 1] == idx[: i + 1] else v for i, v in enumerate(idx)]
        body.append([*shown, *(str(v) for v in table.display.iloc[r])])
        prev = idx
    return header, body, len(names)


def _bold(table, n_index: int) -> list[list[bool]]:
    """Which body cells are set in bold (index, "ours" columns, coloured verdicts), as ``_table_flowable`` does."""
    cols, classes = table._column_tuples(), table.cell_classes
    return [
        [True] * n_index
        + [
            "paper" not in col
            and ("ours" in col or (classes is not None and str(classes.iat[r, c]) in VERDICT_COLOURS))
            for c, col in enumerate(cols)
        ]
        for r in range(len(table.display))
    ]


def _widths(header, body, bold, size: float, frame: float, strict: bool = True) -> list[float] | None:
    """Column widths within ``frame`` at font ``size``, or None when the table does not fit.

    strict: a short column (text narrower than ``SHORT_EM`` ems: numbers, intervals, verdicts) keeps
    its text on one line and each long column gets at least ``LONG_EM`` ems; the long columns share
    the rest in proportion to their text. Not strict: every column just gets its longest word."""
    n = len(header[-1])
    natural, minimal = [0.0] * n, [0.0] * n
    for r, row in enumerate([*header, *body]):
        is_head = r < len(header)
        for j, text in enumerate(row):
            if is_head and r < len(header) - 1:
                continue  # spanned labels wrap inside their span
            font = BOLD if is_head or bold[r - len(header)][j] else FONT
            words = str(text).split()
            longest = max((pdfmetrics.stringWidth(w, font, size) for w in words), default=0.0)
            minimal[j] = max(minimal[j], longest + 2 * CELL_PAD)
            if not is_head:
                line = max((pdfmetrics.stringWidth(s, font, size) for s in str(text).split("\n")), default=0.0)
                natural[j] = max(natural[j], line + 2 * CELL_PAD)
    natural = [max(a, b) for a, b in zip(natural, minimal)]
    if sum(natural) <= frame:
        return natural
    if strict:
        short = [w <= SHORT_EM * size for w in natural]
        floor = [w if s else max(m, LONG_EM * size) for w, m, s in zip(natural, minimal, short)]
    else:
        short, floor = [False] * n, minimal
    if sum(floor) > frame:
        return None
    extra = [0.0 if s else w - f for w, f, s in zip(natural, floor, short)]
    total = sum(extra) or 1.0
    return [f + (frame - sum(floor)) * e / total for f, e in zip(floor, extra)]


def _layout(header, body, bold, portrait_w: float, landscape_w: float, current: str) -> tuple[str, float, list[float]]:
    """(orientation, font size, column widths): the largest portrait size that fits, else landscape; on a
    landscape page already, a table that fits there stays (no half-empty page to turn the paper)."""
    options = [("portrait", PORTRAIT_SIZES, portrait_w), ("landscape", LANDSCAPE_SIZES, landscape_w)]
    if current == "landscape":
        options.reverse()
    for strict in (True, False):
        for orientation, sizes, frame in options:
            for size in sizes:
                widths = _widths(header, body, bold, size, frame, strict)
                if widths is not None:
                    return orientation, size, widths
    # wider still: the smallest size, columns scaled down (Paragraph then breaks words inside)
    widths = _widths(header, body, bold, MIN_CELL_PT, 1e9)
    return "landscape", MIN_CELL_PT, [w * landscape_w / sum(widths) for w in widths]


def _table_flowable(table, size: float, widths: list[float], header, body, n_index: int) -> Table:
    cell = ParagraphStyle("cell", fontName=FONT, fontSize=size, leading=size * 1.22, textColor=INK, alignment=TA_LEFT)
    head = ParagraphStyle("head", cell, fontName=BOLD)
    idx = ParagraphStyle("idx", cell, fontName=BOLD)
    cols = table._column_tuples()
    classes = table.cell_classes
    rows = [[Paragraph(_text(t), head) for t in row] for row in header]
    for r, row in enumerate(body):
        out = []
        for j, text in enumerate(row):
            if j < n_index:
                out.append(Paragraph(_text(text), idx))
                continue
            c = j - n_index
            markup = _text(text)
            if "paper" in cols[c]:
                markup = f'<font color="{PAPER}"><i>{markup}</i></font>'
            elif "ours" in cols[c]:
                markup = f"<b>{markup}</b>"
            cls = str(classes.iat[r, c]) if classes is not None and classes.iat[r, c] else ""
            if cls in VERDICT_COLOURS:
                markup = f'<font color="{VERDICT_COLOURS[cls]}"><b>{markup}</b></font>'
            elif cls in ("verdict-not-checked", "verdict-shown"):
                markup = f'<font color="{MUTED}">{markup}</font>'
            out.append(Paragraph(markup, cell))
        rows.append(out)
    n_head = len(header)
    style = [
        ("VALIGN", (0, 0), (-1, -1), "TOP"),
        ("LEFTPADDING", (0, 0), (-1, -1), CELL_PAD),
        ("RIGHTPADDING", (0, 0), (-1, -1), CELL_PAD),
        ("TOPPADDING", (0, 0), (-1, -1), 1.5),
        ("BOTTOMPADDING", (0, 0), (-1, -1), 2),
        ("BACKGROUND", (0, 0), (-1, n_head - 1), colors.HexColor(HEAD)),
        ("LINEABOVE", (0, 0), (-1, 0), 0.6, colors.HexColor(INK)),
        ("LINEBELOW", (0, n_head - 1), (-1, n_head - 1), 0.6, colors.HexColor(INK)),
        ("LINEBELOW", (0, n_head), (-1, -1), 0.25, colors.HexColor(LINE)),
        ("LINEBELOW", (0, -1), (-1, -1), 0.6, colors.HexColor(INK)),
    ]
    for level, row in enumerate(header[:-1]):  # merged labels of the upper header levels
        j = n_index
        while j < len(row):
            k = j + 1
            while k < len(row) and row[k] == "":
                k += 1
            if k - j > 1:
                style.append(("SPAN", (j, level), (k - 1, level)))
            j = k
    return Table(rows, colWidths=widths, repeatRows=n_head, hAlign="LEFT", style=TableStyle(style))


def _table_story(label: str, table, size: float, widths: list[float], frame_h: float, st) -> list:
    header, body, n_index = _table_cells(table)
    flow = _table_flowable(table, size, widths, header, body, n_index)
    heading = Paragraph(_text(f"{label} {table.title}"), st["heading"])
    under = [Paragraph(_text(f"{label} {table.caption}"), st["caption"])]
    under += [Paragraph(_text(n), st["note"], bulletText="•") for n in table.notes]
    _, h = flow.wrap(sum(widths), frame_h)
    if h < 0.85 * frame_h:  # fits on a page: heading, table, caption and notes stay together
        return [KeepTogether([heading, flow, *under])]
    # a long table starts where its heading, header and a few rows fit, and continues on the next pages
    start = heading.wrap(sum(widths), frame_h)[1] + sum(flow._rowHeights[: len(header) + 4]) + 20
    heading.style = ParagraphStyle("heading-long", heading.style, keepWithNext=False)
    return [CondPageBreak(start), heading, Captioned(flow, under)]


# -- figures --------------------------------------------------------------------------------------
def _figure_story(label: str, figure, frame_w: float, frame_h: float, st) -> list:
    buf = io.BytesIO()
    if figure.mpl is not None:
        figure.mpl.savefig(buf, format="png", dpi=FIGURE_DPI, bbox_inches="tight", facecolor="white")
    else:  # no matplotlib object kept: the PNG the build wrote
        buf.write(figure.data)
    buf.seek(0)
    px_w, px_h = ImageReader(io.BytesIO(buf.getvalue())).getSize()
    title = Paragraph(_text(f"{label} {figure.title}"), st["heading"])
    caption = Paragraph(_text(f"{label} {figure.caption}"), st["caption"])
    room = frame_h - title.wrap(frame_w, frame_h)[1] - caption.wrap(frame_w, frame_h)[1] - 30
    w = frame_w
    h = w * px_h / px_w
    if h > room:
        w, h = room * px_w / px_h, room
    image = Image(buf, width=w, height=h, hAlign="CENTER")
    return [KeepTogether([title, image, caption])]


# -- document -------------------------------------------------------------------------------------
def _footer(experiment: str):
    def draw(canvas, doc) -> None:
        canvas.saveState()
        canvas.setFont(FONT, 7)
        canvas.setFillColor(colors.HexColor(MUTED))
        w, _ = canvas._pagesize
        canvas.drawString(MARGIN, MARGIN / 2, f"trustbench report {experiment}: reportlab rendering of report.html")
        canvas.drawRightString(w - MARGIN, MARGIN / 2, f"page {doc.page}")
        canvas.restoreState()

    return draw


def render_pdf(path: str | Path, title: str, description: str, meta: list[tuple[str, str]], items: list) -> Path:
    """Write ``items`` (``reports.build.BuiltItem``) to ``path`` as a multi-page PDF; returns the path."""
    _register_fonts()
    st = _styles()
    path = Path(path)
    path.unlink(missing_ok=True)
    portrait, wide = A4, landscape(A4)
    frames = {name: (size[0] - 2 * MARGIN, size[1] - 2 * MARGIN) for name, size in
              (("portrait", portrait), ("landscape", wide))}  # fmt: skip
    doc = BaseDocTemplate(
        str(path), pagesize=portrait, leftMargin=MARGIN, rightMargin=MARGIN, topMargin=MARGIN, bottomMargin=MARGIN,
        title=title, author="trustbench", creator="trustbench (reportlab rendering)",
    )  # fmt: skip
    experiment = dict(meta).get("Experiment", "EXPERIMENT")
    footer = _footer(experiment)
    doc.addPageTemplates([
        PageTemplate("portrait", [Frame(MARGIN, MARGIN, *frames["portrait"], id="p")], onPage=footer, pagesize=portrait),
        PageTemplate("landscape", [Frame(MARGIN, MARGIN, *frames["landscape"], id="l")], onPage=footer, pagesize=wide),
    ])  # fmt: skip

    counters = {"table": 0, "figure": 0}
    labels = []
    for it in items:
        counters[it.kind] += 1
        labels.append(f"{'Table' if it.kind == 'table' else 'Figure'} {counters[it.kind]}.")

    story: list = [Paragraph(_text(title), st["title"]), Paragraph(_text(description), st["body"]), Spacer(1, 6)]
    story += [Paragraph(f"<b>{_text(k)}:</b> {_text(v)}", st["meta"]) for k, v in meta]
    story += [
        Spacer(1, 6),
        Paragraph(
            "This PDF is the fallback (reportlab) rendering of report.html: no Chromium was found. The HTML file is "
            f"the reference; {_text(chromium_hint(experiment))}.",
            st["body"],
        ),
        Paragraph("Contents", st["heading"]),
    ]
    story += [
        Paragraph(_text(f"{lab} {it.title}" + ("" if it.status == "ok" else f"  ({it.status})")), st["meta"])
        for lab, it in zip(labels, items)
    ]

    current = "portrait"
    for lab, it in zip(labels, items):
        if it.status != "ok":
            continue
        if it.kind == "figure" and (getattr(it.obj, "mpl", None) is not None or it.obj.mime == "image/png"):
            orientation = "portrait"
            w, h = frames[orientation]
            part = _figure_story(lab, it.obj, w, h, st)
        elif it.kind == "table":
            header, body, n_index = _table_cells(it.obj)
            bold = _bold(it.obj, n_index)
            orientation, size, widths = _layout(
                header, body, bold, frames["portrait"][0], frames["landscape"][0], current
            )
            part = _table_story(lab, it.obj, size, widths, frames[orientation][1], st)
        else:
            continue
        if orientation != current:
            story += [NextPageTemplate(orientation), PageBreak()]
            current = orientation
        story += part

    missing = [f"{lab} {it.title}: {it.status}: {it.reason.splitlines()[0] if it.reason else ''}"
               for lab, it in zip(labels, items) if it.status != "ok"]  # fmt: skip
    if missing:
        story.append(Paragraph("Items not built", st["heading"]))
        story += [Paragraph(_text(m), st["note"], bulletText="•") for m in missing]
    doc.build(story)
    return path
