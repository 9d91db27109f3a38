"""The PDF route without a browser: `trustbench report` with no Chromium on PATH exits 0 with the HTML
report and a reportlab-laid-out PDF, and says how to get the Chromium PDF; the renderer choice is
checked with stand-in Chromium binaries (one that prints a PDF, one that crashes). The reportlab PDF
itself is read back with pypdf (an independent PDF parser): every built item is in it, no table row
is split over pages by column, type is never below 6.5 pt, and it is shorter than the 20 pages the
former matplotlib fallback drew for the same demo-shaped report."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from pypdf import PdfReader
from pypdf.generic import ContentStream

from analysis.synthetic import log_synthetic_experiment, profile, synthetic_data
from analysis.tables.base import Table
from reports.build import BuiltItem, build_report
from reports.pdf import render_pdf
from reports.registry import get_report

ROOT = Path(__file__).resolve().parents[2]
# pages of the matplotlib fallback this renderer replaced, measured on the `demo_pdf` input below
MATPLOTLIB_PAGES = 20


def _pages(pdf: Path) -> int:
    return len(PdfReader(pdf).pages)


def _squash(text: str) -> str:
    """Text without whitespace: a wrapped cell reads the same as the unwrapped one."""
    return re.sub(r"\s+", "", text)


def _page_texts(pdf: Path) -> list[str]:
    return [_squash(page.extract_text()) for page in PdfReader(pdf).pages]


def _font_sizes(pdf: Path) -> set[float]:
    """Every size set by a ``Tf`` operator in the pages' content streams."""
    reader = PdfReader(pdf)
    return {
        float(operands[1])
        for page in reader.pages
        for operands, op in ContentStream(page.get_contents(), reader).operations
        if op == b"Tf"
    }


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory):
    home = tmp_path_factory.mktemp("pdf_home")
    uri = f"sqlite:///{home}/mlflow.db"
    spec = profile("demo", steps=12, seeds=(0, 1))
    spec = replace(spec, methods=spec.methods[:3], eval_every=2)
    log_synthetic_experiment(uri, spec)
    return home, uri


def _env(home: Path, path: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TRUSTBENCH_CHROMIUM", "MLFLOW_TRACKING_URI")}
    env.update(PATH=path, TRUSTBENCH_HOME=str(home), PYTHONPATH=str(ROOT), MPLBACKEND="Agg")
    return env


@pytest.mark.slow
@pytest.mark.e2e
def test_report_command_without_chromium_exits_0_with_html_and_a_pdf(demo_store, tmp_path):
    home, uri = demo_store
    empty = tmp_path / "bin"
    empty.mkdir()  # PATH holds no browser (nor anything else): the report must not need one
    out = tmp_path / "report"
    cmd = [sys.executable, "-m", "runners.cli", "report", "demo", "--tracking-uri", uri, "--out", str(out), "--quiet"]
    proc = subprocess.run(cmd, env=_env(home, str(empty)), capture_output=True, text=True, timeout=600, cwd=home)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (out / "report.html").stat().st_size > 10_000
    pdf = out / "report.pdf"
    assert pdf.read_bytes()[:5] == b"%PDF-"
    spec = get_report("demo")
    text = "".join(_page_texts(pdf))
    # the first page's contents list every registered item
    assert f"Table{spec.count('table')}." in text and f"Figure{spec.count('figure')}." in text
    assert "(reportlab)" in proc.stdout
    assert "apt-get install chromium" in proc.stdout and "--pdf-renderer chromium" in proc.stdout
    # asking for the browser explicitly still fails clearly when there is none
    strict = subprocess.run(
        [*cmd, "--pdf-renderer", "chromium", "--no-mlflow"],
        env=_env(home, str(empty)), capture_output=True, text=True, timeout=600, cwd=home,
    )  # fmt: skip
    assert strict.returncode == 3
    assert "needs headless Chromium" in strict.stderr and "Traceback" not in strict.stderr


def _fake_chromium(path: Path, works: bool) -> Path:
    """A stand-in browser: writes a one-line PDF where --print-to-pdf= points (or crashes)."""
    script = path / "chromium"
    body = (
        'for a in "$@"; do case "$a" in --print-to-pdf=*) printf "%%PDF-1.4 stand-in" > "${a#--print-to-pdf=}";; esac; done'
        if works
        else 'echo "crashed" >&2; exit 1'
    )
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("works", [True, False])
def test_auto_renderer_uses_chromium_when_it_works_and_falls_back_when_it_fails(tmp_path, monkeypatch, works):
    spec = profile("demo", steps=6, seeds=(0,))
    data, _ = synthetic_data(replace(spec, methods=spec.methods[:2], families=spec.families - {"trm"}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_chromium(bin_dir, works)
    monkeypatch.delenv("TRUSTBENCH_CHROMIUM", raising=False)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/bin{os.pathsep}/usr/bin")
    result = build_report(
        "demo", tracking_uri="sqlite:///unused.db", out_dir=tmp_path / "r", data=data, pdf=True, log_to_mlflow=False
    )
    head = result.pdf.read_bytes()[:24]
    if works:
        assert (result.pdf_renderer, result.pdf_note) == ("chromium", "")
        assert head == b"%PDF-1.4 stand-in"
    else:
        assert result.pdf_renderer == "reportlab" and head.startswith(b"%PDF-")
        assert "Chromium failed" in result.pdf_note and "apt-get install chromium" in result.pdf_note
        text = "".join(_page_texts(result.pdf))
        assert all(_squash(f"{i.title}") in text for i in result.items if i.status == "ok")


@pytest.fixture(scope="module")
def demo_pdf(tmp_path_factory):
    """The demo report's items on synthetic runs without TRM metrics (one figure skipped), as a reportlab PDF."""
    spec = profile("demo", steps=6, seeds=(0, 1))
    data, _ = synthetic_data(replace(spec, families=spec.families - {"trm"}))
    out = tmp_path_factory.mktemp("reportlab_pdf")
    return build_report(
        "demo", tracking_uri="sqlite:///unused.db", out_dir=out, data=data, pdf="reportlab", log_to_mlflow=False
    )


def _labels(items: list[BuiltItem]) -> list[str]:
    counters = {"table": 0, "figure": 0}
    out = []
    for it in items:
        counters[it.kind] += 1
        out.append(f"{'Table' if it.kind == 'table' else 'Figure'} {counters[it.kind]}.")
    return out


def test_reportlab_pdf_holds_every_built_item_and_lists_the_skipped(demo_pdf):
    result = demo_pdf
    assert result.pdf_renderer == "reportlab"
    pages = _page_texts(result.pdf)
    skipped = [i for i in result.items if i.status != "ok"]
    assert skipped  # the TRM acceptance figure: no TRM metrics logged
    first = pages[0]
    assert _squash(result.spec.title) in first and _squash(result.spec.description) in first
    assert _squash("Experiment: demo") in first and _squash("Reproduce: trustbench report demo") in first
    assert "fallback(reportlab)renderingofreport.html" in first and "noChromiumwasfound" in first
    assert "apt-getinstallchromium" in first and "--pdf-renderer" in first
    everything = "".join(pages)
    for label, it in zip(_labels(result.items), result.items):
        assert _squash(f"{label} {it.title}") in first  # the contents list
        if it.status == "ok":  # (headings: checked with their tables and figures below)
            assert _squash(f"{label} {it.caption}") in everything, label
    tail = pages[-1]
    assert "Itemsnotbuilt" in tail
    for label, it in zip(_labels(result.items), result.items):
        if it.status != "ok":
            assert _squash(f"{label} {it.title}: {it.status}") in tail


def _row_cells(table: Table, r: int) -> list[str]:
    """The cells of row ``r`` a reader sees: the innermost index value and every display cell."""
    idx = table.display.index[r]
    inner = idx[-1] if isinstance(idx, tuple) else idx
    return [str(inner), *(str(v) for v in table.display.iloc[r])]


def test_no_table_row_is_split_over_pages_and_captions_sit_under_their_tables(demo_pdf):
    pages = _page_texts(demo_pdf.pdf)
    verdict_rows = 0
    for label, it in zip(_labels(demo_pdf.items), demo_pdf.items):
        if it.kind != "table" or it.status != "ok":
            continue
        table = it.obj
        row_pages = []
        for r in range(len(table.display)):
            cells = [_squash(c) for c in _row_cells(table, r)]
            on = [k for k, text in enumerate(pages) if all(c in text for c in cells)]
            assert on, f"{label} row {r}: {_row_cells(table, r)} not all on one page"
            row_pages.append(on)
            if any(str(c[-1]) == "verdict" for c in table._column_tuples()):
                verdict_rows += 1
        caption = [k for k, text in enumerate(pages) if _squash(f"{label} {table.caption}") in text]
        assert caption and caption[0] in row_pages[-1], f"{label}: caption not on the page of its last row"
        heading = _squash(f"{label} {table.title}")
        assert any(heading in pages[k] for k in row_pages[0]), f"{label}: heading not on the page of its first row"
    assert verdict_rows >= 20  # the comparison and claims tables were checked


def test_type_is_at_least_6_5_pt_and_figures_keep_title_image_caption_together(demo_pdf):
    sizes = _font_sizes(demo_pdf.pdf)
    assert min(sizes) >= 6.5, sorted(sizes)
    reader = PdfReader(demo_pdf.pdf)
    pages = _page_texts(demo_pdf.pdf)
    for label, it in zip(_labels(demo_pdf.items), demo_pdf.items):
        if it.kind == "figure" and it.status == "ok":
            on = [k for k, t in enumerate(pages) if _squash(f"{label} {it.title}") in t and _squash(it.caption) in t]
            assert on and reader.pages[on[-1]].images, f"{label}: title, image and caption not on one page"


def test_reportlab_pdf_is_shorter_than_the_matplotlib_one(demo_pdf):
    n = _pages(demo_pdf.pdf)
    print(f"demo-shaped report: {n} pages with reportlab, {MATPLOTLIB_PAGES} with the former matplotlib renderer")
    assert n < MATPLOTLIB_PAGES


def test_a_table_too_wide_for_any_page_wraps_on_landscape_pages_at_6_5_pt(tmp_path):
    """30 columns of 3-word cells, 36 rows: no column split, rows continue under a repeated header."""
    cols = [f"column {j}" for j in range(30)]
    display = pd.DataFrame([[f"r{r}c{j} wide text" for j in range(30)] for r in range(36)], columns=cols)
    display.index = pd.Index([f"row{r}" for r in range(36)], name="row")
    table = Table("wide", "A wide table", "The caption of the wide table.", values=display, display=display)
    item = BuiltItem("table", "wide", table.title, "ok", caption=table.caption, obj=table)
    pdf = render_pdf(tmp_path / "wide.pdf", "Wide", "a table wider than a page", [("Experiment", "x")], [item])
    reader = PdfReader(pdf)
    pages = _page_texts(pdf)
    assert len(pages) >= 3  # the title page, then the rows continue over pages
    for r in range(36):
        assert any(all(_squash(c) in t for c in _row_cells(table, r)) for t in pages), r
    for k, page in enumerate(reader.pages[1:], start=1):
        assert page.mediabox.width > page.mediabox.height  # landscape
        assert "column29" in pages[k] and "column0" in pages[k]  # the header on every page
    assert min(_font_sizes(pdf)) == 6.5
