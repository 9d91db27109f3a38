"""A cell's status marker, ``<run dir>/status.json``: what ``trustbench sweep`` reads after Hydra returns.

Hydra and submitit report a failed job as completed, so every way a run ends is written here
(``runners.run``): RUNNING, FINISHED, FAILED (reason and traceback), PREEMPTED, CONFIG_ERROR, and
the sweep's SUBMITTED / REQUEUED. The marker is replaced atomically (written to ``status.json.tmp``,
renamed). When the run directory cannot take a new file (permissions, an immutable directory) but
the marker itself is writable, it is rewritten in place, so that the marker never keeps saying
RUNNING after MLflow heard the run ended; a write that fails leaves no temporary file behind.
"""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path
from typing import Any

STATUS_FILE = "status.json"
# the directory refuses a new entry, an existing file may still be writable
_NO_NEW_FILE = (errno.EACCES, errno.EPERM)


def write_status(run_dir: Path, status: str, **extra: Any) -> None:
    """Replace the marker with ``{"status": status, "time": now, **extra}``; raises ``OSError`` if it
    cannot be written at all."""
    text = json.dumps({"status": status, "time": time.time(), **extra}, indent=2, default=str)
    target, tmp = run_dir / STATUS_FILE, run_dir / (STATUS_FILE + ".tmp")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, target)
    except OSError as err:
        _remove(tmp)
        if err.errno not in _NO_NEW_FILE or not target.is_file():
            raise
        with open(target, "r+") as fh:  # in place: the directory refuses new entries, the file may not
            fh.write(text)
            fh.truncate()


def read_status(run_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((run_dir / STATUS_FILE).read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None


def _remove(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass
