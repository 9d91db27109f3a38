"""Loading MLflow runs into tidy frames: every reader returns exactly the points that were logged,
and the parquet cache refreshes incrementally (only new runs and new steps are fetched).

The reference is the synthetic curves themselves (``log_synthetic_experiment`` returns the arrays
it logged), not the loader.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric

from analysis import sources
from analysis.load import ExperimentNotFoundError, load_experiment
from analysis.synthetic import SyntheticSpec, _m, log_synthetic_experiment
from runners import metric_names


def _sorted(metrics: pd.DataFrame) -> pd.DataFrame:
    m = metrics.astype({"run_id": str, "metric": str})
    return m.sort_values(["run_id", "metric", "step", "timestamp"]).reset_index(drop=True)


def _assert_matches_truth(data, truth) -> None:
    """Every logged (run, metric) series comes back with the same steps and values, nothing else."""
    metrics = _sorted(data.metrics)
    expected_rows = 0
    for (_label, _seed), run in truth.items():
        for key, (steps, values) in run["curves"].items():
            sel = metrics[(metrics["run_id"] == run["run_id"]) & (metrics["metric"] == key)]
            np.testing.assert_array_equal(sel["step"].to_numpy(), steps)
            np.testing.assert_array_equal(sel["value"].to_numpy(), values)
            expected_rows += len(steps)
    assert len(metrics) == expected_rows


def test_sqlite_bulk_reader_returns_every_logged_point(store, tmp_path):
    data = load_experiment("troll_table1", store.uri, cache_dir=tmp_path)
    assert data.load_info["experiments"][0]["source"] == "sqlite-sql"
    _assert_matches_truth(data, store.truth["troll_table1"])
    labels = data.labels()
    assert set(labels["method"]) == {m.label for m in store.specs["troll_table1"].methods}
    assert sorted(labels["seed"].unique()) == [0, 1]


def test_client_reader_agrees_with_bulk_reader(store):
    bulk = load_experiment("entropy_tables", store.uri, cache_dir=None)
    naive = load_experiment("entropy_tables", store.uri, cache_dir=None, bulk=False)
    assert naive.load_info["experiments"][0]["source"] == "client-per-metric"
    pd.testing.assert_frame_equal(_sorted(bulk.metrics), _sorted(naive.metrics))


def test_tidy_frame_joins_labels_and_params(store):
    data = load_experiment("troll_table1", store.uri, cache_dir=None)
    df = data.tidy(params=["algorithm.objective"])
    assert {"run_id", "method", "seed", "metric", "step", "value", "timestamp", "params.algorithm.objective"} <= set(
        df.columns
    )
    troll = df[df["method"] == "GRPO+TROLL"]
    assert set(troll["params.algorithm.objective"]) == {"troll"}
    assert len(df) == len(data.metrics)
    with pytest.raises(KeyError, match="not.a.param"):
        data.tidy(params=["not.a.param"])


def test_unknown_experiment_lists_existing_ones(store):
    with pytest.raises(ExperimentNotFoundError, match="troll_table1"):
        load_experiment("no_such_sweep", store.uri, cache_dir=None)


def test_incremental_refresh_fetches_only_new_runs_and_steps(store, tmp_path):
    client = MlflowClient(store.uri)
    exp_id = client.create_experiment("incremental")
    ts = 1_700_000_000_000
    finished = client.create_run(exp_id, tags={metric_names.TAG_METHOD: "A"}).info.run_id
    client.log_batch(finished, metrics=[Metric("m", float(s), ts + s, s) for s in range(50)])
    client.set_terminated(finished)
    running = client.create_run(exp_id, tags={metric_names.TAG_METHOD: "B"}).info.run_id
    client.log_batch(running, metrics=[Metric("m", float(s) / 2, ts + s, s) for s in range(10)])
    client.log_batch(running, metrics=[Metric("eval", 0.1, ts + 9, 9)])
    doomed = client.create_run(exp_id, tags={metric_names.TAG_METHOD: "C"}).info.run_id
    client.log_batch(doomed, metrics=[Metric("m", 1.0, ts, 0)])

    first = load_experiment("incremental", store.uri, cache_dir=tmp_path)
    assert first.load_info["experiments"][0]["rows_fetched"] == 50 + 11 + 1

    # the running run logs more steps (and a point of a metric at its own last step), a new run appears, one is deleted
    client.log_batch(running, metrics=[Metric("m", float(s) / 2, ts + s, s) for s in range(10, 20)])
    client.log_batch(running, metrics=[Metric("eval", 0.3, ts + 19, 19), Metric("loss", 2.0, ts + 19, 19)])
    fresh = client.create_run(exp_id, tags={metric_names.TAG_METHOD: "D"}).info.run_id
    client.log_batch(fresh, metrics=[Metric("m", 5.0, ts, 0)])
    client.delete_run(doomed)

    second = load_experiment("incremental", store.uri, cache_dir=tmp_path)
    info = second.load_info["experiments"][0]
    assert info["runs_fetched"] == 2  # the running run (partially) and the new run, not the finished one
    assert info["partial_runs"] == 0  # "loss" is new to the running run -> its whole history is read
    full = load_experiment("incremental", store.uri, cache_dir=None)
    pd.testing.assert_frame_equal(_sorted(second.metrics), _sorted(full.metrics))
    assert doomed not in set(second.runs["run_id"])

    # only new steps of known metrics: a partial (from-step) read, merged without duplicates
    client.log_batch(running, metrics=[Metric("m", 9.0, ts + 20, 20), Metric("loss", 1.0, ts + 20, 20)])
    third = load_experiment("incremental", store.uri, cache_dir=tmp_path)
    info = third.load_info["experiments"][0]
    assert (info["runs_fetched"], info["partial_runs"]) == (1, 1)
    assert info["rows_fetched"] < 10
    full = load_experiment("incremental", store.uri, cache_dir=None)
    pd.testing.assert_frame_equal(_sorted(third.metrics), _sorted(full.metrics))

    unchanged = load_experiment("incremental", store.uri, cache_dir=tmp_path)
    assert unchanged.load_info["experiments"][0]["runs_fetched"] == 0


def test_offline_load_reads_the_cache_without_the_store(store, tmp_path, monkeypatch):
    cached = load_experiment("entropy_tables", store.uri, cache_dir=tmp_path)
    import analysis.load as load_module

    def no_store(_uri):
        raise AssertionError("offline load touched the tracking store")

    monkeypatch.setattr(load_module, "_client", no_store)
    offline = load_experiment("entropy_tables", store.uri, cache_dir=tmp_path, refresh=False)
    assert offline.load_info["experiments"][0]["source"] == "cache"
    pd.testing.assert_frame_equal(_sorted(offline.metrics), _sorted(cached.metrics))


def test_file_store_reader(tmp_path, monkeypatch):
    """A ``file:`` store (maintenance mode in MLflow 3) is read from its metric files directly."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    spec = SyntheticSpec("filestore", [_m("A", "grpo"), _m("B", "grpo", "troll")], seeds=(0, 1), steps=12, eval_every=4)
    truth = log_synthetic_experiment(uri, spec)
    data = load_experiment("filestore", uri, cache_dir=None)
    assert data.load_info["experiments"][0]["source"] == "file-store"
    _assert_matches_truth(data, truth)


@pytest.mark.slow
def test_tracking_server_bulk_reader(store, mlflow_server, tmp_path, monkeypatch):
    """Against a real ``mlflow server`` (sqlite backend) the bulk reader returns what the sqlite
    reader returns: for a whole sweep; with tiny caps (groups split, a run over the cap read in step
    windows, a window overflowed by a step holding two values); and for an incremental tail."""
    client = MlflowClient(store.uri)
    exp_id = client.create_experiment("server_windows")
    ts = 1_700_000_000_000
    for label in ("A", "B"):
        run = client.create_run(exp_id, tags={metric_names.TAG_METHOD: label}).info.run_id
        points = [Metric("m", s * 0.5, ts + s, s) for s in range(8)]
        points += [Metric("dup", s * 0.1, ts + s, s) for s in range(6)] + [Metric("dup", 9.0, ts + 100, 3)]
        client.log_batch(run, metrics=points)
        client.set_terminated(run)
    url = mlflow_server
    remote = load_experiment("troll_table1", url, cache_dir=None)
    info = remote.load_info["experiments"][0]
    assert info["source"] == "artifacts+rest-bulk" and info["artifact_runs"] == 0  # synthetic: no artifacts
    local = load_experiment("troll_table1", store.uri, cache_dir=None)
    pd.testing.assert_frame_equal(_sorted(remote.metrics), _sorted(local.metrics))
    hinted = load_experiment(
        "troll_table1", url, cache_dir=None, backend_uri=store.uri
    )  # runs via server, points via SQL
    assert hinted.load_info["experiments"][0]["source"] == "sqlite-sql"
    pd.testing.assert_frame_equal(_sorted(hinted.metrics), _sorted(local.metrics))
    with pytest.raises(ValueError, match="not a readable MLflow sqlite store"):
        load_experiment("troll_table1", url, cache_dir=None, backend_uri=f"sqlite:///{tmp_path}/missing.db")

    monkeypatch.setattr(sources, "MAX_BULK_ROWS", 5)  # every run has more points: single-run windows
    monkeypatch.setattr(sources, "MAX_ROWS_PER_RUN", 3)  # windows of 3 steps; step 3 of "dup" overflows one
    remote = load_experiment("server_windows", url, cache_dir=tmp_path / "cache")
    local = load_experiment("server_windows", store.uri, cache_dir=None)
    pd.testing.assert_frame_equal(_sorted(remote.metrics), _sorted(local.metrics))
    assert (remote.metrics["metric"] == "dup").sum() == 2 * 7

    client.log_batch(run, metrics=[Metric("m", 7.5, ts + 50, 12), Metric("dup", 1.0, ts + 50, 12)])
    tail = load_experiment("server_windows", url, cache_dir=tmp_path / "cache")
    assert tail.load_info["experiments"][0]["partial_runs"] == 1
    local = load_experiment("server_windows", store.uri, cache_dir=None)
    pd.testing.assert_frame_equal(_sorted(tail.metrics), _sorted(local.metrics))
