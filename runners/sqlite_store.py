"""A new sqlite MLflow store is created whole or not at all, once, however many runs start at once.

Why: MLflow creates the schema of a new sqlite file in whichever process opens it first (the
initial tables, then some 50 alembic migrations, then the default experiment). Runs started
together into a fresh directory all do it at once, race in the migrations, and a loser leaves a
half-migrated file (an ``_alembic_tmp_*`` table, a table missing) on which every later process
fails. Here the schema is built in a private temporary file, under an exclusive lock
(``flock`` on ``<db>.lock``), and renamed into place complete: the others wait for the lock and
find the file done. A process killed while building leaves only its temporary file, never a
half-built store. A store left broken by such a race before (it has ``_alembic_tmp_*`` tables) is
reported with the file to move away, instead of MLflow's migration error; so is a damaged file
(``check_sqlite_store``: not SQLite, an unreadable schema, or shorter than its header declares with
damage SQLite's ``quick_check`` confirms),
with what moving it aside keeps (run directories, checkpoints, artifacts with each run's metric
history) and loses, instead of MLflow's traceback. Every command that opens the store checks it so.

Building the schema costs about 2.5 s of CPU (the migrations), in every new trustbench home. So the
first build for an MLflow version also keeps an empty store as a template in the cache
(``$TRUSTBENCH_CACHE/mlflow-store/<version>.db``, made the same way: locked, built aside, renamed
into place); later stores are copies of it whose default experiment gets its own artifact location
and creation time, the only fields of an empty store that depend on where and when it was made.
Where the cache cannot be written, or the template does not look as expected, the store is built
from scratch as before.

    ensure_sqlite_store(Path(".trustbench/mlflow.db"))
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sqlite3
import time
from contextlib import closing
from pathlib import Path

# the artifact root the template is built with: replaced by each store's own in its copy
TEMPLATE_ARTIFACTS = Path("/trustbench-template/artifacts")


class BrokenStore(RuntimeError):
    """An existing sqlite store that is damaged or whose schema creation was interrupted; the message
    names the file and how to recover."""


def ensure_sqlite_store(db: Path) -> None:
    """Make ``db`` a complete MLflow sqlite store if it is missing or empty; check an existing one."""
    if _exists(db):
        check_sqlite_store(db)
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    _create_once(db, lambda tmp: _build(tmp, artifact_root=db.parent / "artifacts"))


def _create_once(db: Path, build) -> None:
    """``build(tmp)`` then ``tmp`` renamed to ``db``, under ``db``'s lock, unless ``db`` exists by then."""
    lock = os.open(db.with_name(db.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it: wait for it
        if _exists(db):
            return
        tmp = db.with_name(f".{db.name}.{os.getpid()}.building")
        try:
            build(tmp)
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
    """The schema and MLflow's default experiment, in ``path`` (which nobody else opens): a copy of
    the cached template when there is one, else from scratch."""
    template = _template()
    if template is not None:
        shutil.copyfile(template, path)
        if _adopt(path, artifact_root):
            return
    _build_from_scratch(path, artifact_root)


def _template() -> Path | None:
    """This MLflow version's empty store in the cache, built on first use; None if it cannot be."""
    import mlflow

    from runners.paths import model_cache_dir

    template = model_cache_dir() / "mlflow-store" / f"{mlflow.__version__}.db"
    try:
        if not _exists(template):
            template.parent.mkdir(parents=True, exist_ok=True)
            _create_once(template, lambda tmp: _build_from_scratch(tmp, TEMPLATE_ARTIFACTS))
        return template
    except OSError:
        return None


def _adopt(path: Path, artifact_root: Path) -> bool:
    """Point a copy of the template at ``artifact_root``, dated now; False if it is not the template."""
    old, new = TEMPLATE_ARTIFACTS.as_uri(), artifact_root.as_uri()
    now = int(time.time() * 1000)
    with closing(sqlite3.connect(path)) as con, con:
        rows = con.execute("SELECT artifact_location FROM experiments").fetchall()
        if len(rows) != 1 or not str(rows[0][0]).startswith(old):
            return False
        con.execute(
            "UPDATE experiments SET artifact_location = ?, creation_time = ?, last_update_time = ?",
            (new + rows[0][0][len(old) :], now, now),
        )
    return True


def _build_from_scratch(path: Path, artifact_root: Path) -> None:
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    path.unlink(missing_ok=True)
    uri = f"sqlite:///{path}"
    store = SqlAlchemyStore(uri, artifact_root.as_uri())
    store.engine.dispose()
    SqlAlchemyStore._engine_map.pop(uri, None)


def check_sqlite_store(db: Path) -> None:
    """``BrokenStore`` if ``db`` exists, is not empty, and is damaged or half-built. A store that is
    locked or busy (another process writes it) or unreadable for permissions passes: MLflow waits or
    reports it. A missing or empty file passes (``ensure_sqlite_store`` creates it)."""
    fault = _damage(db)
    if fault:
        from runners.paths import trustbench_home

        home = trustbench_home()
        raise BrokenStore(
            f"the MLflow store {db} is damaged ({fault}): move it aside (mv {db} {db}.damaged) and run again to "
            f"start an empty store; kept: run directories and checkpoints ({home / 'runs'}, a rerun resumes each "
            f"cell from its last checkpoint) and artifacts ({home / 'artifacts'}, each run's metrics/history.parquet "
            f"up to its last checkpoint); lost: what only this file held (sqlite3 {db}.damaged .recover may save it)"
        )
    _check_not_half_built(db)


def _damage(db: Path) -> str | None:
    """What is wrong with the file ``db`` as an SQLite database, or None (fine, missing, empty, locked).

    A file shorter than its header declares (a truncated copy) is checked further by SQLite's
    ``quick_check`` (only then: it reads the whole file); SQLite reads some truncated files whole (the
    cut fell in free space). The header and the size are read under SQLite's shared lock (taken by
    reading the schema): no commit is under way then (a commit writes page 1, with the new page
    count, before the pages it appends), and a journal left by a killed writer has been rolled back
    (or the read fails as locked)."""
    try:
        with closing(sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)) as con:
            con.execute("BEGIN")
            con.execute("SELECT name, sql FROM sqlite_master").fetchall()
            with db.open("rb") as f:
                head, size = f.read(100), os.fstat(f.fileno()).st_size
            page = int.from_bytes(head[16:18], "big")
            declared = int.from_bytes(head[28:32], "big") * (65536 if page == 1 else page)
            if len(head) == 100 and head[24:28] == head[92:96] and declared > size:  # the page count is valid
                found = " ".join(con.execute("PRAGMA quick_check(1)").fetchone()[0].split())
                if found != "ok":
                    return f"truncated: {size:,} bytes of the {declared:,} its header declares; {found}"
    except (OSError, sqlite3.OperationalError):  # missing, unreadable, locked, busy: not damage
        return None
    except sqlite3.DatabaseError as err:  # "file is not a database", "database disk image is malformed"
        return f"SQLite cannot read it: {err}"
    return None


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
