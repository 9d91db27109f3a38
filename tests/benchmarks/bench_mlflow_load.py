"""Benchmark: loading an experiment from an ``mlflow server`` (sqlite backend): history artifacts,
REST bulk and naive loop cold, and the parquet cache warm.

    python tests/benchmarks/bench_mlflow_load.py                       # 100 runs x 10 metrics x 1000 steps
    python tests/benchmarks/bench_mlflow_load.py --runs 20 --steps 200 # quicker
    python tests/benchmarks/bench_mlflow_load.py --workdir /tmp/b      # keep the store; re-runs reuse it

Measures, on a local server bound to 127.0.0.1 that proxies artifacts (``--artifacts-destination``):
- cold artifacts: ``load_experiment(..., refresh="full")``: the run list through the server, each
  finished run's ``metrics/history.parquet`` downloaded over HTTP from the server (a few threads);
- cold bulk: the same with ``artifacts=False``: the server's get-history-bulk endpoint
  (``analysis.sources.RestSource``; one request per metric for up to 25000 points);
- naive: ``MlflowClient.get_metric_history`` once per run per metric (what the Python client offers);
- warm: the parquet cache, both refreshed (one ``search_runs`` to find what is new) and offline;
- cold with ``backend_uri``: runs listed through the server, points read by SQL from its sqlite file
  (only possible when the server's store is readable here);
- for reference, the direct SQL reader on the same sqlite file (``sqlite:`` URIs).
Targets (issue 5): cold >= 10x faster than naive without reading the server's files, warm >= 100x.
Prints ratios; asserts nothing about time. Every loader's result is checked equal to the naive one.

The runs are written as trustbench runs write them: one ``RunTracker`` per run logs every step
(``--metrics - 1`` metrics plus ``training/global_step``), flushes at a checkpoint every
``--checkpoint-every`` steps (each writes the history artifact) and finishes. The trackers write
the points into the sqlite file directly (through the server they take ~1 ms a point on 2 cores,
~20 minutes for 1M points: ``--log-via server`` does that) and the artifacts through the server's
HTTP artifact endpoint (the experiment's artifact location), so downloads cross HTTP as from a
remote server.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import record


def populate(
    uri: str, url: str, experiment: str, runs: int, metrics: int, steps: int, checkpoint_every: int
) -> list[str]:
    """Log ``runs`` runs through ``RunTracker`` into ``uri``, artifacts through ``url``'s artifact proxy
    (``mlflow-artifacts:`` when ``uri`` is the server, its HTTP address when the sqlite file)."""
    from mlflow import MlflowClient

    from runners.tracking import RunTracker

    client = MlflowClient(uri)
    if uri == url:
        client.create_experiment(experiment)
    else:
        client.create_experiment(experiment, artifact_location=f"{url}/api/2.0/mlflow-artifacts/artifacts/{experiment}")
    rng = np.random.default_rng(0)
    run_ids = []
    started = time.perf_counter()
    for r in range(runs):
        tags = {"method": f"m{r % 4}", "seed": str(r // 4)}
        tracker = RunTracker.open(
            uri=uri, experiment=experiment, run_key=f"bench-{r}", run_name=f"run{r}", tags=tags, params={"r": r}
        )
        tracker.flush_every_s = 5.0
        values = rng.random((steps, metrics - 1))
        for step in range(steps):
            tracker.log_metrics({f"metric/{k}": v for k, v in enumerate(values[step])}, step=step)
            if (step + 1) % checkpoint_every == 0 and step + 1 < steps:
                tracker.flush(wait=True)
        tracker.finish()
        run_ids.append(tracker.run_id)
        if (r + 1) % 10 == 0:
            print(f"  {r + 1}/{runs} runs logged ({time.perf_counter() - started:.0f} s)", flush=True)
    history = client.get_metric_history(run_ids[0], "metric/0")
    assert len(history) == steps and history[-1].step == steps - 1, "logged points are not visible through MLflow"
    return run_ids


def start_server(uri: str, workdir: Path) -> tuple[subprocess.Popen, str]:
    """A server on the store; on the port it had before in ``workdir`` (the experiment's artifact
    location names it), else on a free one; without MLflow's job runner, as trustbench starts its servers."""
    from runners.tracking_server import SERVER_ENV

    port_file = workdir / "port"
    if port_file.exists():
        port = int(port_file.read_text())
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        port_file.write_text(str(port))
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
    cmd += ["--artifacts-destination", str(workdir / "artifacts")]
    server = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **SERVER_ENV}
    )
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
    parser.add_argument("--metrics", type=int, default=10, help="metric keys per run, training/global_step included")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--checkpoint-every", type=int, default=250, help="steps between checkpoint flushes")
    parser.add_argument("--log-via", choices=("sqlite", "server"), default="sqlite", help="where trackers send points")
    parser.add_argument("--workdir", default=None, help="keep the store here (default: a temp dir, removed)")
    record.add_option(parser)
    args = parser.parse_args(argv)
    if args.metrics < 2:
        parser.error("--metrics must be >= 2 (training/global_step is one of them)")
    rec = record.start("bench_mlflow_load.py", argv=argv)

    from analysis.load import load_experiment
    from runners.tracking import ensure_store

    tmp = tempfile.TemporaryDirectory(prefix="bench-mlflow-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    workdir = Path(args.workdir) if args.workdir else Path(tmp.name)
    workdir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TRUSTBENCH_HOME", str(workdir / "home"))
    db = workdir / "mlflow.db"
    uri = f"sqlite:///{db}"
    experiment = f"bench-{args.runs}x{args.metrics}x{args.steps}"
    points = args.runs * args.metrics * args.steps
    print(f"store: {args.runs} runs x {args.metrics} metrics x {args.steps} steps = {points:,} points ({db})")
    ensure_store(uri)
    server, url = start_server(uri, workdir)
    try:
        from mlflow import MlflowClient

        if MlflowClient(uri).get_experiment_by_name(experiment) is None:
            t, _ = timed(
                lambda: populate(
                    uri if args.log_via == "sqlite" else url,
                    url,
                    experiment,
                    args.runs,
                    args.metrics,
                    args.steps,
                    args.checkpoint_every,
                )
            )
            print(f"logged through RunTracker ({args.log_via}) in {t:.1f} s")
        else:
            print(f"reusing experiment {experiment!r} in {db}")
        cache = workdir / "cache"
        # best of 2 for the cold loaders: the first call also pays the server's first-request costs
        t_art, art = timed(
            lambda: load_experiment(experiment, url, cache_dir=cache, refresh="full", progress=False), repeat=2
        )
        t_bulk, bulk = timed(
            lambda: load_experiment(experiment, url, cache_dir=None, refresh="full", progress=False, artifacts=False),
            repeat=2,
        )
        t_naive, naive = timed(lambda: naive_load(url, experiment))
        t_warm, warm = timed(lambda: load_experiment(experiment, url, cache_dir=cache, progress=False), repeat=3)
        t_off, offline = timed(lambda: load_experiment(experiment, url, cache_dir=cache, refresh=False), repeat=3)
        t_sql, sql = timed(lambda: load_experiment(experiment, uri, cache_dir=None, progress=False))
        t_hint, hinted = timed(
            lambda: load_experiment(experiment, url, cache_dir=None, progress=False, backend_uri=uri)
        )
        info = art.load_info["experiments"][0]
        assert info["artifact_runs"] == args.runs, f"only {info['artifact_runs']} runs read from artifacts: {info}"
        reference = _canon(naive)
        assert len(reference) == points, f"naive loop read {len(reference)} points, expected {points}"
        loaded = (("artifacts", art), ("bulk", bulk), ("warm", warm), ("offline", offline), ("sqlite", sql))
        for name, data in (*loaded, ("hinted", hinted)):
            pd.testing.assert_frame_equal(_canon(data.metrics), reference, obj=name)
    finally:
        server.terminate()
        server.wait(timeout=60)
        tmp.cleanup()

    print(f"{'loader':<46} {'seconds':>9} {'vs naive':>9}")
    loaders = (
        ("naive get_metric_history loop (server)", t_naive),
        ("cold: history artifacts over HTTP", t_art),
        ("cold bulk: get-history-bulk (artifacts=False)", t_bulk),
        ("warm: parquet cache + search_runs check", t_warm),
        ("warm offline: parquet cache only", t_off),
        ("cold: server runs + SQL points (backend_uri)", t_hint),
        ("direct SQL on the sqlite file (no server)", t_sql),
    )
    for label, secs in loaders:
        print(f"{label:<46} {secs:>9.3f} {t_naive / secs:>8.1f}x")
    ratio = t_naive / t_art
    print(f"cold artifacts speed-up {ratio:.1f}x (target >= 10x: {'met' if ratio >= 10 else 'NOT met'})")
    print(f"cold bulk REST speed-up {t_naive / t_bulk:.1f}x")
    print(f"warm speed-up {t_naive / t_warm:.1f}x (target >= 100x: {'met' if t_naive / t_warm >= 100 else 'NOT met'})")
    size = f"{args.runs} runs x {args.metrics} metrics x {args.steps} steps"
    figures = [
        record.figure(f"cold (history artifacts) vs the `get_metric_history` loop, {size}", f"{ratio:.1f}x faster", ">= 10x"),
        record.figure("warm (parquet cache) vs the same loop", f"{t_naive / t_warm:.1f}x faster", ">= 100x"),
        record.figure("cold bulk REST vs the same loop", f"{t_naive / t_bulk:.1f}x faster"),
    ]  # fmt: skip
    rec.write(args.json, figures, {"args": vars(args), "points": points, "seconds": dict(loaders)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
