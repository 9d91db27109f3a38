"""Loading ended runs from their history artifact, against a real ``mlflow server`` on 127.0.0.1
(sqlite backend, artifacts proxied by the server: ``mlflow-artifacts:`` URIs, downloads over HTTP;
the ``mlflow_server`` fixture of conftest.py).

The references are the server's other readers on the same runs: the REST bulk path
(``artifacts=False``) and the naive per-run per-metric ``get_metric_history`` loop (``bulk=False``).
Runs are written through ``RunTracker`` as real runs are: finished, failed, resumed after a hard
kill, logged into by a second writer, still running, plus runs without an artifact and one whose
artifact no longer matches the store (a point logged after it ended).
"""

from __future__ import annotations

import logging
import math

import pandas as pd
import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric

from analysis.load import load_experiment
from runners.tracking import RunTracker


def _tracker(url: str, experiment: str, key: str) -> RunTracker:
    tracker = RunTracker.open(
        uri=url, experiment=experiment, run_key=key, run_name=key, tags={"method": key}, params={}
    )
    tracker.flush_every_s = 1e9
    return tracker


def _log(tracker: RunTracker, steps, keys=("loss", "reward", "entropy")) -> None:
    for step in steps:
        tracker.log_metrics({k: math.cos(0.3 * step + i) for i, k in enumerate(keys)}, step=step)


def _sorted(metrics: pd.DataFrame) -> pd.DataFrame:
    m = metrics.astype({"run_id": str, "metric": str})
    return m.sort_values(["run_id", "metric", "step", "timestamp", "value"]).reset_index(drop=True)


def _assert_same_as_other_readers(data, url: str, experiment: str) -> None:
    rest = load_experiment(experiment, url, cache_dir=None, artifacts=False)
    naive = load_experiment(experiment, url, cache_dir=None, bulk=False)
    assert rest.load_info["experiments"][0]["source"] == "rest-bulk"
    assert naive.load_info["experiments"][0]["source"] == "client-per-metric"
    pd.testing.assert_frame_equal(_sorted(data.metrics), _sorted(naive.metrics))
    pd.testing.assert_frame_equal(_sorted(rest.metrics), _sorted(naive.metrics))


@pytest.mark.slow
def test_artifact_load_equals_rest_bulk_and_naive_loop(mlflow_server, caplog):
    """Ended runs whose artifact covers them come from the artifact, the others through REST; the
    frame equals the REST bulk reader's and the naive loop's."""
    url, exp = mlflow_server, "artifact_sweep"
    done = _tracker(url, exp, "done")
    _log(done, range(0, 20))
    done.flush(wait=True)  # checkpoint
    _log(done, range(20, 40))
    done.finish()

    failed = _tracker(url, exp, "failed")
    _log(failed, range(12))
    failed.finish("FAILED", reason="RuntimeError: diverged")

    killed = _tracker(url, exp, "resumed")  # hard kill after the checkpoint at step 9
    _log(killed, range(0, 10))
    killed.flush(wait=True)
    _log(killed, range(10, 15))
    killed.write_history = False
    killed.flush(wait=True)
    resumed = _tracker(url, exp, "resumed")
    assert resumed.resumed and resumed.last_logged_step == 14
    _log(resumed, range(10, 25))
    resumed.finish()

    shared = _tracker(url, exp, "two_writers")  # e.g. verl's own MLflow logger in the same run
    _log(shared, range(10))
    shared.flush(wait=True)
    client = MlflowClient(url)
    client.log_batch(shared.run_id, metrics=[Metric("verl/x", s / 7, 1_600_000_000_000 + s, s) for s in range(9)])
    shared.finish("KILLED")

    running = _tracker(url, exp, "running")
    _log(running, range(10))
    running.flush(wait=True)  # artifact written at the checkpoint, but the run has not ended

    late = _tracker(url, exp, "late_point")
    _log(late, range(10))
    late.finish()
    client.log_metric(late.run_id, "loss", 5.0, step=30)  # after the artifact: the artifact no longer matches

    plain = client.create_run(client.get_experiment_by_name(exp).experiment_id).info.run_id  # no tracker, no artifact
    client.log_batch(plain, metrics=[Metric("loss", float(s), 1_600_000_000_000 + s, s) for s in range(6)])
    client.set_terminated(plain)

    assert client.get_run(done.run_id).info.artifact_uri.startswith("mlflow-artifacts:")
    with caplog.at_level(logging.WARNING, logger="analysis.sources"):
        data = load_experiment(exp, url, cache_dir=None)
    assert (
        f"1 run(s) have a history artifact that could not be used, read through rest-bulk instead (first: run {late.run_id}"
        in caplog.text
    )
    info = data.load_info["experiments"][0]
    assert info["source"] == "artifacts+rest-bulk"
    assert (info["artifact_runs"], info["fallback_runs"]) == (4, 3)  # done, failed, resumed, two_writers
    assert len(data.runs) == 7
    _assert_same_as_other_readers(data, url, exp)


@pytest.mark.slow
def test_cached_run_that_ends_is_reread_from_its_artifact(mlflow_server, tmp_path):
    """Incremental cache: a running run is read through REST; once it ends, its new points come from
    its artifact (the whole run re-read, not a REST tail); unchanged afterwards, nothing is fetched."""
    url, exp = mlflow_server, "artifact_cache"
    other = _tracker(url, exp, "finished_first")
    _log(other, range(8))
    other.finish()
    run = _tracker(url, exp, "running_then_done")
    _log(run, range(10))
    run.flush(wait=True)

    first = load_experiment(exp, url, cache_dir=tmp_path)
    info = first.load_info["experiments"][0]
    assert (info["artifact_runs"], info["fallback_runs"]) == (1, 1)

    _log(run, range(10, 20))
    run.finish()
    second = load_experiment(exp, url, cache_dir=tmp_path)
    info = second.load_info["experiments"][0]
    assert (info["runs_fetched"], info["partial_runs"], info["artifact_runs"], info["fallback_runs"]) == (1, 0, 1, 0)
    _assert_same_as_other_readers(second, url, exp)

    third = load_experiment(exp, url, cache_dir=tmp_path)
    assert third.load_info["experiments"][0]["runs_fetched"] == 0
    pd.testing.assert_frame_equal(_sorted(third.metrics), _sorted(second.metrics))
