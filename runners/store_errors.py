"""One line for an error of the tracking store, as the commands report it (``runners.tracking``,
``runners.metric_history``, ``runners.run``).

An error of MLflow's SQL store carries the statement, its parameters and MLflow's wrapping:
thousands of characters. ``describe_error`` keeps what went wrong, and masks the credentials of
URIs (``runners.redact``).
"""

from __future__ import annotations

import re

from runners.redact import redact

_STORE_ERROR = re.compile(r"\(((?:sqlite3|psycopg2|pymysql)\.\w+)\) ([^\n\\\[]+)")


def describe_error(err: BaseException) -> str:
    """``Type: message``, an error of MLflow's SQL store cut to what went wrong (not the statement,
    its parameters and MLflow's wrapping: thousands of characters); credentials of URIs masked."""
    text = str(err)
    found = _STORE_ERROR.search(text) if "[SQL:" in text else None
    if found:
        return redact(f"{type(err).__name__}: the MLflow store failed ({found[1]}: {found[2].strip()})")
    return redact(f"{type(err).__name__}: {text}")
