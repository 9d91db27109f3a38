"""A full disk during a run: one line that says which file system is full and what to free.

- ``note(message, *places)``: when a run's failure message says the disk is full (SQLite's "database or
  disk is full", ``ENOSPC``, ``EDQUOT``), the text ``runners.run`` appends to it: the file system of
  the fullest of ``places`` (the store's file, the run directory, the trustbench home), its free space,
  and what to free; a rerun then resumes the run from its last checkpoint.
- ``quiet_log_errors()``: a log handler whose file is on the full disk (Hydra's ``main.log`` beside the
  run) would print, for every record it cannot write, Python's "--- Logging error ---" with a traceback,
  the call stack and the record's arguments (an SQL statement with its parameters, thousands of
  characters). Such a record is dropped instead: the disk is reported once, by the run's last line.
  Other logging errors are printed as before.
"""

from __future__ import annotations

import errno
import logging
import os
import sys
from pathlib import Path

MARKERS = ("database or disk is full", "No space left on device", "Disk quota exceeded", "[Errno 28]", "[Errno 122]")
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def is_full(message: str) -> bool:
    return any(marker in message for marker in MARKERS)


def _path(place: str | Path) -> Path | None:
    text = str(place)
    if text.startswith("sqlite:///"):
        return Path(text[len("sqlite:///") :])
    return None if "://" in text else Path(text)


def _free(path: Path) -> tuple[int, Path] | None:
    """(free bytes, mount point) of the file system holding ``path`` (its nearest existing parent)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            st = os.statvfs(candidate)
            mount = candidate
            while not os.path.ismount(mount) and mount != mount.parent:
                mount = mount.parent
            return st.f_bavail * st.f_frsize, mount
    return None


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def note(message: str, *places: str | Path, home: Path | None = None) -> str:
    """'' unless ``message`` says the disk is full; else '; <which file system is full, what to free>'."""
    if not is_full(message):
        return ""
    found = [(free, path, mount) for path in filter(None, map(_path, places)) if (got := _free(path))
             for free, mount in [got]]  # fmt: skip
    if not found:
        return "; the disk is full: free space, then rerun (the run resumes from its last checkpoint)"
    free, path, mount = min(found, key=lambda f: f[0])
    runs = f" (e.g. checkpoints of finished runs, {home / 'runs'}/*/checkpoint*.pt)" if home is not None else ""
    return (
        f"; the file system of {path} ({mount}) is full, {_size(free)} free: free space there{runs}, "
        "then rerun the same command (the run resumes from its last checkpoint)"
    )


_default_handle_error = logging.Handler.handleError


def _handle_error(handler: logging.Handler, record: logging.LogRecord) -> None:
    err = sys.exc_info()[1]
    if isinstance(err, OSError) and err.errno in FULL_ERRNOS:
        return  # a log file on the full disk: the run's last line reports the disk
    _default_handle_error(handler, record)


def quiet_log_errors() -> None:
    """Drop log records that a handler cannot write for a full disk (module docstring); idempotent."""
    logging.Handler.handleError = _handle_error  # type: ignore[method-assign]


__all__ = ["is_full", "note", "quiet_log_errors"]
