"""A damaged MLflow store (a truncated copy, random bytes) is one line naming the file and the way out.

Every command that opens the store (``run``, ``report``, ``sweep --dry-run``, ``ui``, and a sweep's
cell through ``runners.main``) exits 2 with one ``trustbench:`` line that names the file, says it is
damaged and how to move it aside, and prints no traceback; a FINISHED cell's ``status.json`` keeps
its bytes and nothing new is created. The reference for "damaged" is SQLite's own ``PRAGMA
integrity_check`` on the same file (never trustbench's check); the store holds a finished run made
with MLflow's client, tagged with the run key of the cell the commands start.

Run:  pytest tests/test_damaged_store.py        (~1 min; the subprocess scenarios are marked e2e)
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from runners import metric_names
from runners.sqlite_store import BrokenStore, check_sqlite_store
from runners.status import STATUS_FILE, read_status, write_status
from tests.reliability import FAST, REPO, command_env, free_port, one_message

EXPERIMENT = "default"


def _python(home, module: str, *args: str) -> subprocess.CompletedProcess:
    """``python -m module args`` with ``home`` as the trustbench home, from its parent folder."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=home.parent,
        env=command_env(home),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _cell_key() -> str:
    from runners.config import compose, run_key

    cfg, _ = compose(FAST)
    return run_key(cfg)


@pytest.fixture(scope="module")
def finished_home(tmp_path_factory) -> Path:
    """A trustbench home whose store holds one FINISHED run (with a metric history) of the cell
    ``trustbench run FAST`` starts, and that cell's FINISHED ``status.json``."""
    from mlflow import MlflowClient

    from runners.sqlite_store import ensure_sqlite_store

    home = tmp_path_factory.mktemp("finished") / "home"
    db = home / "mlflow.db"
    ensure_sqlite_store(db)
    client = MlflowClient(f"sqlite:///{db}")
    exp = client.create_experiment(EXPERIMENT, artifact_location=(home / "artifacts" / EXPERIMENT).as_uri())
    key = _cell_key()
    run = client.create_run(exp, tags={metric_names.TAG_RUN_KEY: key}, run_name="GRPO · s0")
    for step in range(50):
        client.log_metric(run.info.run_id, "train/reward", 0.01 * step, step=step)
    client.set_terminated(run.info.run_id, "FINISHED")
    write_status(home / "runs" / key, "FINISHED", run_id=run.info.run_id, name="GRPO · s0")
    return home


def _integrity(db: Path) -> str:
    """SQLite's own verdict on the file: 'ok' or what it found."""
    try:
        with closing(sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)) as con:
            return con.execute("PRAGMA integrity_check").fetchone()[0]
    except sqlite3.DatabaseError as err:
        return str(err)


def _damage(db: Path, how: str, fraction: float = 0.5) -> None:
    size = db.stat().st_size
    if how == "truncated":
        os.truncate(db, int(size * fraction))
    else:
        db.write_bytes(os.urandom(size))  # noqa: S311 - any bytes do


@pytest.fixture(params=["truncated", "random_bytes"])
def damaged_home(request, finished_home, tmp_path) -> Path:
    home = tmp_path / "home"
    shutil.copytree(finished_home, home)
    _damage(home / "mlflow.db", request.param)
    assert _integrity(home / "mlflow.db") != "ok"
    return home


# bytes cut off the end of the store, from its page size and size
CUTS = {
    "1": lambda page, size: 1,
    "2048": lambda page, size: 2048,
    "page-1": lambda page, size: page - 1,
    "page": lambda page, size: page,
    "3*page": lambda page, size: 3 * page,
    "half": lambda page, size: size // 2,
}


@pytest.mark.parametrize("cut", [*CUTS, "random"])
def test_the_check_agrees_with_sqlites_integrity_check(finished_home, tmp_path, cut):
    """A copy cut short by ``cut`` bytes (or overwritten with random bytes) is called damaged exactly
    when SQLite's own integrity check finds damage: a cut inside free space of the last page is read
    whole by SQLite and is not refused; a cut that SQLite still opens (the schema intact) but finds
    damage in is refused."""
    db = tmp_path / "mlflow.db"
    shutil.copyfile(finished_home / "mlflow.db", db)
    assert _integrity(db) == "ok"
    check_sqlite_store(db)
    if cut == "random":
        _damage(db, "random")
    else:
        with closing(sqlite3.connect(db)) as con:
            page = con.execute("PRAGMA page_size").fetchone()[0]
        size = db.stat().st_size
        os.truncate(db, size - CUTS[cut](page, size))
    damaged = _integrity(db) != "ok"
    if not damaged:
        check_sqlite_store(db)
        return
    with pytest.raises(BrokenStore, match="is damaged") as err:
        check_sqlite_store(db)
    assert str(db) in str(err.value) and f"mv {db} {db}.damaged" in str(err.value)
    assert "\n" not in str(err.value)


def test_damage_sqlite_still_opens_is_found(finished_home, tmp_path):
    """Cut 1 byte short of a whole page: SQLite still reads the schema (MLflow would fail later, on a
    run's rows), its integrity check finds the damage, and so does the check (from the header's size)."""
    db = tmp_path / "mlflow.db"
    shutil.copyfile(finished_home / "mlflow.db", db)
    with closing(sqlite3.connect(db)) as con:
        page = con.execute("PRAGMA page_size").fetchone()[0]
    os.truncate(db, db.stat().st_size - (page - 1))
    with closing(sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)) as con:
        con.execute("SELECT name, sql FROM sqlite_master").fetchall()
    assert _integrity(db) != "ok"
    with pytest.raises(BrokenStore, match="truncated"):
        check_sqlite_store(db)


def test_a_store_being_written_or_missing_is_not_called_damaged(finished_home, tmp_path):
    """Another process in the middle of a write transaction, or no file yet: not damage, the check passes."""
    db = tmp_path / "mlflow.db"
    check_sqlite_store(db)  # missing: created later
    shutil.copyfile(finished_home / "mlflow.db", db)
    with closing(sqlite3.connect(db, isolation_level=None)) as writer:
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("UPDATE runs SET status = 'RUNNING'")
        check_sqlite_store(db)
        writer.execute("ROLLBACK")


COMMANDS = {
    "run": ["run", *FAST],
    "report": ["report", EXPERIMENT, "--no-pdf", "--no-mlflow"],
    "report_offline": ["report", EXPERIMENT, "--no-pdf", "--no-mlflow", "--offline"],
    "sweep_dry_run": ["sweep", "demo", "--dry-run"],
    "ui": ["ui", "--port", "{port}"],
}


def _snapshot(home: Path) -> dict[str, bytes]:
    return {str(p.relative_to(home)): p.read_bytes() for p in sorted(home.rglob("*")) if p.is_file()}


@pytest.mark.e2e  # a reliability scenario: real commands in subprocesses (left out of make test-fast)
@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_names_the_damaged_store_in_one_line(damaged_home, command):
    """Exit 2, one line naming the file, 'damaged' and the file to move aside, no traceback; every
    file of the home (the FINISHED status.json included) keeps its bytes and none is added."""
    before = _snapshot(damaged_home)
    args = [a.replace("{port}", str(free_port())) for a in COMMANDS[command]]
    done = _python(damaged_home, "runners.cli", *args)
    assert done.returncode == 2, done.stderr
    db = damaged_home / "mlflow.db"
    one_message(done.stderr, f"the MLflow store {db} is damaged", f"mv {db} {db}.damaged", "checkpoints")
    assert _snapshot(damaged_home) == before
    (run_dir,) = (damaged_home / "runs").iterdir()
    assert read_status(run_dir)["status"] == "FINISHED"


@pytest.mark.e2e
def test_a_sweep_cell_on_a_damaged_store_keeps_its_finished_marker(damaged_home):
    """The cell itself (``runners.main``, as a sweep's launcher runs it, past the command's own check):
    exit 2 naming the store, and the FINISHED status.json untouched."""
    (run_dir,) = (damaged_home / "runs").iterdir()
    marker = (run_dir / STATUS_FILE).read_bytes()
    done = _python(damaged_home, "runners.main", *FAST)
    assert done.returncode == 2, done.stderr
    one_message(done.stderr, str(damaged_home / "mlflow.db"), "is damaged")
    assert (run_dir / STATUS_FILE).read_bytes() == marker


def test_a_store_failure_never_rewrites_a_finished_marker(tmp_path):
    """Any failure of the store before the run opens (here a made-up one) fails the command, but a
    FINISHED marker stays as it was; an unfinished cell's marker says FAILED, as before."""
    from runners.run import RunFailed, _Cell, _store_failure

    for status, expected in (("FINISHED", "FINISHED"), ("PREEMPTED", "FAILED")):
        cell = _Cell("k", "label", "name", tmp_path / status)
        write_status(cell.run_dir, status, run_id="r1")
        marker = (cell.run_dir / STATUS_FILE).read_bytes()
        with pytest.raises(RunFailed, match="disk I/O error"), _store_failure(cell, "open the tracking store"):
            raise sqlite3.OperationalError("disk I/O error")
        assert read_status(cell.run_dir)["status"] == expected
        assert ((cell.run_dir / STATUS_FILE).read_bytes() == marker) == (expected == "FINISHED")


def test_reports_stay_free_of_hydra_and_omegaconf_when_checking_the_store(finished_home):
    """The report command's check imports only the store module (reports run without hydra/omegaconf)."""
    code = (
        "import sys, reports.cli as c; c._broken_store(None, None); "
        "print(sorted({'omegaconf', 'hydra', 'torch'} & set(sys.modules)))"
    )
    env = command_env(finished_home)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr
