"""Benchmark: loading an experiment from an ``mlflow server`` (sqlite backend), bulk vs naive, and warm.

    python tests/benchmarks/bench_mlflow_load.py                       # 100 runs x 10 metrics x 1000 steps
    python tests/benchmarks/bench_mlflow_load.py --runs 20 --steps 200 # quicker

Measures, on a local server bound to 127.0.0.1:
- cold bulk: ``load_experiment(..., refresh="full")`` through the server's get-history-bulk endpoint
  (``analysis.sources.RestSource``; one request per metric for up to 25000 points);
- naive: ``MlflowClient.get_metric_history`` once per run per metric (what the Python client offers);
- warm: the parquet cache, both refreshed (one ``search_runs`` to find what is new) and offline;
- cold with ``backend_uri``: runs listed through the server, points read by SQL from its sqlite file
  (a local server, as trustbench's ``tracking=server`` starts it);
- for reference, the direct SQL reader on the same sqlite file (``sqlite:`` URIs).
Targets (issue 5): cold bulk >= 10x faster than naive, warm >= 100x. Prints ratios; asserts nothing
about time. Every loader's result is checked equal to the naive one.

The store is filled by creating runs through MLflow and inserting the metric points into its
``metrics`` / ``latest_metrics`` tables in one transaction (logging 1M points through the API takes
~10 minutes on 2 cores); a spot check reads them back through the API first.
"""

from __future__ import annotations

import argparse
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd


def populate(uri: str, db: Path, experiment: str, runs: int, metrics: int, steps: int) -> list[str]:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp_id = client.create_experiment(experiment)
    run_ids = []
    for r in range(runs):
        run = client.create_run(exp_id, run_name=f"run{r}", tags={"method": f"m{r % 4}", "seed": str(r // 4)})
        client.set_terminated(run.info.run_id)
        run_ids.append(run.info.run_id)
    rng = np.random.default_rng(0)
    ts0 = 1_700_000_000_000
    with sqlite3.connect(db) as con:
        for rid in run_ids:
            for k in range(metrics):
                values = rng.random(steps)
                rows = [(f"metric/{k}", float(v), ts0 + s, rid, s, 0) for s, v in enumerate(values)]
                con.executemany(
                    "INSERT INTO metrics (key, value, timestamp, run_uuid, step, is_nan) VALUES (?,?,?,?,?,?)", rows
                )
                last = rows[-1]
                con.execute(
                    "INSERT INTO latest_metrics (key, value, timestamp, step, is_nan, run_uuid) VALUES (?,?,?,?,?,?)",
                    (last[0], last[1], last[2], last[4], 0, rid),
                )
    history = client.get_metric_history(run_ids[0], "metric/0")
    assert len(history) == steps and history[-1].step == steps - 1, "populated rows are not visible through MLflow"
    return run_ids


def start_server(uri: str, workdir: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--backend-store-uri",
        uri,
    ]
    cmd += ["--default-artifact-root", (workdir / "artifacts").as_uri()]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2)
            return server, url
        except OSError:
            if time.time() > deadline or server.poll() is not None:
                server.terminate()
                raise RuntimeError("mlflow server did not start") from None
            time.sleep(0.5)


def naive_load(url: str, experiment: str) -> pd.DataFrame:
    from mlflow import MlflowClient

    client = MlflowClient(url)
    exp = client.get_experiment_by_name(experiment)
    rows = []
    for run in client.search_runs([exp.experiment_id], max_results=10_000):
        for key in run.data.metrics:
            for m in client.get_metric_history(run.info.run_id, key):
                rows.append((run.info.run_id, key, m.step, m.value, m.timestamp))
    return pd.DataFrame(rows, columns=["run_id", "metric", "step", "value", "timestamp"])


def _canon(df: pd.DataFrame) -> pd.DataFrame:
    df = df[["run_id", "metric", "step", "value", "timestamp"]].astype({"run_id": str, "metric": str})
    return df.sort_values(["run_id", "metric", "step"]).reset_index(drop=True)


def timed(fn, repeat: int = 1):
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--metrics", type=int, default=10)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--workdir", default=None, help="keep the store here (default: a temp dir, removed)")
    args = parser.parse_args(argv)

    from analysis.load import load_experiment

    tmp = tempfile.TemporaryDirectory(prefix="bench-mlflow-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    workdir = Path(args.workdir) if args.workdir else Path(tmp.name)
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / "mlflow.db"
    uri = f"sqlite:///{db}"
    experiment = "bench"
    points = args.runs * args.metrics * args.steps
    print(f"store: {args.runs} runs x {args.metrics} metrics x {args.steps} steps = {points:,} points ({db})")
    t, _ = timed(lambda: populate(uri, db, experiment, args.runs, args.metrics, args.steps))
    print(f"populated in {t:.1f} s")
    server, url = start_server(uri, workdir)
    try:
        cache = workdir / "cache"
        t_bulk, bulk = timed(lambda: load_experiment(experiment, url, cache_dir=cache, refresh="full", progress=False))
        t_naive, naive = timed(lambda: naive_load(url, experiment))
        t_warm, warm = timed(lambda: load_experiment(experiment, url, cache_dir=cache, progress=False), repeat=3)
        t_off, offline = timed(lambda: load_experiment(experiment, url, cache_dir=cache, refresh=False), repeat=3)
        t_sql, sql = timed(lambda: load_experiment(experiment, uri, cache_dir=None, progress=False))
        t_hint, hinted = timed(
            lambda: load_experiment(experiment, url, cache_dir=None, progress=False, backend_uri=uri)
        )
        reference = _canon(naive)
        assert len(reference) == points, f"naive loop read {len(reference)} points, expected {points}"
        for name, data in (("bulk", bulk), ("warm", warm), ("offline", offline), ("sqlite", sql), ("hinted", hinted)):
            pd.testing.assert_frame_equal(_canon(data.metrics), reference, obj=name)
    finally:
        server.terminate()
        server.wait(timeout=60)
        tmp.cleanup()

    print(f"{'loader':<44} {'seconds':>9} {'vs naive':>9}")
    for label, secs in (
        ("naive get_metric_history loop (server)", t_naive),
        ("cold bulk: get-history-bulk", t_bulk),
        ("warm: parquet cache + search_runs check", t_warm),
        ("warm offline: parquet cache only", t_off),
        ("cold: server runs + SQL points (backend_uri)", t_hint),
        ("direct SQL on the sqlite file (no server)", t_sql),
    ):
        print(f"{label:<44} {secs:>9.3f} {t_naive / secs:>8.1f}x")
    print(
        f"cold bulk speed-up {t_naive / t_bulk:.1f}x (target >= 10x: {'met' if t_naive / t_bulk >= 10 else 'NOT met'})"
    )
    print(f"warm speed-up {t_naive / t_warm:.1f}x (target >= 100x: {'met' if t_naive / t_warm >= 100 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
