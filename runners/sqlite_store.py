"""A new sqlite MLflow store is created whole or not at all, once, however many runs start at once.

Why: MLflow creates the schema of a new sqlite file in whichever process opens it first (the
initial tables, then some 50 alembic migrations, then the default experiment). Runs started
together into a fresh directory all do it at once, race in the migrations, and a loser leaves a
half-migrated file (an ``_alembic_tmp_*`` table, a table missing) on which every later process
fails. Here the schema is built in a private temporary file, under an exclusive lock
(``flock`` on ``<db>.lock``), and renamed into place complete: the others wait for the lock and
find the file done. A process killed while building leaves only its temporary file, never a
half-built store. A store left broken by such a race before (it has ``_alembic_tmp_*`` tables) is
reported with the file to move away, instead of MLflow's migration error.

    ensure_sqlite_store(Path(".trustbench/mlflow.db"))
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from pathlib import Path


class BrokenStore(RuntimeError):
    """An existing sqlite store whose schema creation was interrupted; the message names the file."""


def ensure_sqlite_store(db: Path) -> None:
    """Make ``db`` a complete MLflow sqlite store if it is missing or empty; check an existing one."""
    if _exists(db):
        _check_not_half_built(db)
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    lock = os.open(db.with_name(db.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it: wait for it
        if _exists(db):
            return
        tmp = db.with_name(f".{db.name}.{os.getpid()}.building")
        try:
            _build(tmp, artifact_root=db.parent / "artifacts")
            os.replace(tmp, db)
        finally:
            tmp.unlink(missing_ok=True)
    finally:
        os.close(lock)


def _exists(db: Path) -> bool:
    try:
        return db.stat().st_size > 0
    except FileNotFoundError:
        return False


def _build(path: Path, artifact_root: Path) -> None:
    """The schema and MLflow's default experiment, in ``path`` (which nobody else opens)."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    path.unlink(missing_ok=True)
    uri = f"sqlite:///{path}"
    store = SqlAlchemyStore(uri, artifact_root.as_uri())
    store.engine.dispose()
    SqlAlchemyStore._engine_map.pop(uri, None)


def _check_not_half_built(db: Path) -> None:
    try:
        with sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True) as con:
            names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            runs = con.execute("SELECT count(*) FROM runs").fetchone()[0] if "runs" in names else 0
    except sqlite3.Error:
        return  # not for us to judge: MLflow reports what it finds
    leftovers = sorted(n for n in names if n.startswith("_alembic_tmp_"))
    if leftovers:
        raise BrokenStore(
            f"the MLflow store {db} was left half-built by an interrupted schema creation (table {leftovers[0]} "
            f"remains; it holds {runs} run(s)): move it away (e.g. mv {db} {db}.broken) and start again"
        )
