"""MLflow run lifecycle: one MLflow run per grid cell, found again by its run key.

Design:
- The tracking URI defaults to a sqlite file under the trustbench home (``runners.paths``).
  ``ensure_store`` creates a missing sqlite store whole, once, however many processes start at once
  (``runners.sqlite_store``: MLflow's own schema migration is not safe to race).
- One experiment per sweep (its name), one run per cell, named method and seed first
  (``GRPO + TROLL · s0``, ``runners.config.run_name``) and tagged with ``trustbench.run_key``, a hash of the
  resolved config. Re-running the same cell finds its run by that key: a FINISHED run is skipped, any
  other is resumed into the same run id (``RunTracker.open``).
- Metrics go through a buffer flushed in the background every few seconds, and waited for at
  checkpoints and at the end, so that everything up to the last checkpoint is durable. The store
  only ever holds whole steps, in order, whenever the process is killed: the points of one
  ``log_metrics`` call (one step, the step metric last) go into one ``log_batch`` (one transaction)
  unless they alone exceed MLflow's 1,000-entity limit, and one writer thread commits the batches
  in the order they were logged, each acknowledged before the next (MLflow's own asynchronous
  logging commits them from a thread pool in any order: a kill could leave gaps below the last
  stored step). On resume, steps up to the last one stored are not logged again
  (``last_logged_step``): training resumes from the checkpoint with its RNG state, so the steps it
  recomputes are the same steps; params missing from the run (a kill while it was created) are
  added.
- A store that fails (a full disk, a server gone) is reported once, by the command, in one line
  (``describe_error``); MLflow's own logging of each failed write (a traceback per SQL error, the
  whole exception per failed asynchronous batch) is filtered out: the same error reaches the
  caller of the write or of the next waited flush.
- Every synchronous flush that sent new points (checkpoints) and the end of the run (FINISHED,
  FAILED, KILLED) also write the run's whole metric history as one artifact,
  ``metrics/history.parquet`` (``runners.metric_history``: why, and how it stays equal to the
  store). Writing the artifact never fails the run (a warning; ``analysis`` then reads that run
  through the server).

This module imports mlflow but not torch.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import socket
import subprocess
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runners import metric_names, mlflow_ui, paths
from runners.backends.base import check_finite
from runners.metric_history import (  # noqa: F401  (HISTORY_ARTIFACT, TAG_HISTORY, MetricHistory: re-exported)
    HISTORY_ARTIFACT,
    STEP_METRIC,
    TAG_HISTORY,
    HistoryArtifact,
    MetricHistory,
    whole_step_chunks,
)
from runners.redact import redact
from runners.sqlite_store import ensure_sqlite_store
from runners.store_errors import describe_error

_MAX_PARAM_LEN = 6000
_log = logging.getLogger(__name__)


class _StoreErrorFilter(logging.Filter):
    """Drops MLflow's log records of a failed store write, which the caller gets as an exception."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        return not (msg.startswith("SQLAlchemy database error") or "Failed to log run data" in msg)


for _name in ("mlflow.store.db.utils", "mlflow.utils.async_logging.async_logging_queue"):
    logging.getLogger(_name).addFilter(_StoreErrorFilter())


def _client(uri: str):
    from mlflow import MlflowClient

    if redact(uri) != uri:  # MLflow prints run links with the URI's credentials: not for such a URI
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    return MlflowClient(tracking_uri=uri)


def ensure_store(uri: str | None = None) -> str:
    """Create the tracking store if needed (a sqlite file: whole, once, safe against parallel
    starts, ``runners.sqlite_store``); return the URI."""
    uri = uri or paths.default_tracking_uri()
    db = paths.sqlite_path(uri)
    if db is not None:
        ensure_sqlite_store(db)
    _client(uri).search_experiments(max_results=1)
    return uri


def get_or_create_experiment(uri: str, name: str, group_by: str | None = metric_names.TAG_METHOD) -> str:
    """Experiment id of ``name``, creating it (artifacts under the trustbench home) if missing; it
    carries the tags that open it on its runs in the MLflow UI, grouped by ``group_by`` (``runners.mlflow_ui``)."""
    client = _client(uri)
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp.experiment_id)
        mlflow_ui.tag_experiment(client, exp, group_by)  # an experiment from before the tags gets them now
        return exp.experiment_id
    location = None
    if uri.startswith("sqlite:") or uri.startswith("file:") or "://" not in uri:
        location = (paths.artifact_root() / name).as_uri()
    try:
        return client.create_experiment(name, artifact_location=location, tags=mlflow_ui.experiment_tags(group_by))
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
    """The source tree's commit (12 hex digits), with ``-dirty.<8 hex digits of the diff>`` when tracked
    files differ from it (two different edits of one commit differ), or ``unknown`` outside git."""
    cwd = path or paths.repo_root()
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5
        )
        if rev.returncode != 0:
            return "unknown"
        diff = subprocess.run(
            ["git", "diff", "HEAD", "--binary", "--no-ext-diff", "--no-color"], cwd=cwd, capture_output=True, timeout=20
        )
        if diff.returncode != 0:
            return "unknown"
        suffix = f"-dirty.{hashlib.sha256(diff.stdout).hexdigest()[:8]}" if diff.stdout.strip() else ""
        return rev.stdout.strip() + suffix
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def package_version() -> str:
    """The installed trustbench package's version (the source's own where it is not installed)."""
    try:
        return importlib.metadata.version("trustbench")
    except importlib.metadata.PackageNotFoundError:
        from runners import __version__

        return __version__


def code_version_tags() -> dict[str, str]:
    """The tags every run records for the code it ran (``metric_names.code_version_label`` names them)."""
    return {metric_names.TAG_GIT_REVISION: git_revision(), metric_names.TAG_PACKAGE_VERSION: package_version()}


def host_tags() -> dict[str, str]:
    tags = {metric_names.TAG_HOST: socket.gethostname()}
    for var in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_RESTART_COUNT"):
        if os.environ.get(var):
            tags[f"slurm.{var.lower()}"] = os.environ[var]
    return tags


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
    _buffer: list = field(default_factory=list)  # one list of points per log_metrics call
    _pending: list = field(default_factory=list)  # futures of the writer's batches not yet waited for
    _writer: Any = field(default=None, repr=False)  # one thread: batches committed in logging order
    _write_error: BaseException | None = field(default=None, repr=False)  # the writer's first failure
    _last_flush: float = field(default_factory=time.monotonic)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # the history of the points sent and the writing of its artifact (runners.metric_history)
    _artifact: HistoryArtifact = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._artifact = HistoryArtifact(run_id=self.run_id, resumed=self.resumed, lock=self._lock)

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
            if metric_names.TAG_FAILURE in run.data.tags:  # the reason of an earlier attempt, not of this one
                client.delete_tag(run.info.run_id, metric_names.TAG_FAILURE)
        tracker = cls(uri=uri, experiment_id=experiment_id, run_id=run.info.run_id, resumed=resumed)
        if resumed:
            missing = {key: value for key, value in params.items() if key not in run.data.params}
            if missing:  # created by an attempt killed before all its params were stored
                _log_params(client, run.info.run_id, missing)
            tracker.last_logged_step = last_logged_step(client, run.info.run_id)
        return tracker

    # -- metrics ---------------------------------------------------------------------------------
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Buffer ``metrics`` for ``step``; steps already in MLflow (after a resume) are dropped."""
        if step <= self.last_logged_step:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        values = {key: float(value) for key, value in {**metrics, STEP_METRIC: step}.items()}
        # never dropped silently: a NaN or inf stops the run (FAILED, naming the metric and step)
        check_finite(values, step)
        with self._lock:
            points = [Metric(key=key, value=value, timestamp=now, step=step) for key, value in values.items()]
            self._buffer.append(points)
        if time.monotonic() - self._last_flush > self.flush_every_s:
            self.flush(wait=False)

    def flush(self, wait: bool = True) -> None:
        """Send buffered metrics; with ``wait`` block until everything sent so far is stored, then
        (if new points were sent) write the history artifact (a checkpoint's flush)."""
        self._send(wait)
        if wait and self._artifact.dirty:
            self.save_history()

    def _send(self, wait: bool) -> None:
        client = _client(self.uri)
        if self.write_history:
            self._artifact.before_send(client)  # a resumed run: the store before this attempt's first point
        with self._lock:
            calls, self._buffer = self._buffer, []
            self._last_flush = time.monotonic()
            if self.write_history and calls:
                self._artifact.record([point for call in calls for point in call])
        if calls and self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trustbench-metrics")
        for chunk in whole_step_chunks(calls):
            self._pending.append(self._writer.submit(self._commit, client, chunk))
        if wait:
            pending, self._pending = self._pending, []
            errors = [err for err in (future.exception() for future in pending) if err is not None]
            if errors:
                raise errors[0]

    def _commit(self, client, chunk: list) -> None:
        """One batch, on the writer thread. After a failed batch no later one is written (each
        raises that failure): the store keeps whole steps 0..s with no gap above a failed one."""
        if self._write_error is not None:
            raise self._write_error
        try:
            client.log_batch(self.run_id, metrics=chunk, synchronous=True)
        except BaseException as err:
            self._write_error = err
            raise

    # -- history artifact ------------------------------------------------------------------------
    def save_history(self, final: bool = False) -> bool:
        """Write ``HISTORY_ARTIFACT`` and ``TAG_HISTORY`` from the points sent (call after a waited
        flush); ``final``: also when nothing new was sent, so other writers' points are picked up.

        Keys whose latest point in the store is not the tracker's are read back first
        (``runners.metric_history``). Returns whether the artifact was written; errors only warn.
        """
        if not self.write_history or not (final or self._artifact.dirty):
            return False
        try:
            return self._artifact.write(_client(self.uri))
        except Exception as err:  # noqa: BLE001 - the artifact is an optimisation, never a reason to fail
            self._artifact.dirty = True  # written next time
            _log.warning("run %s: metric history artifact not written (%s)", self.run_id, describe_error(err))
            return False

    # -- artifacts and tags ----------------------------------------------------------------------
    def log_text(self, text: str, artifact_file: str) -> None:
        _client(self.uri).log_text(self.run_id, text, artifact_file)

    def log_artifact(self, local_path: str | Path, artifact_path: str | None = None) -> None:
        _client(self.uri).log_artifact(self.run_id, str(local_path), artifact_path)

    def set_tag(self, key: str, value: Any) -> None:
        _client(self.uri).set_tag(self.run_id, key, str(value))

    def finish(self, status: str = "FINISHED", reason: str | None = None) -> None:
        """Flush, write the history artifact and mark the run ``FINISHED`` / ``FAILED`` / ``KILLED``
        (with the failure reason). Each step is tried even if an earlier one failed (a full disk,
        a server gone): the status is what matters most; the first error is raised at the end."""
        client = _client(self.uri)
        steps = [lambda: self._send(wait=True), lambda: self.save_history(final=True)]
        if reason:
            steps.append(lambda: client.set_tag(self.run_id, metric_names.TAG_FAILURE, reason[:_MAX_PARAM_LEN]))
        steps.append(lambda: client.set_terminated(self.run_id, status=status))
        errors = []
        for step in steps:
            try:
                step()
            except Exception as err:  # noqa: BLE001 - go on; raised below
                errors.append(err)
        if self._writer is not None:  # every batch was waited for above: the writer thread ends here
            self._writer.shutdown(wait=False)
            self._writer = None
        if errors:
            raise errors[0]


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
