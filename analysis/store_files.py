"""Where a tracking URI's store lies on this machine, for the bulk readers of ``analysis.sources``: the
database file of a ``sqlite:`` URI, the root folder of a ``file:`` store, and whether a sqlite file holds
MLflow's ``metrics`` table (the columns the SQL reader selects), so a reader is picked only for a store it
can read.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import unquote, urlparse


def sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///path`` URI (relative or ``sqlite:////abs``), else None."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    path = tracking_uri[len("sqlite:///") :].split("?", 1)[0]
    if path in ("", ":memory:"):
        return None
    return Path(unquote(path)).resolve()


def file_store_root(tracking_uri: str) -> Path | None:
    """The root directory of a ``file:`` (or plain path) tracking URI, else None."""
    parsed = urlparse(tracking_uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "" and tracking_uri:
        return Path(tracking_uri).resolve()
    return None


def has_metrics_table(db: Path) -> bool:
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            cols = {row[1] for row in con.execute("PRAGMA table_info(metrics)")}
        finally:
            con.close()
    except sqlite3.Error:
        return False
    return {"run_uuid", "key", "value", "timestamp", "step", "is_nan"} <= cols
