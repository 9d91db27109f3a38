"""MLflow run lifecycle: one MLflow run per grid cell, found again by its run key.

Design:
- The tracking URI defaults to a sqlite file under the trustbench home (``runners.paths``). The store
  is created once by the parent process (``ensure_store``) before any parallel writer starts: the
  sqlite schema migration is not safe to race.
- One experiment per sweep (its name), one run per cell, named readably
  (``grpo+troll | embedded | arith | s0``) and tagged with ``trustbench.run_key``, a hash of the
  resolved config. Re-running the same cell finds its run by that key: a FINISHED run is skipped, any
  other is resumed into the same run id (``RunTracker.open``).
- Metrics go through a buffer flushed asynchronously (``MlflowClient.log_batch(synchronous=False)``)
  every few seconds, and synchronously at checkpoints and at the end, so that everything up to the
  last checkpoint is durable. On resume, steps already in MLflow are not logged again
  (``last_logged_step``); training resumes from the checkpoint with its RNG state, so the steps it
  recomputes are the same steps.
- Every synchronous flush that sent new points (checkpoints) and the end of the run (FINISHED,
  FAILED, KILLED) also write the run's whole metric history as one artifact,
  ``metrics/history.parquet`` (columns step, key, value, timestamp; zstd), and describe it in the
  ``trustbench.metric_history`` tag: a remote server answers ~50-100 us per point through its REST
  readers, one download per run instead lets ``analysis`` read a finished sweep cold in seconds.
  The tracker keeps every point it sent (``MetricHistory``, ~24 bytes a point) and, before each
  write, checks each key's latest point against the store (one ``get_run``): keys it does not
  account for (written by another writer, e.g. verl's own MLflow logger, or by an earlier attempt
  after its last artifact) are read back once with ``get_metric_history``. A resumed attempt starts
  from the previous artifact, keeping the keys whose latest point the store still reports (so after
  a clean stop nothing is re-read; after a hard kill, the keys logged since the last checkpoint).
  Like the analysis cache, a point logged at an *older* step than its key's latest after an
  artifact was written is not detected. Writing the artifact never fails the run (a warning;
  ``analysis`` then reads that run through the server).

This module imports mlflow but not torch.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import subprocess
import tempfile
import threading
import time
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runners import metric_names, paths

# metric logged every step; its history tells which steps are already in MLflow
STEP_METRIC = "training/global_step"
_MAX_PARAM_LEN = 6000
_BATCH_METRICS = 900  # MLflow accepts <= 1000 entities per log_batch
# the run's whole metric history, written by RunTracker at checkpoints and at the end
HISTORY_ARTIFACT = "metrics/history.parquet"
# tag describing that artifact (JSON: points, keys, last_step of STEP_METRIC or null)
TAG_HISTORY = "trustbench.metric_history"
TERMINAL_STATUSES = ("FINISHED", "FAILED", "KILLED")
_log = logging.getLogger(__name__)


def _client(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def ensure_store(uri: str | None = None) -> str:
    """Create the tracking store (sqlite schema) if needed; return the URI. Call before forking."""
    uri = uri or paths.default_tracking_uri()
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    _client(uri).search_experiments(max_results=1)
    return uri


def get_or_create_experiment(uri: str, name: str) -> str:
    """Experiment id of ``name``, creating it (artifacts under the trustbench home) if missing."""
    client = _client(uri)
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp.experiment_id)
        return exp.experiment_id
    location = None
    if uri.startswith("sqlite:") or uri.startswith("file:") or "://" not in uri:
        location = (paths.artifact_root() / name).as_uri()
    try:
        return client.create_experiment(name, artifact_location=location)
    except Exception:  # created concurrently by another job
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def find_run(uri: str, experiment: str, run_key: str):
    """The newest MLflow run of ``experiment`` tagged with ``run_key``, or None."""
    client = _client(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return None
    runs = client.search_runs(
        [exp.experiment_id],
        filter_string=f"tags.`{metric_names.TAG_RUN_KEY}` = '{run_key}'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return runs[0] if runs else None


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Flatten nested mappings/lists into dotted keys (``objective.eps``, ``trainer.lr``)."""
    out: dict[str, Any] = {}
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            out.update(flatten(value, f"{prefix}{key}."))
    elif isinstance(obj, (list, tuple)) and any(isinstance(v, (Mapping, list, tuple)) for v in obj):
        for i, value in enumerate(obj):
            out.update(flatten(value, f"{prefix}{i}."))
    else:
        out[prefix[:-1]] = obj
    return out


def git_revision(path: Path | None = None) -> str:
    """``git describe``-like revision of the source tree (with ``-dirty``), or ``unknown``."""
    cwd = path or paths.repo_root()
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5
        )
        if rev.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=5,
        )
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def host_tags() -> dict[str, str]:
    tags = {metric_names.TAG_HOST: socket.gethostname()}
    for var in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_RESTART_COUNT"):
        if os.environ.get(var):
            tags[f"slurm.{var.lower()}"] = os.environ[var]
    return tags


class MetricHistory:
    """Every metric point of one run, per key, in typed arrays (24 bytes a point).

    Holds what ``HISTORY_ARTIFACT`` stores: ``to_table`` gives columns step (int64), key
    (dictionary), value (float64), timestamp (int64), exact duplicates dropped as MLflow drops them.
    ``latest(key)`` is the key's greatest (step, timestamp, value), the point MLflow reports as the
    key's latest metric.
    """

    def __init__(self) -> None:
        self._series: dict[str, tuple[array, array, array]] = {}
        self._latest: dict[str, tuple[int, int, float]] = {}

    def __len__(self) -> int:
        return sum(len(steps) for steps, _, _ in self._series.values())

    def keys(self) -> list[str]:
        return list(self._series)

    def add(self, key: str, step: int, value: float, timestamp: int) -> None:
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = (array("q"), array("d"), array("q"))
        series[0].append(step)
        series[1].append(value)
        series[2].append(timestamp)
        point = (step, timestamp, value)
        top = self._latest.get(key)
        if top is None or point > top:
            self._latest[key] = point

    def replace(self, key: str, points: Iterable) -> None:
        """Make ``points`` (objects with ``step``, ``value``, ``timestamp``) the whole series of ``key``."""
        self.drop(key)
        for m in points:
            self.add(key, int(m.step), float(m.value), int(m.timestamp))

    def drop(self, key: str) -> None:
        self._series.pop(key, None)
        self._latest.pop(key, None)

    def extend(self, other: MetricHistory) -> None:
        for key, (steps, values, stamps) in other._series.items():
            for point in zip(steps, values, stamps):
                self.add(key, *point)

    def latest(self, key: str) -> tuple[int, int, float] | None:
        return self._latest.get(key)

    def to_table(self, run_id: str):
        """A pyarrow table (columns step, key, value, timestamp) tagged with ``run_id`` in its metadata."""
        import numpy as np
        import pyarrow as pa

        names = sorted(self._series)
        dtypes = (np.int64, np.float64, np.int64)  # step, value, timestamp
        parts = []
        for key in names:
            series = [np.frombuffer(buf, dtype) for buf, dtype in zip(self._series[key], dtypes)]
            keep = _unique_points(*series)
            parts.append(series if keep is None else [col[keep] for col in series])
        columns = [
            np.concatenate([part[i] for part in parts]) if parts else np.zeros(0, t) for i, t in enumerate(dtypes)
        ]
        codes = np.repeat(np.arange(len(names), dtype=np.int32), [len(part[0]) for part in parts])
        keys = pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(names, pa.string()))
        table = pa.table({"step": columns[0], "key": keys, "value": columns[1], "timestamp": columns[2]})
        return table.replace_schema_metadata({b"trustbench.run_id": run_id.encode()})

    @classmethod
    def from_table(cls, table) -> MetricHistory:
        history = cls()
        columns = [table.column(c).to_pylist() for c in ("key", "step", "value", "timestamp")]
        for key, step, value, timestamp in zip(*columns):
            history.add(key, step, value, timestamp)
        return history

    def describe(self) -> dict[str, Any]:
        """The ``TAG_HISTORY`` value: points, keys and the last ``STEP_METRIC`` step (None if absent)."""
        top = self._latest.get(STEP_METRIC)
        return {"points": len(self), "keys": len(self._series), "last_step": top[0] if top else None}


def _unique_points(steps, values, stamps):
    """None if a series' points are all distinct (cheap: (step, timestamp) strictly increasing, as
    the tracker logs them), else a mask keeping the first of each exact duplicate."""
    import numpy as np

    ds, dt = np.diff(steps), np.diff(stamps)
    if ((ds > 0) | ((ds == 0) & (dt > 0))).all():
        return None
    import pandas as pd

    return ~pd.DataFrame({"s": steps, "v": values, "t": stamps}).duplicated().to_numpy()


def _same_point(ours: tuple[int, int, float] | None, theirs: tuple[int, int, float]) -> bool:
    """Same (step, timestamp, value), NaN equal to NaN."""
    if ours is None or ours[:2] != theirs[:2]:
        return False
    a, b = ours[2], theirs[2]
    return a == b or (math.isnan(a) and math.isnan(b))


def _store_state(client, run_id: str) -> tuple[dict[str, tuple[int, int, float]], dict[str, str]]:
    """({key: latest (step, timestamp, value)}, tags) of a run, in one ``get_run``."""
    run = client.get_run(run_id)
    latest = {m.key: (int(m.step), int(m.timestamp), float(m.value)) for m in run.data._metric_objs}
    return latest, dict(run.data.tags)


@dataclass
class RunTracker:
    """An open MLflow run with buffered asynchronous metric logging and a history artifact."""

    uri: str
    experiment_id: str
    run_id: str
    resumed: bool
    last_logged_step: int = -1
    flush_every_s: float = 5.0
    # write HISTORY_ARTIFACT at checkpoints and at the end (module docstring)
    write_history: bool = True
    _buffer: list = field(default_factory=list)
    _pending: list = field(default_factory=list)
    _last_flush: float = field(default_factory=time.monotonic)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # points sent by this tracker (plus, once merged, the previous attempts' history)
    _history: MetricHistory = field(default_factory=MetricHistory)
    _history_dirty: bool = False  # points sent since the artifact was last written
    _history_written: bool = False  # this attempt wrote the artifact at least once
    _history_merged: bool = False  # a resumed attempt's history includes the earlier attempts'
    _history_unread: set = field(default_factory=set)  # keys to read back from the store before writing
    _store_at_resume: tuple | None = None  # (latest per key, tags) before this attempt sent a point

    # -- opening -------------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        *,
        uri: str,
        experiment: str,
        run_key: str,
        run_name: str,
        tags: Mapping[str, Any],
        params: Mapping[str, Any],
        run_id: str | None = None,
        new: bool = False,
    ) -> RunTracker:
        """Resume the run of ``run_key`` (``run_id`` if known, else by tag) or create it (``new``: always)."""
        client = _client(uri)
        experiment_id = get_or_create_experiment(uri, experiment)
        run = None
        if run_id and not new:
            try:
                run = client.get_run(run_id)
            except Exception:
                run = None
        if run is None and not new:
            run = find_run(uri, experiment, run_key)
        resumed = run is not None
        if run is None:
            all_tags = {metric_names.TAG_RUN_KEY: run_key, **{k: str(v) for k, v in tags.items()}}
            run = client.create_run(experiment_id, tags=all_tags, run_name=run_name)
            _log_params(client, run.info.run_id, params)
        else:
            client.update_run(run.info.run_id, status="RUNNING")
            for key, value in tags.items():
                client.set_tag(run.info.run_id, key, str(value))
        tracker = cls(uri=uri, experiment_id=experiment_id, run_id=run.info.run_id, resumed=resumed)
        if resumed:
            tracker.last_logged_step = last_logged_step(client, run.info.run_id)
        return tracker

    # -- metrics ---------------------------------------------------------------------------------
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Buffer ``metrics`` for ``step``; steps already in MLflow (after a resume) are dropped."""
        if step <= self.last_logged_step:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        with self._lock:
            for key, value in {**metrics, STEP_METRIC: step}.items():
                value = float(value)
                if math.isfinite(value):
                    self._buffer.append(Metric(key=key, value=value, timestamp=now, step=step))
        if time.monotonic() - self._last_flush > self.flush_every_s:
            self.flush(wait=False)

    def flush(self, wait: bool = True) -> None:
        """Send buffered metrics; with ``wait`` block until everything sent so far is stored, then
        (if new points were sent) write the history artifact (a checkpoint's flush)."""
        self._send(wait)
        if wait and self._history_dirty:
            self.save_history()

    def _send(self, wait: bool) -> None:
        client = _client(self.uri)
        if self.write_history and self.resumed and self._store_at_resume is None:
            self._store_at_resume = _store_state(client, self.run_id)  # before this attempt's first point
        with self._lock:
            batch, self._buffer = self._buffer, []
            self._last_flush = time.monotonic()
            if self.write_history and batch:
                for m in batch:
                    self._history.add(m.key, m.step, m.value, m.timestamp)
                self._history_dirty = True
        for i in range(0, len(batch), _BATCH_METRICS):
            op = client.log_batch(self.run_id, metrics=batch[i : i + _BATCH_METRICS], synchronous=False)
            if op is not None:
                self._pending.append(op)
        if wait:
            for op in self._pending:
                op.wait()
            self._pending.clear()

    # -- history artifact ------------------------------------------------------------------------
    def save_history(self, final: bool = False) -> bool:
        """Write ``HISTORY_ARTIFACT`` and ``TAG_HISTORY`` from the points sent (call after a waited
        flush); ``final``: also when nothing new was sent, so other writers' points are picked up.

        Keys whose latest point in the store is not the tracker's are read back first (module
        docstring). Returns whether the artifact was written; errors only warn.
        """
        if not self.write_history or not (final or self._history_dirty):
            return False
        try:
            return self._save_history(_client(self.uri))
        except Exception as err:  # noqa: BLE001 - the artifact is an optimisation, never a reason to fail
            self._history_dirty = True  # written next time
            _log.warning("run %s: metric history artifact not written (%s: %s)", self.run_id, type(err).__name__, err)
            return False

    def _save_history(self, client) -> bool:
        if self.resumed and not self._history_merged:
            self._merge_previous(client)
        latest, _ = _store_state(client, self.run_id)
        with self._lock:
            history = self._history
            self._history_unread |= {k for k, point in latest.items() if not _same_point(history.latest(k), point)}
            gone = [k for k in history.keys() if k not in latest]
            changed = self._history_dirty or bool(self._history_unread) or bool(gone)
        for key in sorted(self._history_unread):
            points = client.get_metric_history(self.run_id, key)
            with self._lock:
                history.replace(key, points)
                self._history_unread.discard(key)
        with self._lock:
            for key in gone:  # not in the store: the artifact mirrors the store
                history.drop(key)
            self._history_dirty = False
            if (not changed and self._history_written) or not (latest or self._history_written):
                return False  # nothing new, or a run without metrics
            table = history.to_table(self.run_id)
            description = history.describe()
        import pyarrow.parquet as pq

        with tempfile.TemporaryDirectory(prefix="trustbench-history-") as tmp:
            local = Path(tmp) / Path(HISTORY_ARTIFACT).name
            pq.write_table(table, local, compression="zstd")
            client.log_artifact(self.run_id, str(local), str(Path(HISTORY_ARTIFACT).parent))
        client.set_tag(self.run_id, TAG_HISTORY, json.dumps(description))
        self._history_written = True
        return True

    def _merge_previous(self, client) -> None:
        """Resumed attempt: put the previous artifact's points under this attempt's; the keys it does
        not cover (latest point in the store before this attempt differs) are to be read back."""
        if self._store_at_resume is None:  # nothing sent yet: the store is as the last attempt left it
            self._store_at_resume = _store_state(client, self.run_id)
        before, tags = self._store_at_resume
        previous = _read_history(client, self.run_id) if TAG_HISTORY in tags else None
        base = previous or MetricHistory()
        for key in base.keys():
            if key not in before:
                base.drop(key)
        stale = {k for k, point in before.items() if not _same_point(base.latest(k), point)}
        with self._lock:
            base.extend(self._history)
            self._history = base
            self._history_unread |= stale
            self._history_merged = True

    # -- artifacts and tags ----------------------------------------------------------------------
    def log_text(self, text: str, artifact_file: str) -> None:
        _client(self.uri).log_text(self.run_id, text, artifact_file)

    def log_artifact(self, local_path: str | Path, artifact_path: str | None = None) -> None:
        _client(self.uri).log_artifact(self.run_id, str(local_path), artifact_path)

    def set_tag(self, key: str, value: Any) -> None:
        _client(self.uri).set_tag(self.run_id, key, str(value))

    def finish(self, status: str = "FINISHED", reason: str | None = None) -> None:
        """Flush, write the history artifact and mark the run ``FINISHED`` / ``FAILED`` / ``KILLED``
        (with the failure reason)."""
        try:
            self._send(wait=True)
            self.save_history(final=True)
        finally:
            client = _client(self.uri)
            if reason:
                client.set_tag(self.run_id, metric_names.TAG_FAILURE, reason[:_MAX_PARAM_LEN])
            client.set_terminated(self.run_id, status=status)


def _read_history(client, run_id: str) -> MetricHistory | None:
    """The run's ``HISTORY_ARTIFACT`` (None if absent, unreadable or another run's)."""
    import pyarrow.parquet as pq

    try:
        with tempfile.TemporaryDirectory(prefix="trustbench-history-") as tmp:
            table = pq.read_table(client.download_artifacts(run_id, HISTORY_ARTIFACT, tmp))
    except Exception as err:  # noqa: BLE001 - then the history is read from the store
        _log.warning("run %s: previous metric history artifact not read (%s: %s)", run_id, type(err).__name__, err)
        return None
    if (table.schema.metadata or {}).get(b"trustbench.run_id") != run_id.encode():
        return None
    return MetricHistory.from_table(table)


def last_logged_step(client, run_id: str) -> int:
    history = client.get_metric_history(run_id, STEP_METRIC)
    return max((int(m.step) for m in history), default=-1)


def _log_params(client, run_id: str, params: Mapping[str, Any]) -> None:
    from mlflow.entities import Param

    items = []
    for key, value in params.items():
        text = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
        items.append(Param(key, text[:_MAX_PARAM_LEN]))
    for i in range(0, len(items), 100):
        client.log_batch(run_id, params=items[i : i + 100], synchronous=True)
