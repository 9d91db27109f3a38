"""Metric logging killed at many points: the store holds whole steps in order, and a resume fills it
exactly once.

A child process logs steps of 120 metrics each through ``RunTracker`` into a sqlite store, sending
every few steps in the background (several ``log_batch`` chunks in flight, as a training run's
5-second flushes are), and is killed with SIGKILL at points spread over its sending. After each
kill the store is read with sqlite3 directly (not through the code under test) and must hold, for
one s, exactly the points of steps 0..s: every key at every one of those steps once, nothing after
(a gap below the last stored step is what MLflow's thread-pooled asynchronous commits left: issue
reproducer, steps 16-29 missing after a kill). Each restart resumes the same run from a few steps
before the last stored one, as the trainer resumes from its last checkpoint, so already stored
steps are offered again. The last start runs to the end: every step of every key is then stored
exactly once, and the run's params are complete.

The unit test of ``whole_step_chunks`` checks the cutting against sizes worked out by hand.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from runners.metric_history import STEP_METRIC, whole_step_chunks

STEPS = 240
KEYS = 119  # plus the step metric: 120 points per step, 900-point chunks hold 7 whole steps
CHILD = textwrap.dedent(
    """
    import sys, time
    from runners import tracking
    uri, start_from_back = sys.argv[1], int(sys.argv[2])
    tracking.ensure_store(uri)
    tracker = tracking.RunTracker.open(uri=uri, experiment="kill-points", run_key="k", run_name="kill points",
                                       tags={}, params={f"p{i}": i for i in range(150)})
    tracker.flush_every_s = 1e9  # sends below, every 4 steps
    start = max(0, tracker.last_logged_step - start_from_back)
    print("ready", tracker.last_logged_step, flush=True)
    for step in range(start, %(steps)d):
        tracker.log_metrics({f"m{k:03d}": step * 1000 + k for k in range(%(keys)d)}, step=step)
        if step %% 4 == 3:
            tracker.flush(wait=False)
            time.sleep(0.02)
    tracker.finish()
    print("done", flush=True)
    """
) % {"steps": STEPS, "keys": KEYS}


def _stored(db: Path) -> list[tuple[str, int, float]]:
    with sqlite3.connect(db) as con:
        return con.execute("SELECT key, step, value FROM metrics").fetchall()


def _params(db: Path) -> int:
    with sqlite3.connect(db) as con:
        return con.execute("SELECT COUNT(*) FROM params").fetchone()[0]


def _assert_whole_prefix(points: list[tuple[str, int, float]]) -> int:
    """The points are exactly steps 0..s of every key, once each, with the values logged; returns s."""
    if not points:
        return -1
    last = max(step for _, step, _ in points)
    keys = [f"m{k:03d}" for k in range(KEYS)]
    expected = sorted(
        [(key, step, float(step * 1000 + k)) for step in range(last + 1) for k, key in enumerate(keys)]
        + [(STEP_METRIC, step, float(step)) for step in range(last + 1)]
    )
    got = sorted(points)
    missing = sorted(set(expected) - set(got))[:5]
    assert got == expected, f"not steps 0..{last} once each: {len(got)} points, first missing {missing}"
    return last


def test_whole_step_chunks_never_split_a_step_that_fits():
    calls = [[("a", i)] * n for i, n in enumerate([400, 400, 200, 1000, 50])]
    chunks = whole_step_chunks(calls, limit=900)
    assert [len(c) for c in chunks] == [800, 200, 900, 150]
    assert [c[0][1] for c in chunks] == [0, 2, 3, 3] and chunks[3][-1][1] == 4
    assert [p for c in chunks for p in c] == [p for call in calls for p in call]  # order kept


@pytest.mark.slow
@pytest.mark.e2e
def test_kills_during_sends_leave_whole_steps_and_a_resume_fills_each_step_once(tmp_path):
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "TRUSTBENCH_HOME": str(tmp_path)}
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    kills, last = 0, -1
    for delay in (0.05, 0.3, 0.1, 0.6, 0.2, 0.45, 0.15, 0.8, 0.35, 0.25, 0.05, 0.7):
        child = subprocess.Popen(
            [sys.executable, str(script), uri, "3"], env=env, stdout=subprocess.PIPE, text=True
        )  # fmt: skip
        assert child.stdout.readline().startswith("ready")
        time.sleep(delay)
        if child.poll() is not None:
            break
        child.send_signal(signal.SIGKILL)
        child.wait()
        kills += 1
        last = _assert_whole_prefix(_stored(db))
        print(f"killed after {delay} s: steps 0..{last} stored")
    assert kills >= 8 and last < STEPS - 1  # the kills fell during the sending, before the end
    done = subprocess.run([sys.executable, str(script), uri, "3"], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and "done" in done.stdout, done.stderr[-2000:]
    assert _assert_whole_prefix(_stored(db)) == STEPS - 1
    assert _params(db) == 150


def test_a_resume_adds_the_params_a_killed_attempt_did_not_store(tmp_path):
    """Issue reproducer: a kill just after the MLflow run was created left it with 0 of its params;
    resuming it adds every missing one (and keeps the ones stored)."""
    from mlflow import MlflowClient

    from runners import metric_names, tracking

    uri = tracking.ensure_store(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = tracking.get_or_create_experiment(uri, "params")
    client = MlflowClient(uri)
    run = client.create_run(experiment_id, tags={metric_names.TAG_RUN_KEY: "k"}, run_name="partial")
    client.log_param(run.info.run_id, "p0", "0")  # the killed attempt stored one param of 104
    params = {f"p{i}": i for i in range(104)}
    tracker = tracking.RunTracker.open(
        uri=uri, experiment="params", run_key="k", run_name="partial", tags={}, params=params
    )  # fmt: skip
    assert tracker.resumed and tracker.run_id == run.info.run_id
    assert client.get_run(run.info.run_id).data.params == {key: str(value) for key, value in params.items()}


def test_after_a_failed_batch_no_later_batch_is_written(tmp_path, monkeypatch):
    """A batch that fails (a full disk, a server gone) stops the writer: the later batches raise the
    same error without writing, so the store never holds a step above a missing one; the failure
    reaches the next waited flush."""
    from mlflow import MlflowClient

    from runners import tracking

    uri = tracking.ensure_store(f"sqlite:///{tmp_path / 'mlflow.db'}")
    tracker = tracking.RunTracker.open(uri=uri, experiment="fail", run_key="k", run_name="fail", tags={}, params={})
    written, original = [], MlflowClient.log_batch

    def log_batch(client, run_id, metrics=(), **kw):
        if any(m.step == 8 for m in metrics):
            raise OSError(28, "No space left on device")
        written.append(metrics[0].step)
        return original(client, run_id, metrics=metrics, **kw)

    monkeypatch.setattr(MlflowClient, "log_batch", log_batch)
    for step in range(20):  # 120 points a step; batches: steps 0-6 | 7-9 (fails) | 10-16 | 17-19
        tracker.log_metrics({f"m{k:03d}": step for k in range(KEYS)}, step=step)
        if step in (6, 9, 19):
            tracker.flush(wait=False)
    with pytest.raises(OSError, match="No space left"):
        tracker.flush(wait=True)
    assert written == [0]  # only the batch of steps 0-6: none after the failed one
