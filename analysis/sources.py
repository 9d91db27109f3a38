"""Bulk readers of MLflow metric histories, one per kind of tracking store.

Design: MLflow's Python client only offers ``get_metric_history(run_id, key)``, one request per run
per metric (100 runs x 10 metrics = 1000 round trips). Each store has a bulk path instead:

- ``sqlite:`` stores: one SQL query on the store's ``metrics`` table (columns ``run_uuid, key,
  value, timestamp, step, is_nan``, stable since MLflow 1.x), opened read-only. Legitimate because
  the sqlite file *is* the store; if the schema ever differs the loader falls back to the client.
- ``http(s):`` servers: the tracking server's ajax endpoints used by the MLflow UI, one metric key
  for up to 100 runs per request. Whole histories come from ``get-history-bulk`` (plain JSON, at
  most 25000 points per request: runs are grouped so their expected points fit, and a group that
  hits the cap is split). Tails of incremental reads come from ``get-history-bulk-interval`` with
  ``[start_step, end_step]`` windows of 2500 steps (it samples down to 2500 points per run, so a
  window that comes back full is re-read in halves). Measured: the interval endpoint is several
  times slower per point (window-function SQL and protobuf JSON on the server).
- ``file:`` stores (maintenance mode in MLflow 3, needs ``MLFLOW_ALLOW_FILE_STORE=true``): the
  ``<root>/<experiment_id>/<run_id>/metrics/<key>`` files ("timestamp value step" lines), read directly.
- a tracking server whose sqlite backend file is readable here (``backend_uri``, or
  ``$TRUSTBENCH_MLFLOW_BACKEND_URI``): runs are listed through the server, histories read by SQL.
  Worth it: MLflow's server spends ~50-100 us per point building ORM objects and JSON whatever the
  endpoint, which caps every REST path at a few times the naive loop (tests/benchmarks).
- anything else: the per-run per-metric client loop (also the benchmark's naive baseline).

In front of the server and client readers, ``ArtifactSource`` reads runs that have ended from the
``metrics/history.parquet`` artifact their ``RunTracker`` wrote (``runners.tracking``): one
download per run (a few threads), no per-point work on the server. ``analysis.load.plan_artifacts``
picks the runs (terminal status, tag reporting the listing's last ``training/global_step``); the
artifact must then hold every key the listing has with the same latest (step, timestamp), else the
run is read through the wrapped reader, as are running runs and runs without the artifact.
Measured (tests/benchmarks/bench_mlflow_load.py, 100 runs x 10 metrics x 1000 steps, 2 cores,
server on 127.0.0.1 proxying artifacts): naive loop 67-111 s, get-history-bulk 19-21 s, artifacts
1.5-1.7 s (41-64x the naive loop; ~30 ms a download, 4 at a time); the warm parquet cache 0.23 s.

Every reader takes ``FetchRequest``s (run, metric keys with their latest step, first step wanted)
and returns a frame with ``analysis.frames.METRIC_COLUMNS``; ``pick_source`` chooses one for a tracking
URI (the store's files on this machine found by ``analysis.store_files``).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import pandas as pd
from tqdm.auto import tqdm

from analysis.frames import METRIC_COLUMNS, empty_metrics, normalize_metrics
from analysis.store_files import file_store_root, has_metrics_table, sqlite_path

BULK_ENDPOINT = "/ajax-api/2.0/mlflow/metrics/get-history-bulk"
BULK_INTERVAL_ENDPOINT = "/ajax-api/2.0/mlflow/metrics/get-history-bulk-interval"
MAX_RUNS_PER_REQUEST = 100  # mlflow.server.handlers: at most 100 run ids per bulk request
MAX_BULK_ROWS = 25000  # get-history-bulk returns at most 25000 points per request (all runs together)
MAX_ROWS_PER_RUN = 2500  # get-history-bulk-interval samples down to 2500 points per run
SQL_CHUNK = 500  # run ids per IN (...) clause (sqlite's variable limit is >= 999)
_log = logging.getLogger(__name__)


@dataclass
class FetchRequest:
    """Points wanted from one run: ``keys`` maps metric -> latest logged step; steps >= from_step."""

    run_id: str
    experiment_id: str
    keys: dict[str, int] = field(default_factory=dict)
    from_step: int | None = None  # None: whole history
    # set by analysis.load.plan_artifacts: the run's artifact root, to read HISTORY_ARTIFACT from
    artifact_uri: str | None = None
    # with artifact_uri: {metric: (latest step, timestamp)} from the run listing, which the artifact must match
    latest: dict[str, tuple[int, int]] | None = None


def _frame(rows: list[tuple] | pd.DataFrame) -> pd.DataFrame:
    if isinstance(rows, pd.DataFrame):
        return normalize_metrics(rows) if len(rows) else empty_metrics()
    if not rows:
        return empty_metrics()
    return normalize_metrics(pd.DataFrame(rows, columns=METRIC_COLUMNS))


class SqliteSource:
    """Reads the ``metrics`` table of a ``sqlite:`` store directly (read-only connection)."""

    name = "sqlite-sql"

    def __init__(self, db_path: str | Path) -> None:
        self.db_path = Path(db_path)
        if not self.db_path.exists():
            raise FileNotFoundError(f"MLflow sqlite store {self.db_path} does not exist")

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True)

    def fetch(self, requests: list[FetchRequest], progress: bool | None = None) -> pd.DataFrame:
        sql = (
            "SELECT run_uuid AS run_id, key AS metric, step, "
            "CASE WHEN is_nan THEN NULL ELSE value END AS value, timestamp FROM metrics "
        )
        full = [r.run_id for r in requests if r.from_step is None]
        partial = [r for r in requests if r.from_step is not None]
        chunks: list[tuple[str, list]] = []
        for i in range(0, len(full), SQL_CHUNK):
            ids = full[i : i + SQL_CHUNK]
            chunks.append((sql + f"WHERE run_uuid IN ({','.join('?' * len(ids))})", ids))
        for r in partial:
            chunks.append((sql + "WHERE run_uuid = ? AND step >= ?", [r.run_id, int(r.from_step)]))
        frames = []
        with self._connect() as con:
            for query, args in tqdm(chunks, desc="sqlite metrics", unit="query", disable=_quiet(progress, len(chunks))):
                frames.append(pd.read_sql_query(query, con, params=args))
        return _frame(pd.concat(frames, ignore_index=True)) if frames else empty_metrics()


class FileStoreSource:
    """Reads a ``file:`` store's metric files ("timestamp value step" per line) directly."""

    name = "file-store"

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def fetch(self, requests: list[FetchRequest], progress: bool | None = None) -> pd.DataFrame:
        frames = []
        total = sum(len(r.keys) for r in requests)
        with tqdm(total=total, desc="metric files", unit="file", disable=_quiet(progress, total)) as bar:
            for r in requests:
                base = self.root / r.experiment_id / r.run_id / "metrics"
                for key in r.keys:
                    path = base / key
                    bar.update(1)
                    if not path.exists():
                        continue
                    df = pd.read_csv(path, sep=" ", header=None, names=["timestamp", "value", "step"])
                    if r.from_step is not None:
                        df = df[df["step"] >= r.from_step]
                    df["run_id"], df["metric"] = r.run_id, key
                    frames.append(df)
        return _frame(pd.concat(frames, ignore_index=True)) if frames else empty_metrics()


class RestSource:
    """Reads a tracking server through its bulk endpoints (see module docstring)."""

    name = "rest-bulk"

    def __init__(self, get_host_creds, workers: int = 4) -> None:
        self.get_host_creds = get_host_creds
        self.workers = workers

    def _call(self, endpoint: str, params: dict) -> list[dict]:
        from mlflow.utils.rest_utils import http_request_safe

        response = http_request_safe(self.get_host_creds(), endpoint, "GET", params=params)
        return response.json().get("metrics", [])

    def _fetch_all(self, run_ids: list[str], key: str, last: int) -> list[dict]:
        """Whole histories of ``key`` (get-history-bulk); groups that hit the row cap are split."""
        rows = self._call(BULK_ENDPOINT, {"run_id": run_ids, "metric_key": key, "max_results": MAX_BULK_ROWS})
        if len(rows) < MAX_BULK_ROWS:
            return rows
        if len(run_ids) == 1:  # one run with more points than the cap: step windows instead
            return self._fetch_window(run_ids, key, 0, last)
        half = len(run_ids) // 2
        return self._fetch_all(run_ids[:half], key, last) + self._fetch_all(run_ids[half:], key, last)

    def _fetch_window(self, run_ids: list[str], key: str, start: int, end: int) -> list[dict]:
        """All points of ``key`` with start <= step <= end (get-history-bulk-interval), re-reading
        the runs whose window came back full (possibly sampled) in two halves."""
        params = {
            "run_ids": run_ids,
            "metric_key": key,
            "start_step": start,
            "end_step": end,
            "max_results": MAX_ROWS_PER_RUN,
        }
        rows = self._call(BULK_INTERVAL_ENDPOINT, params)
        counts: dict[str, int] = {}
        for row in rows:
            counts[row["run_id"]] = counts.get(row["run_id"], 0) + 1
        full = {rid for rid, n in counts.items() if n >= MAX_ROWS_PER_RUN}
        if not full:
            return rows
        if start == end:
            raise RuntimeError(
                f"metric {key!r} has more than {MAX_ROWS_PER_RUN} values at step {start} in runs {sorted(full)}; "
                "the bulk endpoints cannot return them all (use a sqlite store or the client reader)"
            )
        rows = [row for row in rows if row["run_id"] not in full]
        mid = (start + end) // 2
        ids = sorted(full)
        return rows + self._fetch_window(ids, key, start, mid) + self._fetch_window(ids, key, mid + 1, end)

    def _jobs(self, requests: list[FetchRequest]) -> list[tuple]:
        """Whole histories: runs grouped per key so the expected rows (last step + 1 each) stay below the
        bulk cap; tails of incremental reads: step windows from ``from_step``."""
        whole: dict[str, list[tuple[str, int]]] = {}
        tails: dict[tuple[str, int], list[tuple[str, int]]] = {}
        for r in requests:
            for key, last in r.keys.items():
                if r.from_step is None:
                    whole.setdefault(key, []).append((r.run_id, int(last)))
                else:
                    tails.setdefault((key, int(r.from_step)), []).append((r.run_id, int(last)))
        jobs: list[tuple] = []
        for key, runs in whole.items():
            batch: list[tuple[str, int]] = []
            expected = 0
            for rid, last in runs:
                if batch and (expected + last + 1 >= MAX_BULK_ROWS or len(batch) == MAX_RUNS_PER_REQUEST):
                    jobs.append(("all", [b for b, _ in batch], key, max(s for _, s in batch)))
                    batch, expected = [], 0
                batch.append((rid, last))
                expected += last + 1
            if batch:
                jobs.append(("all", [b for b, _ in batch], key, max(s for _, s in batch)))
        for (key, first), runs in tails.items():
            for i in range(0, len(runs), MAX_RUNS_PER_REQUEST):
                group = runs[i : i + MAX_RUNS_PER_REQUEST]
                last = max(step for _, step in group)
                ids = [rid for rid, _ in group]
                for start in range(first, last + 1, MAX_ROWS_PER_RUN):
                    jobs.append(("window", ids, key, start, min(start + MAX_ROWS_PER_RUN - 1, last)))
        return jobs

    def _run(self, job: tuple) -> list[dict]:
        kind, *args = job
        return self._fetch_all(*args) if kind == "all" else self._fetch_window(*args)

    def fetch(self, requests: list[FetchRequest], progress: bool | None = None) -> pd.DataFrame:
        jobs = self._jobs(requests)
        rows: list[dict] = []
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            results = pool.map(self._run, jobs)
            for part in tqdm(
                results, total=len(jobs), desc="bulk metric requests", unit="req", disable=_quiet(progress, len(jobs))
            ):
                rows.extend(part)
        if not rows:
            return empty_metrics()
        df = pd.DataFrame(rows).rename(columns={"key": "metric"})
        df["value"] = [float(v) for v in df["value"]]  # "NaN"/"Infinity" strings from protobuf JSON
        return _frame(df[METRIC_COLUMNS])


class ClientSource:
    """The naive reader: ``MlflowClient.get_metric_history`` once per run per metric."""

    name = "client-per-metric"

    def __init__(self, client) -> None:
        self.client = client

    def fetch(self, requests: list[FetchRequest], progress: bool | None = None) -> pd.DataFrame:
        rows: list[tuple] = []
        total = sum(len(r.keys) for r in requests)
        with tqdm(total=total, desc="metric histories", unit="metric", disable=_quiet(progress, total)) as bar:
            for r in requests:
                for key in r.keys:
                    for m in self.client.get_metric_history(r.run_id, key):
                        if r.from_step is None or m.step >= r.from_step:
                            rows.append((r.run_id, key, m.step, m.value, m.timestamp))
                    bar.update(1)
        return _frame(rows)


class ArtifactSource:
    """Whole histories of ended runs from their history artifact; everything else (and any run whose
    artifact is missing or does not match the listing) through ``fallback`` (module docstring)."""

    def __init__(self, fallback, tracking_uri: str, workers: int = 4) -> None:
        self.fallback = fallback
        self.tracking_uri = tracking_uri
        self.workers = workers
        self.name = f"artifacts+{fallback.name}"
        self.stats = {"artifact_runs": 0, "fallback_runs": 0}

    def _read(self, request: FetchRequest) -> pd.DataFrame | str:
        """The run's points (METRIC_COLUMNS) from its artifact, or why it cannot be used."""
        import pyarrow.parquet as pq
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

        from runners.metric_history import HISTORY_ARTIFACT

        try:
            repo = get_artifact_repository(request.artifact_uri, tracking_uri=self.tracking_uri)
            with tempfile.TemporaryDirectory(prefix="trustbench-history-") as tmp:
                local = os.path.join(tmp, "history.parquet")
                # the one-file primitive every artifact repository implements: one request, where
                # download_artifacts first lists the path to tell a file from a folder (and shows a bar)
                repo._download_file(HISTORY_ARTIFACT, local)
                table = pq.read_table(local)
        except Exception as err:  # noqa: BLE001 - absent or unreadable: the fallback reads the run
            return f"{type(err).__name__}: {err}"
        if (table.schema.metadata or {}).get(b"trustbench.run_id") != request.run_id.encode():
            return "the artifact belongs to another run"
        df = table.to_pandas().rename(columns={"key": "metric"})
        df["metric"] = df["metric"].astype(str)
        top = df.sort_values(["metric", "step", "timestamp"], kind="stable").drop_duplicates("metric", keep="last")
        have = {k: (int(s), int(t)) for k, s, t in zip(top["metric"], top["step"], top["timestamp"])}
        if have != dict(request.latest or {}):
            return "its latest points differ from the run's (points logged after it was written)"
        df["run_id"] = request.run_id
        return df[METRIC_COLUMNS]

    def fetch(self, requests: list[FetchRequest], progress: bool | None = None) -> pd.DataFrame:
        direct = [r for r in requests if r.artifact_uri and r.latest is not None]
        rest = [r for r in requests if not (r.artifact_uri and r.latest is not None)]
        frames, failed = [], []
        if direct:
            with ThreadPoolExecutor(max_workers=self.workers) as pool:
                results = pool.map(self._read, direct)
                for r, df in tqdm(
                    zip(direct, results),
                    total=len(direct),
                    desc="history artifacts",
                    unit="run",
                    disable=_quiet(progress, len(direct)),
                ):
                    if isinstance(df, str):
                        rest.append(r)
                        failed.append((r.run_id, df))
                    else:
                        frames.append(df)
        if failed:
            _log.warning(
                "%d run(s) have a history artifact that could not be used, read through %s instead (first: run %s: %s)",
                len(failed),
                self.fallback.name,
                *failed[0],
            )
        self.stats = {"artifact_runs": len(frames), "fallback_runs": len(rest)}
        if rest:
            frames.append(self.fallback.fetch(rest, progress=progress))
        frames = [f for f in frames if len(f)]
        return _frame(pd.concat(frames, ignore_index=True)) if frames else empty_metrics()


def pick_source(client, tracking_uri: str, bulk: bool = True, backend_uri: str | None = None, artifacts: bool = True):
    """The fastest reader for ``tracking_uri`` (``bulk=False``: the per-metric client loop).

    ``backend_uri``: the ``sqlite:`` backend store of the tracking server behind ``tracking_uri``,
    when this machine can read it (a local ``mlflow server --backend-store-uri sqlite:///...``):
    histories are then read by SQL from that file, as for a ``sqlite:`` tracking URI.
    ``artifacts``: put ``ArtifactSource`` in front of the server (or client) reader.
    """
    if not bulk:
        return ClientSource(client)
    if backend_uri:
        db = sqlite_path(backend_uri)
        if db is None or not db.exists() or not has_metrics_table(db):
            raise ValueError(
                f"backend_uri {backend_uri!r} is not a readable MLflow sqlite store (sqlite:///path/to/mlflow.db)"
            )
        return SqliteSource(db)
    db = sqlite_path(tracking_uri)
    if db is not None and db.exists() and has_metrics_table(db):
        return SqliteSource(db)
    workers = int(os.environ.get("TRUSTBENCH_LOAD_WORKERS", 4))
    reader = None
    if urlparse(tracking_uri).scheme in ("http", "https"):
        store = client._tracking_client.store  # RestStore; its host creds carry auth and TLS settings
        if hasattr(store, "get_host_creds"):
            reader = RestSource(store.get_host_creds, workers=workers)
    if reader is None:
        root = file_store_root(tracking_uri)
        if root is not None and root.is_dir():
            return FileStoreSource(root)
        reader = ClientSource(client)
    return ArtifactSource(reader, tracking_uri, workers=workers) if artifacts else reader


def _quiet(progress: bool | None, n: int) -> bool | None:
    """tqdm's ``disable``: explicit choice, else quiet for tiny loads and non-terminals."""
    if progress is not None:
        return not progress
    return True if n < 20 else None
