"""Credentials out of everything trustbench records: ``scheme://user:password@host`` -> ``user:***@``.

A tracking URI may carry credentials (``https://user:token@mlflow.example.org``). Whatever records a
URI (MLflow params, ``config.yaml`` and ``command.txt`` beside the run and in MLflow, the sweep's
``multirun.yaml``, printed plans and messages) passes it through ``redact`` first; the process
itself keeps using the real URI. A user part without a password (``https://token@host``) is
masked whole.

    redact("tracking.uri=https://bob:s3cret@host/x")   # -> "tracking.uri=https://bob:***@host/x"

URIs are found and split as RFC 3986 does (section 3.2), not by a pattern of "likely" password
characters: after ``://`` (whatever the scheme) the authority runs to the first ``/``, ``?`` or
``#``, or white space; its userinfo is everything before the authority's last ``@``, and the user
ends at the userinfo's first ``:``. So every character RFC 3986 allows in userinfo (unreserved,
percent-encoded, the sub-delims ``! $ & ' ( ) * + , ; =`` and ``:``) is masked, and so are
characters a URI may not hold but a user may type (a stray ``@``, ``"``, ``\\``, ``{``, non-ASCII
letters). Quotes around a URI do not end it (``'``, legal in userinfo, could not), so a quoted URI
followed by text with an ``@`` and no space is masked up to that ``@``: more is hidden, nothing
leaks. A ``/``, ``?`` or ``#`` in a password must be percent-encoded (``%2F``, ``%3F``, ``%23``), as
for every URI client: unencoded, it ends the authority.
"""

from __future__ import annotations

import re
from typing import Any

# ends the authority: its delimiters (section 3.2) and white space (appendix C)
_AUTHORITY_END = re.compile(r"[/?#\s]")


def _authority_span(text: str, start: int) -> int:
    """End of the authority that starts at ``start``."""
    end = _AUTHORITY_END.search(text, start)
    return len(text) if end is None else end.start()


def _masked(userinfo: str) -> str:
    user, colon, _ = userinfo.partition(":")
    return f"{user}:***" if colon else "***"


def redact(text: str) -> str:
    """``text`` with the credentials of every URI in it masked."""
    out: list[str] = []
    pos = 0
    found = text.find("://")
    while found >= 0:
        start = found + 3
        end = _authority_span(text, start)
        at = text.rfind("@", start, end)
        if at >= 0:
            out += [text[pos:start], _masked(text[start:at])]
            pos = at
        found = text.find("://", start)  # an authority ends at the next "://"'s "/"
    out.append(text[pos:])
    return "".join(out)


def redact_values(obj: Any) -> Any:
    """``obj`` (nested dicts, lists, strings) with ``redact`` applied to every string."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {k: redact_values(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact_values(v) for v in obj)
    return obj
