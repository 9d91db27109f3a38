"""Browsing a sweep in the MLflow UI: the page ``trustbench ui`` links to, rendered by headless Chromium.

The store holds four cells logged the way ``trustbench run`` logs them (composed configs, their run
names and tags, ``RunTracker``) and the report's run; ``trustbench ui EXPERIMENT`` serves it on a free
loopback port and prints the link. Chromium (the report's PDF route, ``reports.chromium``) loads
that link and dumps the DOM the MLflow app built (``--virtual-time-budget`` lets its requests to the
server finish). What the reader sees is checked against the runs read back with MLflow's client:
the runs table (not the GenAI overview), every training run once, under its method's group, named
method and seed first within what the name column shows, and no report run.

The other tests check the pieces without a browser: the tags an experiment gets (new or existing),
the report's run in the reports experiment (the same run on a rebuild; an older in-experiment
report run deleted), the loader finding exactly the training runs, ``run_name`` and ``trustbench ui``
naming an unknown experiment.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from analysis.frames import TAG_REPORT
from reports.chromium import ChromiumMissingError, find_chromium, run_chromium
from runners import metric_names, mlflow_ui
from tests.reliability import command_env, free_port

EXPERIMENT = "browse"
CELLS = (["seed=0"], ["seed=1"], ["objective=troll", "seed=0"], ["objective=troll", "seed=1"])
# the characters of a run name MLflow 3.17's runs table shows in its name column (190 px wide) before "...":
# the "ADAPO | embedded | e..." shows 20
NAME_COLUMN_CHARS = 20
RUN_CELL = re.compile(r'href="#/experiments/(\d+)/runs/([0-9a-f]{32})"[^>]*>\s*<span[^>]*>([^<]*)</span>')


def _chromium_or_skip() -> None:
    try:
        find_chromium()
    except ChromiumMissingError as err:
        pytest.skip(str(err))


def _log_cells(uri: str) -> None:
    """The four cells, opened and finished as ``runners.run.run`` does (no training)."""
    from runners import tracking
    from runners.config import compose, method_label, resolved, run_key, run_name
    from runners.run import run_tags

    for overrides in CELLS:
        cfg, choices = compose([*overrides, f"experiment={EXPERIMENT}"])
        label = method_label(cfg, choices)
        tracker = tracking.RunTracker.open(
            uri=uri,
            experiment=EXPERIMENT,
            run_key=run_key(cfg),
            run_name=run_name(cfg, label),
            tags=run_tags(cfg, label, choices),
            params=tracking.flatten(resolved(cfg)),
        )
        tracker.write_history = False
        tracker.log_metrics({"critic/score/mean": 0.5}, 0)
        tracker.finish()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A home whose store holds the four cells and the report's run (the report logged twice)."""
    from reports.mlflow_log import log_report
    from runners import tracking

    home = tmp_path_factory.mktemp("browse") / "home"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRUSTBENCH_HOME", str(home))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        uri = tracking.ensure_store()
        _log_cells(uri)
        out = home.parent / "report"
        out.mkdir()
        (out / "report.html").write_text("<p>report</p>")
        report_ids = {log_report(uri, EXPERIMENT, out) for _ in range(2)}
    return home, uri, report_ids


def _training_runs(uri: str) -> dict[str, object]:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    return {r.info.run_id: r for r in client.search_runs([exp.experiment_id])}


def _serve_ui(home: Path, port: int) -> tuple[subprocess.Popen, str]:
    """``trustbench ui EXPERIMENT`` on ``port``; returns the process and the link it prints, once it answers."""
    from runners.tracking_server import is_up

    proc = subprocess.Popen(
        [sys.executable, "-m", "runners.cli", "ui", EXPERIMENT, "--port", str(port)],
        cwd=home.parent,
        env=command_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    printed: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [printed.put(line) for line in proc.stdout], daemon=True).start()
    deadline = time.time() + 180
    while not is_up(f"http://127.0.0.1:{port}", timeout_s=1.0):
        assert proc.poll() is None and time.time() < deadline, "trustbench ui did not answer"
        time.sleep(1.0)
    lines = []
    with contextlib.suppress(queue.Empty):
        while not any(line.startswith("runs of ") for line in lines):
            lines.append(printed.get(timeout=5.0))  # printed before the server starts
    links = [line.split(": ", 1)[1].strip() for line in lines if line.startswith(f"runs of {EXPERIMENT}")]
    assert links, f"trustbench ui printed no link to the runs of {EXPERIMENT}: {lines}"
    return proc, links[0]


def _page(url: str, expected: int) -> str:
    """The DOM Chromium builds for ``url``; a second, longer try when fewer than ``expected`` runs rendered."""
    for budget in (20_000, 60_000):
        dom = run_chromium(
            [f"--virtual-time-budget={budget}", "--window-size=1400,1000", "--dump-dom"], url, timeout=240, capture=True
        )
        if len(RUN_CELL.findall(dom)) >= expected:
            break
    return dom


@pytest.mark.slow
@pytest.mark.e2e
def test_runs_page_shows_runs_by_method_with_method_and_seed_and_no_report(store):
    _chromium_or_skip()
    home, uri, report_ids = store
    listed = _training_runs(uri)
    runs = {run_id: run for run_id, run in listed.items() if TAG_REPORT not in run.data.tags}
    proc, link = _serve_ui(home, free_port())
    try:
        dom = _page(link, len(runs))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    title = html.unescape(re.search(r"<title>(.*?)</title>", dom, re.S)[1])
    assert title.startswith("Runs - "), title  # the runs table, not the GenAI "Overview" of traces
    assert "No data available for the selected time range" not in dom
    shown = {run_id: html.unescape(name).strip() for _, run_id, name in RUN_CELL.findall(dom)}
    assert set(shown) == set(runs), (shown, sorted(runs))  # every training run, and nothing else
    assert not report_ids & set(shown) and set(listed) == set(runs)  # the report's run is not in the experiment
    for run_id, name in shown.items():
        tags = runs[run_id].data.tags
        method, seed = tags[metric_names.TAG_METHOD], tags[metric_names.TAG_SEED]
        assert name[:NAME_COLUMN_CHARS].startswith(f"{method} · s{seed}"), name
    text = html.unescape(re.sub(r"<[^>]+>", " ", dom))
    groups = re.findall(r"Group: ([^<>\n]+?)\s{2,}", re.sub(r"<[^>]+>", "  ", html.unescape(dom)))
    assert sorted(set(groups)) == ["GRPO", "GRPO + TROLL"], groups
    assert "Additional runs" not in text  # a run without a method tag (the report's) would be grouped there


def test_experiments_carry_the_kind_and_the_runs_view(tmp_path):
    """A new experiment is created with the tags; one made before them (plain MLflow) gets them when
    trustbench next uses it."""
    from mlflow import MlflowClient

    from runners import tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking.ensure_store(uri)
    client = MlflowClient(uri)
    old = client.create_experiment("old", artifact_location=(tmp_path / "a").as_uri())
    assert mlflow_ui.TAG_EXPERIMENT_KIND not in client.get_experiment(old).tags
    for name in ("new", "old"):
        exp_id = tracking.get_or_create_experiment(uri, name)
        tags = client.get_experiment(exp_id).tags
        assert tags["mlflow.experimentKind"] == "custom_model_development"
        view = json.loads(tags["mlflow.sharedViewState.trustbench-by-method"])
        assert view["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": "method"}]
        assert "tags.`seed`" in view["selectedColumns"]
    url = mlflow_ui.runs_page_url("http://127.0.0.1:5000/", "7")
    assert url == (
        "http://127.0.0.1:5000/#/experiments/7/runs?workflowType=machine_learning&viewStateShareKey=trustbench-by-method"
    )


def test_report_run_lives_in_the_reports_experiment(tmp_path, monkeypatch):
    """The report's run: in "trustbench reports", named after the experiment, the same run on a rebuild;
    an older report run inside the experiment is deleted; the loader finds exactly the training runs."""
    from mlflow import MlflowClient

    from analysis.load import load_experiment
    from reports.mlflow_log import log_report
    from runners import tracking

    monkeypatch.setenv("TRUSTBENCH_HOME", str(tmp_path / "home"))
    uri = tracking.ensure_store()
    client = MlflowClient(uri)
    exp_id = MlflowClient(uri).create_experiment(EXPERIMENT)  # made before the tags: the report adds them
    trained = {client.create_run(exp_id, run_name=f"GRPO · s{s}", tags={"method": "GRPO"}).info.run_id for s in (0, 1)}
    older = client.create_run(exp_id, run_name="report", tags={TAG_REPORT: "1"}).info.run_id
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.html").write_text("<p>report</p>")
    first, second = log_report(uri, EXPERIMENT, out), log_report(uri, EXPERIMENT, out)
    assert first == second
    run = client.get_run(first)
    reports = client.get_experiment_by_name("trustbench reports")
    assert (run.info.experiment_id, run.info.run_name) == (reports.experiment_id, EXPERIMENT)
    assert run.data.tags[TAG_REPORT] == EXPERIMENT
    assert [a.path for a in client.list_artifacts(first, "report")] == ["report/report.html"]
    assert client.get_run(older).info.lifecycle_stage == "deleted"
    assert {r.info.run_id for r in client.search_runs([exp_id])} == trained
    assert set(load_experiment(EXPERIMENT, uri, cache_dir=None).runs["run_id"]) == trained
    assert client.get_experiment(exp_id).tags[mlflow_ui.TAG_EXPERIMENT_KIND] == mlflow_ui.EXPERIMENT_KIND


def test_run_name_is_method_and_seed():
    from runners.config import compose, method_label, run_name

    cfg, choices = compose(["objective=troll", "seed=3"])
    assert run_name(cfg, method_label(cfg, choices)) == "GRPO + TROLL · s3"


def test_ui_names_an_unknown_experiment_and_creates_nothing(tmp_path, monkeypatch, capsys):
    from runners import cli

    home = tmp_path / "home"
    monkeypatch.setenv("TRUSTBENCH_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setattr(cli, "_serve", lambda cmd, env=None: pytest.fail("served"))
    assert cli.main(["ui", "nosuch"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'nosuch'" in err[0], err
    assert not (home / "mlflow.db").exists()
