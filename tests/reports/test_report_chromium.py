"""The report in a real browser: headless Chromium loads report.html (screenshot non-blank, every
registered figure present in the rendered DOM) and the PDF renders with pdftoppm.

Needs the Debian packages ``chromium`` and ``poppler-utils``; skipped with that reason otherwise."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image

from reports.chromium import ChromiumMissingError, dump_dom, find_chromium, screenshot
from reports.registry import get_report


def _need(binary_ok: bool, reason: str) -> None:
    if not binary_ok:
        pytest.skip(reason)


def _has_chromium() -> bool:
    try:
        find_chromium()
        return True
    except ChromiumMissingError:
        return False


def test_report_renders_in_chromium(built_report, tmp_path):
    _need(_has_chromium(), "chromium not installed (apt-get install chromium)")
    png = screenshot(built_report.html, tmp_path / "report.png", width=1280, height=2200)
    pixels = np.asarray(Image.open(png).convert("L"), dtype=float)
    assert pixels.shape == (2200, 1280)
    assert (pixels < 200).mean() > 0.02  # text, tables and plots, not a blank page
    dom = dump_dom(built_report.html)
    spec = get_report("trm_acceptance")
    assert dom.count('<figure class="tb-figure"') == spec.count("figure")
    assert dom.count("<img ") == spec.count("figure")
    assert dom.count('<table class="tb-table"') == spec.count("table")


def test_pdf_renders_with_pdftoppm(built_report, tmp_path):
    _need(_has_chromium(), "chromium not installed (apt-get install chromium)")
    _need(shutil.which("pdftoppm") is not None, "pdftoppm not installed (apt-get install poppler-utils)")
    assert built_report.pdf is not None and built_report.pdf.stat().st_size > 10_000
    subprocess.run(
        ["pdftoppm", "-r", "40", "-png", str(built_report.pdf), str(tmp_path / "page")], check=True, timeout=120
    )
    pages = sorted(tmp_path.glob("page-*.png"))
    assert len(pages) >= 3
    for page in pages[:3]:
        pixels = np.asarray(Image.open(page).convert("L"), dtype=float)
        assert pixels.shape[1] > pixels.shape[0]  # A4 landscape
        assert (pixels < 200).mean() > 0.01, page.name
