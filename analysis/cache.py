"""Local parquet cache of one experiment's runs and metric points.

Layout: ``analysis_cache_dir()/mlflow/<sha1(tracking uri)[:12]>/<experiment>/`` holds
``runs.parquet``, ``metrics.parquet`` and ``state.json`` (tracking URI, experiment id, reader used).
Files are written to a temporary name and renamed, so a crashed write never leaves half a cache.
A cache whose experiment id differs from the store's (experiment deleted and recreated) is ignored.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path

import pandas as pd

from analysis.frames import empty_metrics, empty_runs, normalize_metrics


def cache_path(cache_root: Path, tracking_uri: str, experiment: str) -> Path:
    digest = hashlib.sha1(tracking_uri.encode()).hexdigest()[:12]
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", experiment) or "_"
    return Path(cache_root) / "mlflow" / digest / slug


def read_cache(path: Path, experiment_id: str | None) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(runs, metrics, state) from ``path``; empty frames when absent or stale."""
    state_file = path / "state.json"
    try:
        state = json.loads(state_file.read_text())
        if experiment_id is not None and state.get("experiment_id") != experiment_id:
            return empty_runs(), empty_metrics(), {}
        runs = pd.read_parquet(path / "runs.parquet")
        metrics = normalize_metrics(pd.read_parquet(path / "metrics.parquet"))
    except (FileNotFoundError, json.JSONDecodeError, OSError, ValueError):
        return empty_runs(), empty_metrics(), {}
    return runs, metrics, state


def write_cache(path: Path, runs: pd.DataFrame, metrics: pd.DataFrame, state: dict) -> None:
    path.mkdir(parents=True, exist_ok=True)
    for name, frame in (("runs.parquet", runs), ("metrics.parquet", metrics)):
        tmp = path / f".{name}.{os.getpid()}.tmp"
        frame.to_parquet(tmp, index=False)
        os.replace(tmp, path / name)
    tmp = path / f".state.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({**state, "written_at": time.time()}, indent=1))
    os.replace(tmp, path / "state.json")
