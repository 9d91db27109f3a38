"""Headless Chromium: the report's PDF route (``--print-to-pdf``) and the tests' screenshot/DOM reader.

Design: Chromium renders the very HTML a reader opens (inline images, print CSS), needs no Python
dependency and exists as a plain Debian package (``apt-get install chromium``); weasyprint would
need pango and render CSS differently. The binary is ``$TRUSTBENCH_CHROMIUM`` or the first of
chromium / chromium-browser / google-chrome on PATH; when none exists ``ChromiumMissingError``
says how to install it, and ``reports.build`` falls back to the reportlab rendering (``reports.pdf``).

Flags: a fresh ``--user-data-dir`` per call and no network-touching background services, which
also lets it run as root in containers (``--no-sandbox``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BASE_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
)


class ChromiumMissingError(RuntimeError):
    """No Chromium/Chrome binary found."""


def chromium_hint(experiment: str) -> str:
    """How to get the browser-rendered PDF of ``experiment`` (shown when the reportlab fallback was used)."""
    return (
        "for the browser-rendered PDF install Chromium (Debian/Ubuntu: apt-get install chromium) or set "
        f"TRUSTBENCH_CHROMIUM to a Chrome/Chromium binary, then rerun: trustbench report {experiment} --pdf-renderer chromium"
    )


def find_chromium() -> str:
    explicit = os.environ.get("TRUSTBENCH_CHROMIUM")
    if explicit:
        if shutil.which(explicit) is None and not Path(explicit).is_file():
            raise ChromiumMissingError(f"TRUSTBENCH_CHROMIUM={explicit!r} is not an executable")
        return explicit
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    raise ChromiumMissingError(
        "the PDF route needs headless Chromium, and none of "
        f"{', '.join(CANDIDATES)} is on PATH: install it (Debian: apt-get install chromium), set TRUSTBENCH_CHROMIUM, "
        "or let reportlab render the PDF (trustbench report EXPERIMENT --pdf-renderer reportlab)"
    )


def run_chromium(args: list[str], url: str, timeout: float = 120.0, capture: bool = False) -> str:
    """Run Chromium headless on ``url`` with ``args``; returns stdout when ``capture``."""
    binary = find_chromium()
    with tempfile.TemporaryDirectory(prefix="tb-chromium-") as profile:
        cmd = [binary, *BASE_FLAGS, f"--user-data-dir={profile}", *args, url]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"chromium failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return proc.stdout if capture else ""


def html_to_pdf(html_path: str | Path, pdf_path: str | Path, timeout: float = 180.0) -> Path:
    """Print ``html_path`` to ``pdf_path`` (page size and margins come from the page's @page CSS)."""
    html_path, pdf_path = Path(html_path).resolve(), Path(pdf_path).resolve()
    pdf_path.unlink(missing_ok=True)
    run_chromium(
        ["--no-pdf-header-footer", "--virtual-time-budget=10000", f"--print-to-pdf={pdf_path}"],
        html_path.as_uri(),
        timeout,
    )
    if not pdf_path.exists() or pdf_path.stat().st_size == 0:
        raise RuntimeError(f"chromium did not write {pdf_path}")
    return pdf_path


def screenshot(html_path: str | Path, png_path: str | Path, width: int = 1280, height: int = 2400) -> Path:
    png_path = Path(png_path).resolve()
    run_chromium(
        [f"--window-size={width},{height}", "--virtual-time-budget=10000", f"--screenshot={png_path}"],
        Path(html_path).resolve().as_uri(),
    )
    return png_path


def dump_dom(html_path: str | Path) -> str:
    """The DOM after loading and running the page (what the browser actually built)."""
    return run_chromium(["--virtual-time-budget=10000", "--dump-dom"], Path(html_path).resolve().as_uri(), capture=True)
