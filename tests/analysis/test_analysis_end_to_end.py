"""End to end on a real MLflow store: ``trustbench report`` (the argparse subcommand) loads the runs,
writes the report, logs it as artifacts of its run in the "trustbench reports" experiment, out of the runs loaded;
and none of it imports torch (checked in a fresh interpreter)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap

import pytest
from mlflow import MlflowClient

from analysis.load import load_experiment
from reports.cli import add_report_parser

# the report command end to end, on a store, and in a fresh interpreter: left out of make test-fast
pytestmark = pytest.mark.e2e


def _parser():
    p = argparse.ArgumentParser(prog="trustbench")
    add_report_parser(p.add_subparsers(dest="command", required=True))
    return p


def test_report_command_writes_and_logs_the_report(store, tb_home, tmp_path, capsys):
    out = tmp_path / "report"
    args = _parser().parse_args(
        ["report", "troll_table1", "--tracking-uri", store.uri, "--out", str(out), "--no-pdf", "--quiet"]
    )
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert "html:" in printed and (out / "report.html").exists()
    html = (out / "report.html").read_text()
    assert "reproduces TROLL (arXiv 2510.03817) Table 1" in html and "Failed to build" not in html

    client = MlflowClient(store.uri)
    reports = client.get_experiment_by_name("trustbench reports")
    tagged = "tags.`trustbench.report` = 'troll_table1'"
    (report_run,) = client.search_runs([reports.experiment_id], filter_string=tagged)
    assert report_run.info.run_name == "troll_table1"
    artifacts = {a.path for a in client.list_artifacts(report_run.info.run_id, "report")}
    assert "report/report.html" in artifacts and "report/tables" in artifacts
    # building again reuses the same report run, and analysis never sees it
    assert args.func(args) == 0
    assert [r.info.run_id for r in client.search_runs([reports.experiment_id], filter_string=tagged)] == [
        report_run.info.run_id
    ]
    data = load_experiment("troll_table1", store.uri, cache_dir=None)
    assert report_run.info.run_id not in set(data.runs["run_id"])
    assert len(data.runs) == len(store.truth["troll_table1"])


def test_report_command_names_unknown_experiments(store, capsys):
    args = _parser().parse_args(["report", "not_a_sweep", "--tracking-uri", store.uri, "--no-pdf", "--no-mlflow"])
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert "not_a_sweep" in err and "entropy_tables" in err


def test_loading_and_reporting_never_import_torch(store, tmp_path):
    code = textwrap.dedent(
        f"""
        import json, sys
        import analysis, reports
        import analysis.claim_checks, analysis.tables.compare, analysis.tables.scaling, analysis.tables.timing
        from analysis.load import load_experiment
        from reports.build import build_report
        data = load_experiment("entropy_tables", {store.uri!r}, cache_dir={str(tmp_path / "cache")!r})
        result = build_report("entropy_tables", {store.uri!r}, {str(tmp_path / "out")!r}, data=data, pdf="reportlab", log_to_mlflow=True)
        print(json.dumps({{"torch": "torch" in sys.modules, "items": [i.status for i in result.items]}}))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["torch"] is False
    assert set(result["items"]) == {"ok"}
