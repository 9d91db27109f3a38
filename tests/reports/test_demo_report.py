"""The demo sweep's own report, end to end: `trustbench sweep demo` (every cell, tiny settings) ->
MLflow -> `trustbench report demo` -> headless Chromium (screenshot non-blank, every registered
figure rendered from the runs) and the PDF rendered by pdftoppm.

The cells run the real demo sweep file with overrides that make them fast (a tiny random model, two
steps); the report is the demo's registered report. Needs Chromium and poppler-utils (skipped
with the reason otherwise)."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image

from reports.chromium import ChromiumMissingError, dump_dom, find_chromium, screenshot
from reports.registry import get_report
from tests.backends._tiny import TINY

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def _chromium_or_skip() -> None:
    try:
        find_chromium()
    except ChromiumMissingError:
        pytest.skip("chromium not installed (apt-get install chromium)")


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory):
    home = tmp_path_factory.mktemp("demo_home")
    mp = pytest.MonkeyPatch()
    mp.setenv("TRUSTBENCH_HOME", str(home))
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    mp.chdir(home)
    try:
        from reports.build import build_report
        from runners import sweep

        fast = [o for o in TINY if not o.startswith(("trainer.total_steps", "trainer.eval_every"))]
        fast += ["trainer.total_steps=3", "trainer.eval_every=3", "trainer.mini_batch_prompts=1"]
        # in this process: the test's reward (tests.backends._tiny) is registered here, not in child processes
        fast += ["launcher.parallel=1"]
        plan = sweep.plan("demo", fast)
        assert len(plan.cells) >= 6
        sweep.launch(plan)
        assert sweep.report_outcomes(plan) == 0
        result = build_report("demo", pdf=shutil.which("chromium") is not None, progress=False)
        yield result
    finally:
        mp.undo()


def test_demo_report_has_every_item(demo_report):
    assert not demo_report.failures, [(i.key, i.reason) for i in demo_report.failures]
    spec = get_report("demo")
    built = [i for i in demo_report.items if i.status == "ok"]
    skipped = [(i.key, i.reason) for i in demo_report.items if i.status != "ok"]
    assert len(built) == len(spec.items), f"skipped items: {skipped}"


def test_demo_report_renders_in_chromium(demo_report, tmp_path):
    _chromium_or_skip()
    png = screenshot(demo_report.html, tmp_path / "demo.png", width=1280, height=2400)
    pixels = np.asarray(Image.open(png).convert("L"), dtype=float)
    assert (pixels < 200).mean() > 0.02  # text, tables and plots: not a blank page
    dom = dump_dom(demo_report.html)
    spec = get_report("demo")
    assert dom.count('<figure class="tb-figure"') == spec.count("figure")
    assert dom.count("<img ") == spec.count("figure")


def test_demo_report_pdf_renders(demo_report, tmp_path):
    _chromium_or_skip()
    if shutil.which("pdftoppm") is None:
        pytest.skip("pdftoppm not installed (apt-get install poppler-utils)")
    subprocess.run(["pdftoppm", "-r", "40", "-png", str(demo_report.pdf), str(tmp_path / "p")], check=True, timeout=120)
    pages = sorted(tmp_path.glob("p-*.png"))
    assert pages
    assert all((np.asarray(Image.open(p).convert("L"), dtype=float) < 200).mean() > 0.01 for p in pages[:3])
