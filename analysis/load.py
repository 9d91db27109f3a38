"""MLflow experiment(s) -> ``ExperimentData``, through an incrementally refreshed parquet cache.

Design: the run list is always read fresh with one paginated ``search_runs`` (it carries tags,
params and each metric's latest (step, timestamp)); metric histories come from the cache, and only
what the cache lacks is fetched with the store's bulk reader (``analysis.sources``):

- runs not in the cache: their whole history;
- cached runs where some metric's latest (step, timestamp) is newer than the cached one (still
  running, or resumed into the same run): the points from the smallest cached last step on,
  merged with the cache and de-duplicated;
- runs gone from the store (deleted) are dropped; finished, unchanged runs cost nothing.

A point logged later at an *older* step than the metric's latest is not detected;
``refresh="full"`` re-reads everything.

From a tracking server, runs that have ended (FINISHED, FAILED, KILLED) and whose
``metrics/history.parquet`` artifact (written by ``runners.tracking.RunTracker``) covers the
listing are read whole from that artifact, one download per run (``plan_artifacts``,
``analysis.sources.ArtifactSource``), also when the cache held their earlier points (a run that
was running at the last load); the others through the server's REST readers (figures in ``analysis.sources``).

    from analysis import load_experiment
    data = load_experiment("demo")                       # MLFLOW_TRACKING_URI or .trustbench/mlflow.db
    data = load_experiment(["a", "b"], tracking_uri="http://127.0.0.1:5000", refresh=False)
    data.load_info                                        # what was fetched, by which reader
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

import pandas as pd

from analysis.cache import cache_path, read_cache, write_cache
from analysis.frames import RUN_COLUMNS, TAG_REPORT, ExperimentData, empty_metrics, empty_runs, normalize_metrics
from analysis.sources import ArtifactSource, FetchRequest, pick_source
from runners.metric_history import STEP_METRIC, TAG_HISTORY
from runners.metric_names import TERMINAL_STATUSES

Refresh = bool | Literal["full"]


class ExperimentNotFoundError(LookupError):
    """No MLflow experiment of the requested name."""


def _client(tracking_uri: str):
    """A client of the store; a sqlite store that does not exist is an error, never created here."""
    from mlflow import MlflowClient

    from runners.paths import sqlite_path

    db = sqlite_path(tracking_uri)
    if db is not None and not db.exists():
        raise ExperimentNotFoundError(
            f"no MLflow store at {db}: nothing was tracked with this trustbench home (run from the directory of "
            "your runs, or set $TRUSTBENCH_HOME, $MLFLOW_TRACKING_URI or --tracking-uri)"
        )
    return MlflowClient(tracking_uri)


def resolve_experiment(client, name: str):
    """The MLflow experiment named ``name``; the error lists the experiments that exist."""
    exp = client.get_experiment_by_name(name)
    if exp is None:
        names = sorted(e.name for e in client.search_experiments())
        raise ExperimentNotFoundError(
            f"no MLflow experiment named {name!r} in {client.tracking_uri}; existing: {', '.join(names) or '(none)'}"
        )
    return exp


def list_runs(client, experiment, artifact_uris: dict[str, str] | None = None):
    """All active runs of ``experiment``: (runs frame, {run_id: {metric: (latest step, timestamp)}});
    fills ``artifact_uris`` ({run_id: artifact root}) when given."""
    records, latest = [], {}
    token = None
    while True:
        page = client.search_runs([experiment.experiment_id], max_results=1000, page_token=token)
        for run in page:
            info, data = run.info, run.data
            rec = {
                "run_id": info.run_id,
                "experiment": experiment.name,
                "experiment_id": str(experiment.experiment_id),
                "run_name": info.run_name,
                "status": info.status,
                "start_time": info.start_time,
                "end_time": info.end_time,
            }
            rec.update({f"tags.{k}": v for k, v in data.tags.items()})
            rec.update({f"params.{k}": v for k, v in data.params.items()})
            records.append(rec)
            latest[info.run_id] = {m.key: (int(m.step), int(m.timestamp)) for m in data._metric_objs}
            if artifact_uris is not None:
                artifact_uris[info.run_id] = info.artifact_uri
        token = page.token
        if not token:
            break
    runs = pd.DataFrame.from_records(records) if records else empty_runs()
    for col in RUN_COLUMNS:
        if col not in runs:
            runs[col] = None
    # creation order, so tables and legends list methods in the order the sweep launched them
    runs = runs.sort_values(["start_time", "run_id"], kind="stable").reset_index(drop=True)
    return runs, latest


def _cached_latest(metrics: pd.DataFrame) -> dict[str, dict[str, tuple[int, int]]]:
    """{run_id: {metric: (max step, max timestamp at that step)}} of a metric frame sorted by
    (run_id, metric, step, timestamp), as the cache stores it: the last row of each pair."""
    if not len(metrics):
        return {}
    top = metrics[["run_id", "metric", "step", "timestamp"]].drop_duplicates(["run_id", "metric"], keep="last")
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for rid, key, step, ts in top.itertuples(index=False):
        out.setdefault(str(rid), {})[str(key)] = (int(step), int(ts))
    return out


def _sort(metrics: pd.DataFrame) -> pd.DataFrame:
    """Rows grouped by (run_id, metric) (category order), each group ordered by step then timestamp."""
    return metrics.sort_values(["run_id", "metric", "step", "timestamp"], kind="stable").reset_index(drop=True)


def plan_fetch(
    latest: dict[str, dict[str, tuple[int, int]]],
    cached: dict[str, dict[str, tuple[int, int]]],
    experiment_id: str,
) -> list[FetchRequest]:
    """What to read for each run (see module docstring); runs with nothing new are left out."""
    requests = []
    for run_id, keys in latest.items():
        have = cached.get(run_id)
        if have is None:
            if keys:
                requests.append(FetchRequest(run_id, experiment_id, {k: s for k, (s, _) in keys.items()}))
            continue
        stale = {k: v for k, v in keys.items() if k not in have or v > have[k]}
        if not stale:
            continue
        new_keys = [k for k in stale if k not in have]
        from_step = None if new_keys else min(have[k][0] for k in stale)
        requests.append(FetchRequest(run_id, experiment_id, {k: s for k, (s, _) in stale.items()}, from_step))
    return requests


def plan_artifacts(
    requests: list[FetchRequest],
    runs: pd.DataFrame,
    latest: dict[str, dict[str, tuple[int, int]]],
    artifact_uris: dict[str, str],
) -> list[FetchRequest]:
    """Requests of runs whose history artifact covers them, turned into whole-history artifact reads.

    A run qualifies when its status is terminal and its ``trustbench.metric_history`` tag (written
    with the artifact) reports the last step the listing shows for ``training/global_step`` and as
    many keys as the listing has; ``ArtifactSource`` then checks every key's latest point in the
    artifact itself and falls back to the store for a run that does not match.
    """
    col = f"tags.{TAG_HISTORY}"
    if col not in runs or not len(requests):
        return requests
    terminal = runs["status"].isin(TERMINAL_STATUSES)
    tags = dict(zip(runs.loc[terminal, "run_id"], runs.loc[terminal, col]))
    out = []
    for r in requests:
        described = _history_tag(tags.get(r.run_id))
        keys = latest.get(r.run_id, {})
        step = keys.get(STEP_METRIC, (None,))[0]
        uri = artifact_uris.get(r.run_id)
        if described is None or not uri or described.get("last_step") != step or described.get("keys") != len(keys):
            out.append(r)
            continue
        whole = {k: s for k, (s, _) in keys.items()}
        out.append(FetchRequest(r.run_id, r.experiment_id, whole, None, artifact_uri=uri, latest=dict(keys)))
    return out


def _history_tag(value) -> dict | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        described = json.loads(value)
    except ValueError:
        return None
    return described if isinstance(described, dict) else None


def _load_one(
    get_client,
    tracking_uri: str,
    name: str,
    refresh: Refresh,
    cache_root: Path | None,
    bulk: bool,
    progress,
    backend_uri: str | None = None,
    artifacts: bool = True,
):
    path = cache_path(cache_root, tracking_uri, name) if cache_root is not None else None
    if refresh is False and path is not None:
        runs_c, metrics_c, state = read_cache(path, None)
        if state:
            return runs_c, metrics_c, {"experiment": name, "source": "cache", "runs_fetched": 0, "rows_fetched": 0}
    client = get_client()
    exp = resolve_experiment(client, name)
    exp_id = str(exp.experiment_id)
    runs_c, metrics_c, state = (
        read_cache(path, exp_id) if path is not None and refresh != "full" else (empty_runs(), empty_metrics(), {})
    )

    artifact_uris: dict[str, str] = {}
    runs, latest = list_runs(client, exp, artifact_uris)
    present = set(runs["run_id"])
    if len(metrics_c) and not set(map(str, metrics_c["run_id"].cat.categories)) <= present:
        metrics_c = metrics_c[metrics_c["run_id"].isin(present)]
        metrics_c = metrics_c.assign(run_id=metrics_c["run_id"].cat.remove_unused_categories())
    requests = plan_fetch(latest, _cached_latest(metrics_c), exp_id)
    source = pick_source(client, tracking_uri, bulk=bulk, backend_uri=backend_uri, artifacts=artifacts)
    if isinstance(source, ArtifactSource):
        requests = plan_artifacts(requests, runs, latest, artifact_uris)
    if not requests and state:  # nothing new: the cached frame is already canonical and sorted
        metrics = metrics_c.reset_index(drop=True)
        if not runs_c.equals(runs):
            write_cache(path, runs, metrics, {**state, "source": source.name})
        return (
            runs,
            metrics,
            {"experiment": name, "source": source.name, "runs_fetched": 0, "rows_fetched": 0, "partial_runs": 0}
            | getattr(source, "stats", {}),
        )
    fetched = source.fetch(requests, progress=progress) if requests else empty_metrics()
    reread = {r.run_id for r in requests if r.from_step is None}  # whole history fetched again
    if reread and len(metrics_c):
        metrics_c = metrics_c[~metrics_c["run_id"].isin(reread)]
    if len(fetched) and len(metrics_c):
        merged = pd.concat(
            [metrics_c.astype({"run_id": str, "metric": str}), fetched.astype({"run_id": str, "metric": str})]
        )
        if any(r.from_step is not None for r in requests):
            merged = merged.drop_duplicates(["run_id", "metric", "step", "timestamp", "value"])
        metrics = normalize_metrics(merged)
    else:
        metrics = fetched if len(fetched) else normalize_metrics(metrics_c) if len(metrics_c) else empty_metrics()
    metrics = _sort(metrics)
    if path is not None:
        state = {"tracking_uri": tracking_uri, "experiment": name, "experiment_id": exp_id, "source": source.name}
        write_cache(path, runs, metrics, state)
    info = {
        "experiment": name,
        "source": source.name,
        "runs_fetched": len(requests),
        "rows_fetched": len(fetched),
        "partial_runs": sum(r.from_step is not None for r in requests),
        **getattr(source, "stats", {}),
    }
    return runs, metrics, info


def load_experiment(
    experiments: str | list[str],
    tracking_uri: str | None = None,
    *,
    refresh: Refresh = True,
    cache_dir: str | Path | None = "default",
    bulk: bool = True,
    include_reports: bool = False,
    progress: bool | None = None,
    backend_uri: str | None = None,
    artifacts: bool = True,
) -> ExperimentData:
    """Load one or more MLflow experiments (by name) into ``ExperimentData``.

    refresh: True = fetch what is new (incremental); False = use the cache without contacting the
    store when a cache exists; "full" = ignore the cache and re-read everything.
    cache_dir: "default" = ``runners.paths.analysis_cache_dir()``; None = no cache.
    bulk: False forces the per-run per-metric client loop (the benchmark's baseline).
    backend_uri: the sqlite backend of a tracking server readable from here (default
    ``$TRUSTBENCH_MLFLOW_BACKEND_URI``): histories are read from it by SQL (``analysis.sources``).
    artifacts: read finished runs of a tracking server from their ``metrics/history.parquet``
    artifact (``runners.tracking``), one download per run; False: the server's REST readers only.
    """
    from runners.paths import analysis_cache_dir, default_tracking_uri

    names = [experiments] if isinstance(experiments, str) else list(experiments)
    if not names:
        raise ValueError("load_experiment needs at least one experiment name")
    uri = tracking_uri or default_tracking_uri()
    backend_uri = backend_uri or os.environ.get("TRUSTBENCH_MLFLOW_BACKEND_URI") or None
    root = analysis_cache_dir() if cache_dir == "default" else (Path(cache_dir) if cache_dir is not None else None)
    clients: list = []

    def get_client():  # created on first need: an offline load from the cache never touches the store
        if not clients:
            clients.append(_client(uri))
        return clients[0]

    all_runs, all_metrics, infos = [], [], []
    for name in names:
        runs, metrics, info = _load_one(get_client, uri, name, refresh, root, bulk, progress, backend_uri, artifacts)
        all_runs.append(runs)
        all_metrics.append(metrics)
        infos.append(info)
    runs = pd.concat(all_runs, ignore_index=True) if len(all_runs) > 1 else all_runs[0]
    metrics = normalize_metrics(pd.concat(all_metrics, ignore_index=True)) if len(all_metrics) > 1 else all_metrics[0]
    if not include_reports and f"tags.{TAG_REPORT}" in runs:
        report_ids = set(runs.loc[runs[f"tags.{TAG_REPORT}"].notna(), "run_id"])
        runs = runs[~runs["run_id"].isin(report_ids)].reset_index(drop=True)
        metrics = metrics[~metrics["run_id"].astype(str).isin(report_ids)].reset_index(drop=True)
    return ExperimentData(
        runs=runs.reset_index(drop=True), metrics=metrics, load_info={"tracking_uri": uri, "experiments": infos}
    )
