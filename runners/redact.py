"""Credentials out of everything trustbench records: ``scheme://user:password@host`` -> ``user:***@``.

A tracking URI may carry credentials (``https://user:token@mlflow.example.org``). Whatever records a
URI (MLflow params, ``config.yaml`` and ``command.txt`` beside the run and in MLflow, the sweep's
``multirun.yaml``, printed plans and messages) passes it through ``redact`` first; the process
itself keeps using the real URI. A user part without a password (``https://token@host``) is
masked whole.

    redact("tracking.uri=https://bob:s3cret@host/x")   # -> "tracking.uri=https://bob:***@host/x"
"""

from __future__ import annotations

import re
from typing import Any

# userinfo right after "scheme://", up to the "@" before the host (no "/" in between)
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@:\s'\"]+)(?::(?P<secret>[^/\s'\"]*))?@")


def _mask(match: re.Match) -> str:
    if match["secret"] is None:
        return f"{match['scheme']}***@"
    return f"{match['scheme']}{match['user']}:***@"


def redact(text: str) -> str:
    """``text`` with the credentials of every URI in it masked."""
    return _USERINFO.sub(_mask, text)


def redact_values(obj: Any) -> Any:
    """``obj`` (nested dicts, lists, strings) with ``redact`` applied to every string."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {k: redact_values(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact_values(v) for v in obj)
    return obj
