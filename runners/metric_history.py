"""The metric-history artifact of a run: every point in one parquet file (``metrics/history.parquet``).

Why: a remote MLflow server answers ~50-100 us per point through its REST readers; one download
per run instead lets ``analysis`` read a finished sweep cold in seconds. ``runners.tracking``'s
``RunTracker`` writes the artifact at every synchronous flush that sent new points (checkpoints)
and at the end of the run (FINISHED, FAILED, KILLED), and describes it in the
``trustbench.metric_history`` tag; ``analysis`` reads it.

How the artifact stays equal to the store (``HistoryArtifact``): the tracker keeps every point it
sent (``MetricHistory``, ~24 bytes a point) and, before each write, checks each key's latest point
against the store (one ``get_run``): keys it does not account for (written by another writer, e.g.
verl's own MLflow logger, or by an earlier attempt after its last artifact) are read back once with
``get_metric_history``. A resumed attempt starts from the previous artifact, keeping the keys whose
latest point the store still reports (so after a clean stop nothing is re-read; after a hard kill,
the keys logged since the last checkpoint). Like the analysis cache, a point logged at an *older*
step than its key's latest after an artifact was written is not detected.

Columns: step (int64), key (dictionary), value (float64), timestamp (int64); zstd. Imports mlflow
lazily (through the client it is handed), never torch.

Also here: how the tracker cuts its points into ``log_batch`` calls (``whole_step_chunks``: whole
steps per call, so that a killed process leaves whole steps in the store).
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
import threading
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runners.store_errors import describe_error

# metric logged every step; its history tells which steps are already in MLflow
STEP_METRIC = "training/global_step"
# the run's whole metric history, written by RunTracker at checkpoints and at the end
HISTORY_ARTIFACT = "metrics/history.parquet"
# tag describing that artifact (JSON: points, keys, last_step of STEP_METRIC or null)
TAG_HISTORY = "trustbench.metric_history"
_log = logging.getLogger(__name__)


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


def store_state(client, run_id: str) -> tuple[dict[str, tuple[int, int, float]], dict[str, str]]:
    """({key: latest (step, timestamp, value)}, tags) of a run, in one ``get_run``."""
    run = client.get_run(run_id)
    latest = {m.key: (int(m.step), int(m.timestamp), float(m.value)) for m in run.data._metric_objs}
    return latest, dict(run.data.tags)


def read_history(client, run_id: str) -> MetricHistory | None:
    """The run's ``HISTORY_ARTIFACT`` (None if absent, unreadable or another run's)."""
    import pyarrow.parquet as pq

    try:
        with tempfile.TemporaryDirectory(prefix="trustbench-history-") as tmp:
            table = pq.read_table(client.download_artifacts(run_id, HISTORY_ARTIFACT, tmp))
    except Exception as err:  # noqa: BLE001 - then the history is read from the store
        _log.warning("run %s: previous metric history artifact not read (%s)", run_id, describe_error(err))
        return None
    if (table.schema.metadata or {}).get(b"trustbench.run_id") != run_id.encode():
        return None
    return MetricHistory.from_table(table)


@dataclass
class HistoryArtifact:
    """The history of one run's points as the tracker sent them, and the writing of its artifact.

    ``lock`` is the tracker's (``record`` is called with it held). Errors propagate: the tracker
    turns them into a warning and retries at the next write."""

    run_id: str
    resumed: bool
    lock: threading.Lock
    # points sent by this tracker (plus, once merged, the previous attempts' history)
    history: MetricHistory = field(default_factory=MetricHistory)
    dirty: bool = False  # points sent since the artifact was last written
    written: bool = False  # this attempt wrote the artifact at least once
    merged: bool = False  # a resumed attempt's history includes the earlier attempts'
    unread: set = field(default_factory=set)  # keys to read back from the store before writing
    store_at_resume: tuple | None = None  # (latest per key, tags) before this attempt sent a point

    def before_send(self, client) -> None:
        """Call before sending points: a resumed attempt notes the store as the last attempt left it."""
        if self.resumed and self.store_at_resume is None:
            self.store_at_resume = store_state(client, self.run_id)

    def record(self, batch: Iterable) -> None:
        """Points (``mlflow.entities.Metric``) just sent; call with ``lock`` held."""
        for m in batch:
            self.history.add(m.key, m.step, m.value, m.timestamp)
        self.dirty = True

    def write(self, client) -> bool:
        """Write ``HISTORY_ARTIFACT`` and ``TAG_HISTORY`` if anything changed; returns whether it did."""
        if self.resumed and not self.merged:
            self._merge_previous(client)
        latest, _ = store_state(client, self.run_id)
        with self.lock:
            history = self.history
            self.unread |= {k for k, point in latest.items() if not _same_point(history.latest(k), point)}
            gone = [k for k in history.keys() if k not in latest]
            changed = self.dirty or bool(self.unread) or bool(gone)
        for key in sorted(self.unread):
            points = client.get_metric_history(self.run_id, key)
            with self.lock:
                history.replace(key, points)
                self.unread.discard(key)
        with self.lock:
            for key in gone:  # not in the store: the artifact mirrors the store
                history.drop(key)
            self.dirty = False
            if (not changed and self.written) or not (latest or self.written):
                return False  # nothing new, or a run without metrics
            table = history.to_table(self.run_id)
            description = history.describe()
        import pyarrow.parquet as pq

        with tempfile.TemporaryDirectory(prefix="trustbench-history-") as tmp:
            local = Path(tmp) / Path(HISTORY_ARTIFACT).name
            pq.write_table(table, local, compression="zstd")
            client.log_artifact(self.run_id, str(local), str(Path(HISTORY_ARTIFACT).parent))
        client.set_tag(self.run_id, TAG_HISTORY, json.dumps(description))
        self.written = True
        return True

    def _merge_previous(self, client) -> None:
        """Resumed attempt: put the previous artifact's points under this attempt's; the keys it does
        not cover (latest point in the store before this attempt differs) are to be read back."""
        if self.store_at_resume is None:  # nothing sent yet: the store is as the last attempt left it
            self.store_at_resume = store_state(client, self.run_id)
        before, tags = self.store_at_resume
        previous = read_history(client, self.run_id) if TAG_HISTORY in tags else None
        base = previous or MetricHistory()
        for key in base.keys():
            if key not in before:
                base.drop(key)
        stale = {k for k, point in before.items() if not _same_point(base.latest(k), point)}
        with self.lock:
            base.extend(self.history)
            self.history = base
            self.unread |= stale
            self.merged = True


# MLflow accepts <= 1000 entities per log_batch
BATCH_METRICS = 900


def whole_step_chunks(calls: list[list], limit: int = BATCH_METRICS) -> list[list]:
    """The points of ``calls`` (one list per ``log_metrics`` call), in order, cut into ``log_batch``
    chunks of at most ``limit`` points that never split a call, unless the call alone holds more
    (then it is cut in order, its step metric in the last piece)."""
    chunks: list[list] = []
    current: list = []
    for call in calls:
        if current and len(current) + len(call) > limit:
            chunks.append(current)
            current = []
        while len(call) > limit:
            chunks.append(call[:limit])
            call = call[limit:]
        current.extend(call)
    if current:
        chunks.append(current)
    return chunks
