"""The PDF route without a browser: `trustbench report` with no Chromium on PATH exits 0 with the HTML
report and a matplotlib-rendered PDF, and says how to get the Chromium PDF; the renderer choice is
checked with stand-in Chromium binaries (one that prints a PDF, one that crashes)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from analysis.synthetic import log_synthetic_experiment, profile, synthetic_data
from reports.build import build_report
from reports.registry import get_report

ROOT = Path(__file__).resolve().parents[2]


def _pages(pdf: Path) -> int:
    """Page objects of a PDF (matplotlib writes uncompressed object headers)."""
    return len(re.findall(rb"/Type\s*/Page\b(?!s)", pdf.read_bytes()))


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
    assert _pages(pdf) >= 1 + spec.count("figure") + spec.count("table") - 2  # title page, items (a few may skip)
    assert "(matplotlib)" in proc.stdout
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
        assert result.pdf_renderer == "matplotlib" and head.startswith(b"%PDF-")
        assert "Chromium failed" in result.pdf_note and "apt-get install chromium" in result.pdf_note
        assert _pages(result.pdf) >= 1 + len(result.figures()) + len(result.tables())


def test_matplotlib_pdf_holds_every_built_item_and_lists_the_skipped(tmp_path):
    spec = profile("demo", steps=6, seeds=(0, 1))
    data, _ = synthetic_data(replace(spec, families=spec.families - {"trm"}))
    result = build_report(
        "demo", tracking_uri="sqlite:///unused.db", out_dir=tmp_path, data=data, pdf="matplotlib", log_to_mlflow=False
    )
    skipped = [i for i in result.items if i.status != "ok"]
    assert skipped  # the TRM acceptance figure: no TRM metrics logged
    # title page + one page per figure + at least one per table + the page listing skipped items
    assert _pages(result.pdf) >= 1 + len(result.figures()) + len(result.tables()) + 1
