"""The demo sweep's own report, end to end: `trustbench sweep demo` (every cell, tiny settings) ->
MLflow -> `trustbench report demo` -> headless Chromium (screenshot non-blank, every registered
figure rendered from the runs) and the PDF rendered by pdftoppm.

What the report shows is checked against the MLflow store the sweep wrote, read here with plain
sqlite3 (not MLflow, not the analysis loader): the runs per method, each method's final values and
evaluation before/after training (mean and sample std over seeds, as the captions define them) in
the HTML tables and in the PDF's text (pdftotext), and the curves of the success and entropy
figures (the per-step mean over seeds, their axes, their legend).

The cells run the real demo sweep file with overrides that make them fast (a tiny random model, two
steps); the report is the demo's registered report. Needs Chromium and poppler-utils (skipped
with the reason otherwise)."""

from __future__ import annotations

import re
import shutil
import sqlite3
import statistics
import subprocess
from collections import defaultdict
from html.parser import HTMLParser

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
def demo_home(tmp_path_factory):
    return tmp_path_factory.mktemp("demo_home")


@pytest.fixture(scope="module")
def demo_report(demo_home):
    home = demo_home
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


# -- what the report shows, against the MLflow store read with sqlite3 ---------------------------------
FINAL_METRICS = ["critic/score/mean", "actor/entropy", "response_length/mean", "timing_s/step"]
EVAL_METRIC = "val-core/embedded/acc/mean_at_4"


class _Store:
    """The demo experiment's training runs (active, finished, not the report's own run) and their
    metric histories, straight from the sqlite tables MLflow writes."""

    def __init__(self, path):
        db = sqlite3.connect(path)
        try:
            (exp,) = db.execute("SELECT experiment_id FROM experiments WHERE name = 'demo'").fetchone()
            runs = [
                r
                for (r,) in db.execute(
                    "SELECT run_uuid FROM runs WHERE experiment_id = ? AND lifecycle_stage = 'active' "
                    "AND status = 'FINISHED'",
                    (exp,),
                )
            ]
            tags = {
                r: dict(db.execute("SELECT key, value FROM tags WHERE run_uuid = ?", (r,)).fetchall()) for r in runs
            }
            self.runs = [r for r in runs if "trustbench.report" not in tags[r]]
            self.tags = {r: tags[r] for r in self.runs}
            self.history = {}
            for r in self.runs:
                for key, step, value in db.execute(
                    "SELECT key, step, value FROM metrics WHERE run_uuid = ? ORDER BY key, step, timestamp", (r,)
                ):
                    self.history.setdefault((r, key), {})[int(step)] = float(value)  # the last value of a step
        finally:
            db.close()
        self.by_method = defaultdict(list)
        for r in self.runs:
            self.by_method[self.tags[r]["method"]].append(r)

    def points(self, run, key):
        return sorted(self.history[(run, key)].items())


def _mean_std(values):
    return statistics.fmean(values), statistics.stdev(values)


def _cell(mean, std, sign=False):
    return f"{'+' if sign and mean > 0 else ''}{mean:.3f} ± {std:.3f}"


def _expected_final(store):
    """{metric: {method: cell}}: each run's final value is the mean of its last 3 logged points."""
    return {
        m: {
            method: _cell(*_mean_std([statistics.fmean(v for _, v in store.points(r, m)[-3:]) for r in runs]))
            for method, runs in store.by_method.items()
        }
        for m in FINAL_METRICS
    }


def _eval_steps(store):
    """(step of the first evaluation, step of the last) shared by every run."""
    firsts = {store.points(r, EVAL_METRIC)[0][0] for r in store.runs}
    lasts = {store.points(r, EVAL_METRIC)[-1][0] for r in store.runs}
    assert len(firsts) == 1 and len(lasts) == 1, (firsts, lasts)
    return firsts.pop(), lasts.pop()


def _expected_eval(store):
    """{method: [start, end, change]}: the first and the last evaluation of each run."""
    out = {}
    for method, runs in store.by_method.items():
        first = [store.points(r, EVAL_METRIC)[0][1] for r in runs]
        last = [store.points(r, EVAL_METRIC)[-1][1] for r in runs]
        change = [b - a for a, b in zip(first, last)]
        out[method] = [_cell(*_mean_std(first)), _cell(*_mean_std(last)), _cell(*_mean_std(change), sign=True)]
    return out


class _Tables(HTMLParser):
    """Every <table id=...> of a page as rows of cell texts (header and body rows alike)."""

    def __init__(self, page):
        super().__init__()
        self.tables, self._current, self._row, self._cell = {}, None, None, None
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self._current = self.tables.setdefault(dict(attrs).get("id"), [])
        elif tag == "tr" and self._current is not None:
            self._row = []
            self._current.append(self._row)
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self._current = self._row = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


@pytest.fixture(scope="module")
def store(demo_report, demo_home):
    store = _Store(demo_home / "mlflow.db")
    assert len(store.by_method) >= 6 and all(len(runs) == 3 for runs in store.by_method.values()), store.by_method
    return store


def test_demo_report_tables_show_the_runs_metrics(demo_report, store):
    tables = _Tables(demo_report.html.read_text(encoding="utf-8")).tables
    overview = {row[0]: row[1:] for row in tables["table-overview"][1:]}
    assert set(overview) == set(store.by_method)
    for method, runs in store.by_method.items():
        seeds = ", ".join(sorted(store.tags[r]["seed"] for r in runs))
        last_step = max(max(steps) for (r, _key), steps in store.history.items() if r in runs)
        assert overview[method][:2] == [str(len(runs)), seeds], method
        assert overview[method][-1] == str(last_step), method

    header, *rows = tables["table-final_metrics"]
    assert header[0] == "metric" and set(header[1:]) == set(store.by_method)
    shown = {row[0]: dict(zip(header[1:], row[1:])) for row in rows}
    assert shown == _expected_final(store)

    # the final evaluation is each run's last one, and the headers name the steps
    first_step, last_step = _eval_steps(store)
    assert first_step < last_step
    dataset = tables["table-eval_start_end"][0][1]
    assert EVAL_METRIC == f"val-core/{dataset}/acc/mean_at_4"
    header = tables["table-eval_start_end"][1]  # under the data set's name
    assert header == [
        "Method",
        f"pass@1 at step {first_step} (first eval)",
        f"pass@1 at step {last_step} (last eval)",
        "change",
    ]
    shown = {row[0]: row[1:] for row in tables["table-eval_start_end"][2:]}
    expected = _expected_eval(store)
    assert shown == expected
    moved = [cells[2] for cells in expected.values() if not cells[2].startswith(("0.000", "-0.000", "+0.000"))]
    assert moved, "training must move some method's pass@1"

    # the comparison table's final pass@1 is the same last evaluation, under a label naming its step
    label = f"{dataset} pass@1 at step {last_step} (last eval)"
    header, *rows = tables["table-comparison"]
    col = header.index("mean [95% CI]")
    metric, compared = "", {}
    for row in rows:
        metric = row[0] or metric  # the metric cell spans its methods' rows
        if metric == label:
            compared[row[1]] = row[col].split(" [")[0]
    assert compared == {method: cells[1].split(" ± ")[0] for method, cells in expected.items()}


def test_demo_report_pdf_shows_the_runs_metrics(demo_report, store):
    """The PDF's text (pdftotext, layout kept) holds each table row with the store's numbers in the
    columns' order."""
    _chromium_or_skip()
    if shutil.which("pdftotext") is None:
        pytest.skip("pdftotext not installed (apt-get install poppler-utils)")
    text = subprocess.run(
        ["pdftotext", "-layout", str(demo_report.pdf), "-"], check=True, capture_output=True, text=True, timeout=120
    ).stdout
    lines = [" ".join(line.split()) for line in text.splitlines()]
    header = _Tables(demo_report.html.read_text(encoding="utf-8")).tables["table-final_metrics"][0]
    final = _expected_final(store)
    for metric in FINAL_METRICS:
        row = " ".join([metric, *(final[metric][method] for method in header[1:])])
        assert row in lines, row
    for method, cells in _expected_eval(store).items():
        row = " ".join([method, *cells])
        assert row in lines, row


def _plotted(fig, panel_title):
    """(axes, {method: (x, y) of its raw, faint curve}) of the panel titled ``panel_title``: the raw
    curve of a method is the faint line with the colour and line style of its legend entry."""
    (ax,) = [a for a in fig.axes if a.get_title() == panel_title]
    labelled = {line.get_label(): line for line in ax.lines if not line.get_label().startswith("_")}
    raw = {}
    for method, line in labelled.items():
        faint = [
            other
            for other in ax.lines
            if other.get_label().startswith("_")
            and other.get_color() == line.get_color()
            and other.get_linestyle() == line.get_linestyle()
            and (other.get_alpha() or 1.0) < 1.0
        ]
        assert len(faint) == 1, method
        raw[method] = (np.asarray(faint[0].get_xdata(), float), np.asarray(faint[0].get_ydata(), float))
    return ax, raw


def _mean_curve(store, runs, key):
    steps = sorted({s for r in runs for s, _ in store.points(r, key)})
    values = [statistics.fmean(dict(store.points(r, key))[s] for r in runs) for s in steps]
    return np.asarray(steps, float), np.asarray(values, float)


@pytest.mark.parametrize(
    "key, metric, panel, ylabel",
    [
        ("success_curves", "critic/score/mean", "training success (critic/score/mean)", "success rate"),
        ("success_curves", EVAL_METRIC, "eval: embedded", "success rate"),
        ("entropy_curves", "actor/entropy", "token entropy of the policy (actor/entropy)", "entropy (nats)"),
    ],
)
def test_demo_report_figures_plot_the_runs_metrics(demo_report, store, key, metric, panel, ylabel):
    """The figure's panel plots, per method, the mean over seeds of the store's values at each step
    (the raw curve; the smoothed one is drawn over it), with its axes labelled, every method in the
    figure's legend."""
    (item,) = [i for i in demo_report.items if i.key == key and i.status == "ok"]
    fig = item.obj.mpl
    ax, raw = _plotted(fig, panel)
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("training step", ylabel)
    assert set(raw) == set(store.by_method)
    legend = {t.get_text() for t in fig.legends[0].get_texts()}
    assert legend == set(store.by_method)
    for method, runs in store.by_method.items():
        steps, means = _mean_curve(store, runs, metric)
        assert len(steps) >= 2
        np.testing.assert_array_equal(raw[method][0], steps, err_msg=method)
        np.testing.assert_allclose(raw[method][1], means, rtol=1e-12, atol=0, err_msg=method)
    assert re.search(rf'data-key="{key}"', demo_report.html.read_text(encoding="utf-8"))
