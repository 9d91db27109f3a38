"""A new sqlite store copied from the cached template is the store MLflow builds from scratch
(runners/sqlite_store.py): same schema, same rows, its own artifact location; and MLflow works on it."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from runners import sqlite_store


def _clauses(sql: str | None) -> tuple[str, ...]:
    """A CREATE statement's lines without order: MLflow's own builds list a table's constraints in
    varying order (two scratch builds differ), the same constraints each time."""
    return tuple(sorted(line.strip().rstrip(",").strip() for line in (sql or "").splitlines()))


def _dump(db: Path) -> tuple[set, dict]:
    """(schema statements, rows of every table) of a sqlite file."""
    with sqlite3.connect(db) as con:
        schema = {
            (t, n, tbl, _clauses(sql))
            for t, n, tbl, sql in con.execute("SELECT type, name, tbl_name, sql FROM sqlite_master")
        }
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        rows = {t: sorted(con.execute(f'SELECT * FROM "{t}"').fetchall(), key=repr) for t in tables}
    return schema, rows


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRUSTBENCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_copy_of_the_template_is_what_mlflow_builds_from_scratch(tmp_path, cache):
    import mlflow

    scratch = tmp_path / "scratch" / "mlflow.db"
    scratch.parent.mkdir()
    sqlite_store._build_from_scratch(scratch, scratch.parent / "artifacts")  # MLflow's own migrations

    copied = tmp_path / "home" / "mlflow.db"
    sqlite_store.ensure_sqlite_store(copied)
    time.sleep(0.01)
    made = time.time() * 1000
    again = tmp_path / "home2" / "mlflow.db"
    sqlite_store.ensure_sqlite_store(again)
    made = (made, time.time() * 1000)
    assert (cache / "mlflow-store" / f"{mlflow.__version__}.db").is_file()  # the first build kept a template

    for db in (copied, again):
        schema, rows = _dump(db)
        ref_schema, ref_rows = _dump(scratch)
        assert schema == ref_schema
        ((exp_id, name, location, stage, created, updated, workspace),) = rows.pop("experiments")
        ((r_id, r_name, r_location, r_stage, _, _, r_workspace),) = ref_rows.pop("experiments")
        assert (exp_id, name, stage, workspace) == (r_id, r_name, r_stage, r_workspace)
        assert location == r_location.replace(str(scratch.parent), str(db.parent))  # its own artifact root
        assert location == (db.parent / "artifacts").as_uri() + "/0"
        assert created == updated
        if db == again:  # the copy is dated when it was made, not when the template was
            assert made[0] - 1 <= created <= made[1] + 1
        assert rows == ref_rows  # alembic version, workspaces, every empty table


def test_mlflow_runs_on_a_copied_store_and_its_artifacts_land_in_its_home(tmp_path, cache):
    from mlflow import MlflowClient

    for home in ("a", "b"):  # "b" is a copy of the template "a" built
        db = tmp_path / home / "mlflow.db"
        sqlite_store.ensure_sqlite_store(db)
        client = MlflowClient(f"sqlite:///{db}")
        run = client.create_run("0")
        client.log_metric(run.info.run_id, "m", 1.5, step=3)
        (tmp_path / "f.txt").write_text("x")
        client.log_artifact(run.info.run_id, str(tmp_path / "f.txt"))
        assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "m")] == [(3, 1.5)]
        assert list((tmp_path / home / "artifacts" / "0").rglob("f.txt"))


def test_without_a_writable_cache_the_store_is_built_from_scratch(tmp_path, monkeypatch):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")
    monkeypatch.setenv("TRUSTBENCH_CACHE", str(blocker / "cache"))  # mkdir under a file fails
    db = tmp_path / "home" / "mlflow.db"
    sqlite_store.ensure_sqlite_store(db)
    _, rows = _dump(db)
    assert rows["experiments"][0][2] == (db.parent / "artifacts").as_uri() + "/0"


def test_a_template_that_is_not_one_is_not_copied(tmp_path, cache):
    import mlflow

    template = cache / "mlflow-store" / f"{mlflow.__version__}.db"
    template.parent.mkdir(parents=True)
    sqlite_store._build_from_scratch(template, tmp_path / "elsewhere")  # another artifact root
    db = tmp_path / "home" / "mlflow.db"
    sqlite_store.ensure_sqlite_store(db)
    _, rows = _dump(db)
    assert rows["experiments"][0][2] == (db.parent / "artifacts").as_uri() + "/0"
    assert not list(db.parent.glob(".*building"))
