"""A limit on the resident memory of a training run (``launcher.memory_limit_gb``), so that one cell
cannot take the machine down.

``runners.run`` trains inside ``MemoryGuard``: a thread reads the resident memory of the run's process
and of its child processes (verl's trainer and workers) from ``/proc`` every ``INTERVAL_S`` seconds.
When it passes the limit, the thread raises ``MemoryLimitExceeded`` in the thread that trains, at its
next Python instruction (a trainer returns to Python between tensor operations; verl's process is
watched from a Python loop): the run ends FAILED, as any failure does, with a one-line reason naming
the limit, the measured memory and the key to raise; its last checkpoint is untouched (checkpoints are
written atomically), so a rerun resumes from it. Should the training thread not stop within
``GRACE_S`` while still above the limit (stuck in one long native call), the process records the
failure in its status marker and exits at once, before the kernel's out-of-memory killer would end it
without a word.

The limit, in GiB: ``launcher.memory_limit_gb``; null (the default) = ``MARGIN`` of the memory the cell
may use, the least of: the memory available when it starts (plus what the process already holds), the
cgroup's memory limit (a container, a Slurm job's cgroup: where Slurm enforces ``--mem`` it does so
there; a request Slurm does not enforce is not a limit this guard adds), and, in a local sweep
running N cells at once (``launcher.parallel``), the share the sweep gave it (1/N of its own figure,
``SHARE_ENV``); 0 = no limit. An address-space limit (``RLIMIT_AS``) is not used: CUDA reserves large
virtual ranges it never touches.

Resident memory: of a process alone, its RSS; with child processes, the sum of their proportional set
sizes (``/proc/<pid>/smaps_rollup``: a page shared by k processes counts 1/k in each), so that shared
libraries and shared memory count once. Reading ``smaps_rollup`` walks the process's page tables: about
12 ms of kernel time for a process that imported torch, so a verl run on CPU (18 such processes below
``trustbench run``) spent a quarter of a core on it at ``INTERVAL_S``. Each check therefore sums the RSS
first (``/proc/<pid>/statm``, microseconds), an upper bound of the PSS sum, and reads the proportional
sizes only when that bound passes the limit.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

KEY = "launcher.memory_limit_gb"
SHARE_ENV = "TRUSTBENCH_MEMORY_SHARE_BYTES"
MARGIN = 0.9
INTERVAL_S = 0.25
GRACE_S = 30.0
GIB = 2**30
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_UNLIMITED = 2**60  # cgroup v1 writes "no limit" as a number near 2**63


class MemoryLimitExceeded(BaseException):
    """The run's resident memory passed its limit. A ``BaseException``, as ``KeyboardInterrupt``: a
    library's ``except Exception`` around the point where it arrives does not swallow it."""

    message = "resident memory passed its limit"

    def __init__(self, *args: Any) -> None:
        super().__init__(*(args or (self.message,)))


def check_config(cfg: Any) -> None:
    """``launcher.memory_limit_gb`` is null or >= 0 (before anything is created)."""
    from runners.config import ConfigError

    value = cfg.launcher.get("memory_limit_gb")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value < 0):
        raise ConfigError(KEY, f"must be null (the default limit), 0 (no limit) or a size in GiB (got {value!r})")


# -- measuring ----------------------------------------------------------------------------------------
def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:  # the process ended, or no such file on this system
        return None


def _rss(pid: int) -> int:
    text = _read(f"/proc/{pid}/statm")
    return int(text.split()[1]) * _PAGE if text else 0


def _pss(pid: int) -> int:
    text = _read(f"/proc/{pid}/smaps_rollup")
    for line in (text or "").splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return _rss(pid)  # no smaps_rollup (kernel < 4.14)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (``/proc/<pid>/task/<tid>/children``; psutil where that is missing)."""
    if not os.path.exists(f"/proc/{pid}/task/{pid}/children"):
        try:
            import psutil

            return [p.pid for p in psutil.Process(pid).children(recursive=True)]
        except Exception:  # noqa: BLE001 - no psutil, or the process ended: none counted
            return []
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            for child in (_read(f"/proc/{parent}/task/{tid}/children") or "").split():
                found.append(int(child))
                todo.append(int(child))
    return found


def rss_bound(pid: int | None = None) -> int:
    """The RSS of ``pid`` (this process) and every descendant, summed: ``resident_bytes`` or more (a
    process's PSS is at most its RSS), at a fraction of its cost (module docstring)."""
    pid = os.getpid() if pid is None else pid
    return sum(_rss(p) for p in (pid, *descendants(pid)))


def resident_bytes(pid: int | None = None) -> int:
    """Resident memory of ``pid`` (this process) and its child processes (module docstring)."""
    pid = os.getpid() if pid is None else pid
    children = descendants(pid)
    if not children:
        return _rss(pid)
    return sum(_pss(p) for p in (pid, *children))


# -- the default limit ----------------------------------------------------------------------------
def _meminfo(field: str) -> int | None:
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return None


def cgroup_limit() -> int | None:
    """The memory limit of this process's cgroup (v2 ``memory.max``, v1 ``memory.limit_in_bytes``), or None."""
    candidates = []
    for line in (_read("/proc/self/cgroup") or "").splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            candidates += [f"/sys/fs/cgroup{path}/memory.max", "/sys/fs/cgroup/memory.max"]
        elif "memory" in controllers.split(","):
            base = "/sys/fs/cgroup/memory"
            candidates += [f"{base}{path}/memory.limit_in_bytes", f"{base}/memory.limit_in_bytes"]
    for path in candidates:
        text = (_read(path) or "").strip()
        if text.isdigit():
            return int(text) if int(text) < _UNLIMITED else None
        if text == "max":
            return None
    return None


def cell_memory(*, share: bool = True) -> tuple[int, str]:
    """(bytes, what they are): the memory this cell may use (module docstring)."""
    available = _meminfo("MemAvailable") or os.sysconf("SC_PHYS_PAGES") * _PAGE
    found = [(available + _rss(os.getpid()), "the memory available at start")]
    limit = cgroup_limit()
    if limit:
        found.append((limit, "the cgroup's memory limit"))
    if share and (os.environ.get(SHARE_ENV) or "").isdigit():
        found.append((int(os.environ[SHARE_ENV]), "this cell's share of the sweep's memory"))
    return min(found)


def share_bytes(parallel: int) -> int:
    """What each of ``parallel`` cells run at once on this machine may use (``SHARE_ENV``)."""
    return cell_memory(share=False)[0] // max(1, parallel)


def resolve_limit(value: float | None) -> tuple[int | None, str]:
    """(bytes or None for no limit, how the limit was set) from ``launcher.memory_limit_gb``."""
    if value is None:
        size, what = cell_memory()
        return int(size * MARGIN), f"the default, {MARGIN:.0%} of {what} ({size / GIB:,.1f} GiB)"
    if value == 0:
        return None, f"{KEY}=0"
    return int(value * GIB), f"{KEY}={value:g}"


# -- the guard ---------------------------------------------------------------------------------------
def _raise_in(thread_id: int, exc: type[BaseException] | None) -> None:
    """Raise ``exc`` in thread ``thread_id`` at its next Python instruction (None: cancel a pending one)."""
    arg = ctypes.py_object(exc) if exc is not None else ctypes.c_void_p(0)
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), arg)


class MemoryGuard:
    """``with MemoryGuard(limit, how): train()`` (module docstring); ``limit=None``: no watch.

    ``on_hard_stop(message)`` records the failure before the process exits when the training thread
    has not stopped ``grace_s`` after the limit was passed. ``checks`` counts the checks made."""

    def __init__(
        self,
        limit: int | None,
        how: str,
        *,
        on_hard_stop: Callable[[str], None] | None = None,
        pid: int | None = None,
        interval_s: float = INTERVAL_S,
        grace_s: float = GRACE_S,
    ) -> None:
        self.limit, self.how, self.on_hard_stop = limit, how, on_hard_stop
        self.pid = os.getpid() if pid is None else pid
        self.interval_s, self.grace_s = interval_s, grace_s
        self.checks = 0
        self.fired: type[MemoryLimitExceeded] | None = None
        self._lock, self._done = threading.Lock(), threading.Event()
        self._thread: threading.Thread | None = None
        self._target = 0

    def message(self, used: int) -> str:
        assert self.limit is not None
        return (
            f"resident memory {used / GIB:,.2f} GiB passed the limit of {self.limit / GIB:,.2f} GiB ({self.how}); "
            f"stopped before the machine ran out of memory, the last checkpoint kept. "
            f"Raise {KEY} (0 = no limit) or make the step smaller"
        )

    def __enter__(self) -> MemoryGuard:
        if self.limit is not None:
            self._target = threading.get_ident()
            self._thread = threading.Thread(target=self._watch, name="trustbench-memory-guard", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        with self._lock:
            self._done.set()
            fired = self.fired
            if fired is not None and not isinstance(exc, fired):
                _raise_in(self._target, None)  # not delivered yet: nothing is pending after this block
        if self._thread is not None:
            self._thread.join()
        if fired is not None and exc is not None and not isinstance(exc, MemoryLimitExceeded | KeyboardInterrupt):
            raise fired() from exc  # another error on the way out of memory (e.g. an allocation failed): say why

    def _watch(self) -> None:
        since = None
        while not self._done.wait(self.interval_s):
            self.checks += 1
            if rss_bound(self.pid) <= self.limit:  # so is the exact figure: no smaps_rollup read
                continue
            used = resident_bytes(self.pid)
            if used <= self.limit:
                continue
            with self._lock:
                if self._done.is_set():
                    return
                if self.fired is None:
                    self.fired = type("MemoryLimitExceeded", (MemoryLimitExceeded,), {"message": self.message(used)})
                    since = time.monotonic()
                    _raise_in(self._target, self.fired)
                elif time.monotonic() - since > self.grace_s:
                    self._hard_stop(used)

    def _hard_stop(self, used: int) -> None:
        message = f"{self.message(used)} (the run did not stop within {self.grace_s:g} s: ended at once)"
        if self.on_hard_stop is not None:
            try:
                self.on_hard_stop(message)
            except Exception:  # noqa: BLE001 - ending the process matters more than the record
                pass
        print(f"[trustbench] {message}", file=sys.stderr, flush=True)
        os._exit(1)


def guard_for(cfg: Any, on_hard_stop: Callable[[str], None] | None = None) -> MemoryGuard:
    """The guard of a run of ``cfg`` (``launcher.memory_limit_gb``)."""
    limit, how = resolve_limit(cfg.launcher.get("memory_limit_gb"))
    return MemoryGuard(limit, how, on_hard_stop=on_hard_stop)


__all__ = ["MemoryGuard", "MemoryLimitExceeded", "check_config", "guard_for", "resident_bytes", "share_bytes"]


def _main() -> None:  # pragma: no cover - ``python -m runners.memory_guard``: what a run here would get
    limit, how = resolve_limit(None)
    print(f"default limit {limit / GIB:,.2f} GiB ({how}); this process {resident_bytes() / GIB:,.2f} GiB")


if __name__ == "__main__":  # pragma: no cover
    _main()
