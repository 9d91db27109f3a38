"""RunTracker against a real MLflow sqlite store: buffered logging, resume without duplicate steps,
and the ``metrics/history.parquet`` artifact.

The reference for the artifact is the store itself: ``MlflowClient.get_metric_history`` of every
key of the run (and ``get_run``'s latest metrics for ``MetricHistory.latest``), read independently
of the tracker. Runs are resumed, hard-killed (points stored, no artifact written after them),
stopped cleanly and written to by a second writer, as real runs are.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric

from runners import tracking
from runners.backends.base import NonFiniteMetric
from runners.tracking import HISTORY_ARTIFACT, STEP_METRIC, TAG_HISTORY, MetricHistory, RunTracker


@pytest.fixture(scope="module")
def uri():
    """One sqlite store (on tmpfs when there is one) and trustbench home for the module."""
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    root = tempfile.mkdtemp(prefix="tb-tracking-", dir=shm)
    saved = os.environ.get("TRUSTBENCH_HOME")
    os.environ["TRUSTBENCH_HOME"] = root
    uri = tracking.ensure_store(f"sqlite:///{root}/mlflow.db")
    yield uri
    if saved is None:
        os.environ.pop("TRUSTBENCH_HOME", None)
    else:
        os.environ["TRUSTBENCH_HOME"] = saved
    shutil.rmtree(root, ignore_errors=True)


def _open(uri: str, experiment: str, key: str = "cell") -> RunTracker:
    tracker = RunTracker.open(uri=uri, experiment=experiment, run_key=key, run_name=key, tags={}, params={"p": 1})
    tracker.flush_every_s = 1e9  # flushes only where a test asks for them
    return tracker


def _log(tracker: RunTracker, steps, keys=("loss", "reward")) -> None:
    for step in steps:
        tracker.log_metrics({k: math.sin(step + i) for i, k in enumerate(keys)}, step=step)


def _store_frame(uri: str, run_id: str) -> pd.DataFrame:
    """Every point of the run as the store returns it, one get_metric_history per key."""
    client = MlflowClient(uri)
    rows = [
        (m.step, key, m.value, m.timestamp)
        for key in client.get_run(run_id).data.metrics
        for m in client.get_metric_history(run_id, key)
    ]
    return _canon(pd.DataFrame(rows, columns=["step", "key", "value", "timestamp"]))


def _artifact_frame(uri: str, run_id: str, tmp_path) -> pd.DataFrame:
    table = pq.read_table(MlflowClient(uri).download_artifacts(run_id, HISTORY_ARTIFACT, str(tmp_path)))
    assert table.schema.metadata[b"trustbench.run_id"] == run_id.encode()
    assert table.column_names == ["step", "key", "value", "timestamp"]
    return _canon(table.to_pandas())


def _canon(df: pd.DataFrame) -> pd.DataFrame:
    df = df.astype({"key": str, "step": "int64", "value": "float64", "timestamp": "int64"})
    return df.sort_values(["key", "step", "timestamp", "value"]).reset_index(drop=True)


def _assert_artifact_is_store(uri: str, run_id: str, tmp_path) -> pd.DataFrame:
    store = _store_frame(uri, run_id)
    pd.testing.assert_frame_equal(_artifact_frame(uri, run_id, tmp_path), store)
    return store


class _CountReads:
    """Counts get_metric_history calls per key (the tracker's read-backs)."""

    def __init__(self, monkeypatch):
        self.keys: list[str] = []
        original = MlflowClient.get_metric_history

        def counting(client, run_id, key):
            self.keys.append(key)
            return original(client, run_id, key)

        monkeypatch.setattr(MlflowClient, "get_metric_history", counting)


def test_metrics_are_buffered_until_a_flush(uri):
    """log_metrics only buffers (within flush_every_s); flush(wait=True) stores every value with the
    step metric; a non-finite value is refused, naming the metric and step, and nothing of its step is
    buffered."""
    tracker = _open(uri, "buffering")
    client = MlflowClient(uri)
    with pytest.raises(NonFiniteMetric, match="'bad' is nan at step 0"):
        tracker.log_metrics({"loss": 2.0, "bad": float("nan"), "inf": float("inf")}, step=0)
    tracker.log_metrics({"loss": 1.0}, step=0)
    tracker.log_metrics({"loss": 0.5}, step=1)
    assert client.get_run(tracker.run_id).data.metrics == {}
    tracker.flush(wait=True)
    assert [(m.step, m.value) for m in client.get_metric_history(tracker.run_id, "loss")] == [(0, 1.0), (1, 0.5)]
    assert set(client.get_run(tracker.run_id).data.metrics) == {"loss", STEP_METRIC}
    tracker.flush_every_s = 0.0  # every log_metrics now sends (asynchronously)
    tracker.log_metrics({"loss": 0.25}, step=2)
    tracker.finish()
    assert [m.step for m in client.get_metric_history(tracker.run_id, "loss")] == [0, 1, 2]
    assert client.get_run(tracker.run_id).info.status == "FINISHED"


def test_resume_skips_logged_steps_and_artifact_holds_every_attempt(uri, tmp_path, monkeypatch):
    """A hard-killed attempt (points stored after its last checkpoint artifact), then a resumed
    attempt stopped cleanly (KILLED), then a resumed attempt that finishes: every step is in the
    store once, the final artifact equals the store's history, and only the keys the previous
    artifact did not cover are read back (all of them after the hard kill, none after the clean stop)."""
    first = _open(uri, "resume")
    _log(first, range(0, 10))
    first.flush(wait=True)  # checkpoint at step 9: artifact written
    _log(first, range(10, 15))
    first.write_history = False  # hard kill: steps 10-14 reach the store, no artifact is written after them
    first.flush(wait=True)

    reads = _CountReads(monkeypatch)
    second = _open(uri, "resume")
    assert second.resumed and second.run_id == first.run_id and second.last_logged_step == 14
    _log(second, range(10, 20))  # training resumes from the checkpoint at 9: 10-14 are recomputed, dropped
    second.finish("KILLED")
    assert sorted(reads.keys) == sorted([STEP_METRIC, "loss", "reward", STEP_METRIC])  # open + gap read-back
    _assert_artifact_is_store(uri, second.run_id, tmp_path / "a")

    reads.keys.clear()
    third = _open(uri, "resume")
    _log(third, range(15, 30))
    third.finish()
    assert reads.keys == [STEP_METRIC]  # last_logged_step at open; the clean stop's artifact covered the rest
    store = _assert_artifact_is_store(uri, third.run_id, tmp_path / "b")
    steps = store[store["key"] == STEP_METRIC]["step"].tolist()
    assert steps == list(range(30))
    tag = MlflowClient(uri).get_run(third.run_id).data.tags[TAG_HISTORY]
    assert tag == f'{{"points": {len(store)}, "keys": 3, "last_step": 29}}'


def test_artifact_picks_up_other_writers_and_drops_duplicates(uri, tmp_path, monkeypatch):
    """Points logged into the run by another writer (verl's own MLflow logger does this) are read back
    at the end; a point logged twice in the same millisecond is stored once by MLflow, and once in
    the artifact."""
    tracker = _open(uri, "writers")
    with monkeypatch.context() as patch:
        patch.setattr(tracking.time, "time", lambda: 1_700_000_000.0)  # every point in the same ms
        _log(tracker, range(5))
        tracker.log_metrics({"loss": math.sin(4)}, step=4)  # same step, value and timestamp again
    tracker.flush(wait=True)
    client = MlflowClient(uri)
    client.log_batch(tracker.run_id, metrics=[Metric("verl/x", float(s), 1_600_000_000_000 + s, s) for s in range(7)])
    tracker.finish("FAILED", reason="boom")
    store = _assert_artifact_is_store(uri, tracker.run_id, tmp_path)
    assert (store["key"] == "verl/x").sum() == 7 and (store["key"] == "loss").sum() == 5


def test_checkpoint_flush_writes_artifact_only_when_new_points(uri, tmp_path, monkeypatch):
    """flush(wait=True) writes the artifact when points were sent since the last write, not otherwise."""
    tracker = _open(uri, "checkpoints")
    writes = []
    original = MlflowClient.log_artifact
    monkeypatch.setattr(MlflowClient, "log_artifact", lambda c, *a, **k: writes.append(a) or original(c, *a, **k))
    _log(tracker, range(3))
    tracker.flush(wait=True)
    tracker.flush(wait=True)
    assert len(writes) == 1
    _assert_artifact_is_store(uri, tracker.run_id, tmp_path / "a")
    _log(tracker, range(3, 6))
    tracker.flush(wait=True)
    tracker.finish()
    assert len(writes) == 2
    _assert_artifact_is_store(uri, tracker.run_id, tmp_path / "b")


def test_artifact_failures_warn_and_are_retried(uri, tmp_path, monkeypatch, caplog):
    """An artifact store that refuses the upload, or a store read that fails, leaves a warning, never
    an error: the next write retries (a checkpoint's artifact is written at the end even with no new
    points; a resumed attempt's read-back of the previous attempt's keys is not forgotten); a refused
    final write leaves the run FINISHED without the tag."""

    def refuse(*args, **kwargs):
        raise OSError("artifact store unreachable")

    tracker = _open(uri, "failing_artifacts")
    _log(tracker, range(3))
    tracker.flush(wait=True)  # artifact written
    _log(tracker, range(3, 6))
    with monkeypatch.context() as patch, caplog.at_level(logging.WARNING, logger="runners.tracking"):
        patch.setattr(MlflowClient, "log_artifact", refuse)
        tracker.flush(wait=True)
    assert "artifact store unreachable" in caplog.text
    tracker.finish()
    _assert_artifact_is_store(uri, tracker.run_id, tmp_path / "a")

    killed = _open(uri, "failing_reads")
    _log(killed, range(5))
    killed.write_history = False  # hard kill before any artifact
    killed.flush(wait=True)
    resumed = _open(uri, "failing_reads")
    _log(resumed, range(5, 8))
    with monkeypatch.context() as patch:
        patch.setattr(MlflowClient, "get_metric_history", refuse)
        resumed.flush(wait=True)
    resumed.finish()
    _assert_artifact_is_store(uri, resumed.run_id, tmp_path / "b")

    refused = _open(uri, "failing_final")
    _log(refused, range(3))
    monkeypatch.setattr(MlflowClient, "log_artifact", refuse)
    refused.finish()
    run = MlflowClient(uri).get_run(refused.run_id)
    assert run.info.status == "FINISHED" and TAG_HISTORY not in run.data.tags


def test_metric_history_latest_is_mlflows_latest_metric(uri):
    """MetricHistory.latest picks, per key, the point MLflow keeps as the latest metric (greatest
    step, then timestamp, then value), for points logged out of order with ties."""
    rng = np.random.default_rng(0)
    client = MlflowClient(uri)
    run_id = client.create_run(tracking.get_or_create_experiment(uri, "latest")).info.run_id
    history = MetricHistory()
    points = [
        Metric(f"k{int(k)}", float(v), int(t), int(s))
        for k, v, t, s in zip(
            rng.integers(0, 3, 60), rng.integers(0, 4, 60), rng.integers(0, 3, 60), rng.integers(0, 5, 60)
        )
    ]
    for i in range(0, len(points), 7):
        client.log_batch(run_id, metrics=points[i : i + 7])
        for m in points[i : i + 7]:
            history.add(m.key, m.step, m.value, m.timestamp)
    latest = {m.key: (m.step, m.timestamp, m.value) for m in client.get_run(run_id).data._metric_objs}
    assert latest == {k: history.latest(k) for k in history.keys()}


def test_every_run_records_its_code_version():
    """A run's tags name the code it ran: this checkout's git revision (with the dirty flag) and the
    installed package's version, as ``git`` and ``importlib.metadata`` report them."""
    import importlib.metadata
    import subprocess

    from runners import metric_names, paths
    from runners.config import compose
    from runners.run import run_tags

    cfg, choices = compose(["algorithm=grpo"])
    tags = run_tags(cfg, "GRPO", choices)
    head = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=paths.repo_root(), capture_output=True, text=True
    )
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=paths.repo_root(), capture_output=True, text=True
    )
    revision = tags[metric_names.TAG_GIT_REVISION]
    assert revision.split("-dirty.")[0] == head.stdout.strip()
    assert ("-dirty." in revision) == bool(status.stdout.strip())
    assert tags[metric_names.TAG_PACKAGE_VERSION] == importlib.metadata.version("trustbench")
