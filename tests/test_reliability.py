"""Reliability of runs as a hostile but fair user meets it: parallel starts, a cell started twice, a
tracking server that is missing or cannot start, a corrupt checkpoint, a full disk, an unwritable
run directory, credentials in the tracking URI.

Each scenario runs the real command (``python -m runners.cli``, loopback only, bounded by a
subprocess timeout) on the embedded default for one step, and checks against MLflow's own client
that nothing is lost: every run that should exist exists once, in the right status, with every
metric step logged exactly once, and every message names the key or the file to act on.

The full disk is a small tmpfs mounted for the test when the tests run as root and may mount (else
ENOSPC is simulated by a ``torch.save`` that fails half-way, and the disk that stays full is
skipped); the unwritable run directory is made
immutable (``chattr +i`` on that tmpfs) as root, or read-only (``chmod 555``) otherwise.

Run:  pytest tests/test_reliability.py        (a few minutes on 2 cores: every scenario starts processes)
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reliability import FAST, REPO, free_port, one_message, only_run_dir, runs, start, steps, trustbench

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(900)]


# -- 1. parallel starts into a fresh directory ----------------------------------------------------------
def test_stores_created_by_many_processes_at_once_are_whole(tmp_path):
    """Eight processes open the same missing sqlite store at the same instant (a start barrier):
    each gets a working store, and the file holds the complete schema (no leftover migration
    table, every table of MLflow's models) with one default experiment."""
    db = tmp_path / "mlflow.db"
    go = time.time() + 8
    script = (
        "import sys, time; from runners import tracking; "
        f"time.sleep(max(0.0, {go} - time.time())); "
        f"tracking.ensure_store('sqlite:///{db}'); print('ok')"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(REPO)},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(8)
    ]  # fmt: skip
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 8, [err[-2000:] for _, err in outs]
    import sqlite3

    from mlflow.store.db.base_sql_model import Base

    with sqlite3.connect(db) as con:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        experiments = con.execute("SELECT count(*) FROM experiments").fetchone()[0]
    assert not [t for t in tables if t.startswith("_alembic_tmp")]
    assert set(Base.metadata.tables) <= tables and experiments == 1
    assert not list(tmp_path.glob(".*building")), "a temporary store was left behind"


def test_parallel_runs_into_a_fresh_directory_all_finish(tmp_path):
    """`trustbench run seed=S` x 5 started at once into a new directory (issue: 5 to 7 of 7 failed
    and the store stayed broken): all exit 0, five FINISHED runs with five keys, each with its
    step logged once, and a later run in the same directory works (a finished cell is skipped)."""
    home = tmp_path / "home"
    procs = [start(["run", f"seed={s}", *FAST], home) for s in range(5)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0] * 5, [err[-3000:] for _, err in outs]
    found = runs(home)
    assert sorted(r.info.status for r in found) == ["FINISHED"] * 5
    assert len({r.data.tags["trustbench.run_key"] for r in found}) == 5
    assert all(steps(home, r.info.run_id) == [1] for r in found)
    again = trustbench(["run", "seed=0", *FAST], home)
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(runs(home)) == 5


# -- 2. the same cell twice at once ----------------------------------------------------------------------
def test_the_same_cell_started_twice_is_refused_while_it_runs(tmp_path):
    """A second start of a running cell is refused at once (exit 1) with a message naming the cell,
    the process holding it and the lock file; the first finishes alone: one MLflow run for the key,
    FINISHED, one checkpoint writer. Started again afterwards the cell is skipped."""
    home = tmp_path / "home"
    slow = [*FAST, "trainer.total_steps=2", "debug.step_delay_s=40", "debug.delay_steps_below=1"]
    first = start(["run", *slow], home)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not list(home.glob("runs/*/status.json")):
            assert first.poll() is None, first.communicate()
            time.sleep(0.5)
        second = trustbench(["run", *slow], home)
        assert second.returncode == 1
        message = one_message(second.stderr, "already running", f"process {first.pid}", "run.lock")
        assert "GRPO · s0" in message
        out, err = first.communicate(timeout=600)
    finally:
        first.kill()
    assert first.returncode == 0, err[-3000:]
    (run,) = runs(home)
    assert run.info.status == "FINISHED" and steps(home, run.info.run_id) == [1, 2]
    third = trustbench(["run", *slow], home)
    assert third.returncode == 0 and len(runs(home)) == 1


# -- 4. the tracking server ------------------------------------------------------------------------------
def _up(port: int) -> bool:
    from runners.tracking_server import is_up

    return is_up(f"http://127.0.0.1:{port}", timeout_s=1.0)


def test_two_runs_share_one_tracking_server_and_the_last_one_stops_it(tmp_path):
    """Two `trustbench run tracking=server` started at the same instant on one free port (the first
    starts race for it): one starts the server, the other uses it; the short run ends while the
    long one still logs, and the server stays up for it (it used to be stopped under it: the long
    run then hung in MLflow's retries, RUNNING). Both FINISH with every step; the last one out
    stops the server, whichever started it. (A single run starts and stops it the same way.)"""
    home, port = tmp_path / "home", free_port()
    server = ["tracking=server", f"tracking.port={port}"]
    long = [*FAST, "seed=1", "trainer.total_steps=2", "debug.step_delay_s=20", "debug.delay_steps_below=2"]
    short_run, long_run = start(["run", *server, *FAST], home), start(["run", *server, *long], home)
    try:
        out, err = short_run.communicate(timeout=400)
        assert short_run.returncode == 0, err[-3000:]
        assert long_run.poll() is None, "the long run ended first: the scenario did not happen"
        assert _up(port)  # still in use by the long run
        out, err = long_run.communicate(timeout=400)
        assert long_run.returncode == 0, err[-3000:]
    finally:
        short_run.kill()
        long_run.kill()
    found = {r.data.tags["seed"]: r for r in runs(home)}
    assert sorted(found) == ["0", "1"] and all(r.info.status == "FINISHED" for r in found.values())
    assert steps(home, found["0"].info.run_id) == [1] and steps(home, found["1"].info.run_id) == [1, 2]
    assert all("mlflow-artifacts:" in r.info.artifact_uri for r in found.values())  # logged through the server
    assert not _up(port)
    assert not [p for p in Path("/proc").glob("[0-9]*") if f"--port\0{port}\0".encode() in _cmdline(p)]


def _cmdline(proc_dir: Path) -> bytes:
    try:
        return (proc_dir / "cmdline").read_bytes()
    except OSError:
        return b""


@pytest.fixture
def silent_listener():
    """A loopback port taken by something that accepts connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield sock.getsockname()[1]
    sock.close()


@pytest.mark.parametrize(
    ("case", "key"),
    [
        ("no_start", "tracking.start_server"),
        ("uri", "tracking.uri"),
        ("env", "MLFLOW_TRACKING_URI"),
        ("port_taken", "tracking.port"),
        ("sweep_no_start", "tracking.start_server"),
        ("dry_run_env", "MLFLOW_TRACKING_URI"),
        ("dry_run_uri", "tracking.uri"),
    ],
)
def test_unreachable_tracking_fails_fast_naming_the_key(tmp_path, silent_listener, case, key):
    """Nothing answers (or a port is taken by something else): exit 2 with one message naming the key
    to change, no traceback, no run, the same for `run` and `sweep` (it used to hang ~4 min under
    MLflow's retries; the subprocess timeout bounds it here)."""
    home, port = tmp_path / "home", free_port()
    env = {}
    args = {
        "no_start": ["run", "tracking=server", "tracking.start_server=false", f"tracking.port={port}"],
        "uri": ["run", f"tracking.uri=http://127.0.0.1:{port}"],
        "env": ["run"],
        "port_taken": ["run", "tracking=server", f"tracking.port={silent_listener}"],
        "sweep_no_start": [
            "sweep", "demo", "+method=choice(grpo)", "tracking=server", "tracking.start_server=false",
            f"tracking.port={port}",
        ],
        # a dry run reads which cells finished: it used to read this home's sqlite file instead and say "0 finished"
        "dry_run_env": ["sweep", "demo", "+method=choice(grpo)", "--dry-run"],
        "dry_run_uri": ["sweep", "demo", "+method=choice(grpo)", f"tracking.uri=http://127.0.0.1:{port}", "--dry-run"],
    }[case]  # fmt: skip
    if case in ("env", "dry_run_env"):
        env["MLFLOW_TRACKING_URI"] = f"http://127.0.0.1:{port}"
    proc = trustbench([*args, *FAST], home, timeout=180, **env)
    assert proc.returncode == 2, proc.stderr[-3000:]
    env_case = case in ("env", "dry_run_env")
    one_message(proc.stderr, "environment variable MLFLOW_TRACKING_URI" if env_case else f"config key '{key}'")
    assert runs(home) == []
    if case == "port_taken":
        assert "in use" in proc.stderr


# -- 5. a corrupt checkpoint -----------------------------------------------------------------------------
CKPT = [*FAST, "trainer.total_steps=3", "trainer.checkpoint_every=1"]


def _interrupted_run(home: Path) -> tuple[Path, str]:
    """A run that checkpointed after steps 1 and 2 and failed at step 3 (debug hook)."""
    proc = trustbench(["run", *CKPT, "debug.fail_at_step=2"], home)
    assert proc.returncode == 1, proc.stderr[-3000:]
    (run,) = runs(home)
    return only_run_dir(home), run.info.run_id


def test_a_truncated_checkpoint_falls_back_to_the_previous_one(tmp_path):
    """The latest checkpoint truncated (a kill during a copy, a bad disk): the rerun says which file
    it set aside, resumes from the previous checkpoint into the same MLflow run, logs each step once,
    and ends with the numbers of a run never interrupted (reference: that run, in another home)."""
    home = tmp_path / "home"
    run_dir, run_id = _interrupted_run(home)
    ckpt = run_dir / "checkpoint.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:1000])
    proc = trustbench(["run", *CKPT], home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"checkpoint {ckpt} cannot be read" in proc.stderr and (run_dir / "checkpoint.pt.corrupt").exists()
    (run,) = runs(home)
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    assert "trustbench.failure" not in run.data.tags  # the earlier attempt's reason went with it
    assert steps(home, run_id) == [1, 2, 3]
    clean = tmp_path / "clean"
    assert trustbench(["run", *CKPT], clean).returncode == 0
    (reference,) = runs(clean)
    for key in ("critic/score/mean", "actor/entropy", "actor/pg_loss"):
        assert run.data.metrics[key] == pytest.approx(reference.data.metrics[key], rel=1e-5, abs=1e-7), key


def test_no_readable_checkpoint_names_the_files_and_keeps_the_run(tmp_path):
    """Both checkpoints damaged: the run fails naming both files to remove (no traceback); its
    MLflow run is kept (FAILED with that reason) and, the files removed, the rerun resumes the same
    MLflow run from step 0 and finishes with each step logged once."""
    home = tmp_path / "home"
    run_dir, run_id = _interrupted_run(home)
    for name in ("checkpoint.pt", "checkpoint.prev.pt"):
        (run_dir / name).write_bytes(b"not a checkpoint")
    proc = trustbench(["run", *CKPT], home)
    assert proc.returncode == 1
    message = one_message(proc.stderr, str(run_dir / "checkpoint.pt"), str(run_dir / "checkpoint.prev.pt"), "remove")
    assert "step 0" in message
    (run,) = runs(home)
    assert run.info.run_id == run_id and run.info.status == "FAILED"
    assert "checkpoint.prev.pt" in run.data.tags["trustbench.failure"]
    for name in ("checkpoint.pt", "checkpoint.prev.pt"):
        (run_dir / name).unlink()
    assert trustbench(["run", *CKPT], home).returncode == 0
    (run,) = runs(home)
    assert run.info.run_id == run_id and run.info.status == "FINISHED" and steps(home, run_id) == [1, 2, 3]


# -- 7. a full disk, an unwritable run directory ----------------------------------------------------------
def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]).returncode == 0


@pytest.fixture
def small_fs(tmp_path):
    """A tmpfs for the trustbench home, or None where this process may not mount one."""
    mount = tmp_path / "fs"
    mounted = _mount_tmpfs(mount, "64m")
    yield mount if mounted else None
    if mounted:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _used_kib(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize // 1024


def _no_temporary_files(home: Path) -> None:
    left = [p for p in home.rglob("*") if p.name.endswith(".tmp") or ".building" in p.name]
    assert not left, left


def test_a_full_disk_ends_the_run_failed_and_a_rerun_finishes_it(small_fs, tmp_path, monkeypatch):
    """The checkpoint does not fit: the run ends FAILED in MLflow and in status.json, both naming
    the disk; no temporary file is left. With room again, the rerun resumes the same MLflow run and
    finishes with its step logged once."""
    if small_fs is None:
        return _full_disk_simulated(tmp_path, monkeypatch)
    home = small_fs / "home"
    from runners import tracking

    tracking.ensure_store(f"sqlite:///{home / 'mlflow.db'}")
    room = _used_kib(small_fs) + 1536  # the store and a run's small files fit, a checkpoint (~3 MB) does not
    subprocess.run(["mount", "-o", f"remount,size={room}k", str(small_fs)], check=True)
    proc = trustbench(["run", *FAST], home)
    assert proc.returncode == 1
    one_message(proc.stderr, "No space left on device", "checkpoint.pt")
    _check_failed_then_resumed(home, "No space left on device",
                               lambda: subprocess.run(["mount", "-o", "remount,size=64m", str(small_fs)], check=True))  # fmt: skip


def _fill(path: Path) -> None:
    """Write ``path`` until the file system has no byte left."""
    with open(path, "wb", buffering=0) as fh:
        for size in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    fh.write(b"x" * size)


def test_a_disk_that_stays_full_ends_each_run_in_one_message(small_fs):
    """The disk full for good: before the run (the store has no room for its MLflow run), then in
    the middle of one (every MLflow write fails from then on). Each ends with exit 1 and one line
    naming the full disk, no traceback (it used to print MLflow's ~10, or Hydra's); the marker of
    the run that started says FAILED although no new file fits (rewritten in place), its MLflow run
    stays RUNNING (nothing can be written there) and the message says so. With room again the
    rerun resumes that MLflow run and logs its step once."""
    if small_fs is None:
        pytest.skip("needs root to mount a small tmpfs (a disk that stays full)")
    from runners import tracking

    home, fill = small_fs / "home", small_fs / "fill"
    tracking.ensure_store(f"sqlite:///{home / 'mlflow.db'}")
    _fill(fill)
    proc = trustbench(["run", *FAST], home)
    assert proc.returncode == 1
    one_message(proc.stderr, "open its MLflow run", "database or disk is full", "status.json could not be written")
    assert runs(home) == []
    fill.unlink()
    running = start(["run", *FAST, "debug.step_delay_s=10", "tracking.flush_every_s=1"], home)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not list(home.glob("runs/*/status.json")):
            assert running.poll() is None, running.communicate()
            time.sleep(0.2)
        _fill(fill)
        out, err = running.communicate(timeout=300)
    finally:
        running.kill()
    assert running.returncode == 1
    message = one_message(err, "database or disk is full", "could not be marked FAILED")
    (run,) = runs(home)
    assert run.info.status == "RUNNING" and run.info.run_id in message
    status = json.loads((only_run_dir(home) / "status.json").read_text())
    assert status["status"] == "FAILED" and "database or disk is full" in status["reason"]
    _no_temporary_files(home)
    fill.unlink()
    again = trustbench(["run", *FAST], home)
    assert again.returncode == 0, again.stderr[-3000:]
    (done,) = runs(home)
    assert done.info.run_id == run.info.run_id and done.info.status == "FINISHED"
    assert steps(home, run.info.run_id) == [1]
    assert json.loads((only_run_dir(home) / "status.json").read_text())["status"] == "FINISHED"


def _full_disk_simulated(tmp_path, monkeypatch) -> None:
    """ENOSPC simulated (no tmpfs here): torch.save writes part of the file, then the disk is full."""
    import torch

    from runners.config import compose
    from runners.run import RunFailed, run

    home = tmp_path / "home"
    monkeypatch.setenv("TRUSTBENCH_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    real_save = torch.save

    def full(state, fh, *a, **k):
        fh.write(b"x" * 4096)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    cfg, choices = compose(FAST)
    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(RunFailed, match="No space left on device"):
        run(cfg, choices)
    monkeypatch.setattr(torch, "save", real_save)
    _check_failed_then_resumed(home, "No space left on device", lambda: None, rerun=lambda: run(cfg, choices))


def _check_failed_then_resumed(home: Path, reason: str, make_room, rerun=None) -> None:
    (run,) = runs(home)
    status = json.loads((only_run_dir(home) / "status.json").read_text())
    assert run.info.status == "FAILED" and reason in run.data.tags["trustbench.failure"]
    assert status["status"] == "FAILED" and reason in status["reason"]
    _no_temporary_files(home)
    make_room()
    if rerun is None:
        proc = trustbench(["run", *FAST], home)
        assert proc.returncode == 0, proc.stderr[-3000:]
    else:
        rerun()
    (again,) = runs(home)
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"
    assert "trustbench.failure" not in again.data.tags
    assert steps(home, run.info.run_id) == [1]
    assert json.loads((only_run_dir(home) / "status.json").read_text())["status"] == "FINISHED"


def _make_unwritable(path: Path) -> bool:
    if os.geteuid() != 0:
        path.chmod(0o555)
        return True
    return subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0


def _make_writable(path: Path) -> None:
    if os.geteuid() != 0:
        path.chmod(0o755)
    else:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_an_unwritable_run_directory_ends_the_run_failed_in_both_places(small_fs, tmp_path, monkeypatch):
    """The run directory stops taking new files mid-run (before the checkpoint): MLflow and
    status.json both say FAILED with the reason (the marker is rewritten in place); once the
    directory is writable again the rerun finishes the same MLflow run and drops the old failure tag."""
    from runners.backends.local import checkpoint as ckpt
    from runners.config import compose
    from runners.run import RunFailed, run

    home = (small_fs or tmp_path) / "home"
    monkeypatch.setenv("TRUSTBENCH_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    real_save = ckpt.save
    locked = []

    def save_into_a_locked_directory(run_dir, state):
        if not _make_unwritable(Path(run_dir)):
            pytest.skip("cannot make a directory unwritable here (no chattr +i on this filesystem)")
        locked.append(Path(run_dir))
        return real_save(run_dir, state)

    cfg, choices = compose(FAST)
    monkeypatch.setattr(ckpt, "save", save_into_a_locked_directory)
    try:
        with pytest.raises(RunFailed, match=r"checkpoint|denied|not permitted"):
            run(cfg, choices)
    finally:
        for path in locked:
            _make_writable(path)
    monkeypatch.setattr(ckpt, "save", real_save)
    reason = "Operation not permitted" if os.geteuid() == 0 else "Permission denied"
    _check_failed_then_resumed(home, reason, lambda: None, rerun=lambda: run(cfg, choices))


# -- 7. credentials in the tracking URI ------------------------------------------------------------------
def test_credentials_in_the_tracking_uri_are_never_recorded(tmp_path, monkeypatch):
    """A run logging through `tracking.uri="http://alice:PASSWORD@127.0.0.1:PORT"` (a real server on
    loopback), PASSWORD with a "'" and every other sub-delim RFC 3986 allows in userinfo: the password
    (or any piece of it) is in no file of the trustbench home (the sqlite store included: params,
    tags, artifacts), not in the dry run's plan and not in the command's output (MLflow's run links
    included); the recorded URI keeps the user with the password masked."""
    from runners import tracking_server

    home, port, secret = tmp_path / "home", free_port(), "se'cr!$&()*+,;=:~Pa55"
    monkeypatch.setenv("TRUSTBENCH_HOME", str(home))
    server = tracking_server.ensure_server("127.0.0.1", port)
    try:
        uri = f"http://alice:{secret}@127.0.0.1:{port}"
        override = f'tracking.uri="{uri}"'  # quoted for Hydra's override grammar, as a shell user writes it
        proc = trustbench(["run", override, *FAST], home)
        assert proc.returncode == 0, proc.stderr[-3000:]
        (run,) = runs(home, f"http://127.0.0.1:{port}")
        assert run.data.params["tracking.uri"] == f"http://alice:***@127.0.0.1:{port}"
        plan = trustbench(["sweep", "demo", "--dry-run", override], home)
        assert plan.returncode == 0, plan.stderr[-3000:]
    finally:
        server.stop()
    pieces = (secret, "se'cr", "Pa55", "se''cr", "se%27cr")  # as given, YAML-quoted, percent-encoded
    for text in (proc.stdout, proc.stderr, plan.stdout, plan.stderr):
        assert not [p for p in pieces if p in text], text[-3000:]
    leaks = [p for p in home.rglob("*") if p.is_file() and any(x.encode() in p.read_bytes() for x in pieces)]
    assert not leaks, leaks
