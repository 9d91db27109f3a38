"""One process per cell at a time: an exclusive lock on ``<run dir>/run.lock`` while a run runs.

Two ``trustbench run`` (or sweep jobs) of the same cell started at once would both find no
FINISHED run, both create or resume its MLflow run, and both write the one checkpoint file. The
second start is refused instead (``CellBusy``, naming the process that holds the cell), before it
opens anything. The lock is ``flock(2)``: the kernel releases it when its holder exits, however it
exits (kill -9 included), so a crashed run never blocks its cell; the file itself stays (removing a
lock file races with the next locker) and holds the holder's host and pid for the message.

    with hold_cell(run_dir, "GRPO · s0"):
        ...   # train
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_FILE = "run.lock"


class CellBusy(RuntimeError):
    """The cell is already running in another process; the message names it."""


@contextmanager
def hold_cell(run_dir: Path, name: str) -> Iterator[None]:
    """Hold the cell's lock for the ``with`` block; ``CellBusy`` if another process holds it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CellBusy(
                f"cell {name!r} is already running ({_holder(path)}); this start is refused: wait for that run to "
                f"end (a finished cell is then skipped) or stop it (lock file {path})"
            ) from None
        holder = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()})
        try:
            os.ftruncate(fd, 0)
            os.write(fd, holder.encode())
        except OSError:  # a full disk: the lock holds all the same, the message names no process
            pass
        yield
    finally:
        os.close(fd)  # releases the lock


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text())
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["since"]))
        return f"process {info['pid']} on {info['host']} since {since}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"
