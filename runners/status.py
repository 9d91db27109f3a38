"""A cell's status marker, ``<run dir>/status.json``: what ``trustbench sweep`` reads after Hydra returns.

Hydra and submitit report a failed job as completed, so every way a run ends is written here
(``runners.run``): RUNNING, FINISHED, FAILED (reason and traceback), PREEMPTED, CONFIG_ERROR, and
the sweep's SUBMITTED / REQUEUED. The marker is replaced atomically (written to ``status.json.tmp``,
renamed). When the run directory cannot take a new file (permissions, an immutable directory, a
full disk) but the marker itself is writable, it is rewritten in place, so that the marker never
keeps saying RUNNING after the run ended: on a full disk the bytes the file already holds are
reused (without the traceback if the whole text does not fit; the old text is put back if even
that fails). A write that fails leaves no temporary file behind.
"""

from __future__ import annotations

import errno
import json
import os
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

STATUS_FILE = "status.json"
# the directory refuses a new entry (or the disk has no room for one): the file may still be writable
_NO_NEW_FILE = (errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT)


def write_status(run_dir: Path, status: str, **extra: Any) -> None:
    """Replace the marker with ``{"status": status, "time": now, **extra}``; raises ``OSError`` if it
    cannot be written at all."""
    marker = {"status": status, "time": time.time(), **extra}
    text = json.dumps(marker, indent=2, default=str)
    target, tmp = run_dir / STATUS_FILE, run_dir / (STATUS_FILE + ".tmp")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, target)
    except OSError as err:
        _remove(tmp)
        if err.errno not in _NO_NEW_FILE or not target.is_file():
            raise
        short = json.dumps({k: v for k, v in marker.items() if k != "traceback"}, indent=2, default=str)
        _rewrite_in_place(target, [text, short] if short != text else [text], err)


def _rewrite_in_place(target: Path, texts: list[str], cause: OSError) -> None:
    """Overwrite ``target`` with the first of ``texts`` that can be written; else put the old text
    back and raise ``cause``."""
    fd = os.open(target, os.O_RDWR)
    try:
        old = os.pread(fd, 1 << 20, 0)
        for data in (t.encode() for t in texts):
            try:
                _overwrite(fd, data)
                return
            except OSError:
                continue
        with suppress(OSError):
            _overwrite(fd, old)
    finally:
        os.close(fd)
    raise cause


def _overwrite(fd: int, data: bytes) -> None:
    if os.pwrite(fd, data, 0) != len(data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    os.ftruncate(fd, len(data))
    os.fsync(fd)


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
