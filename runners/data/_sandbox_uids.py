"""Per-run user ids for sandboxed programs when the trainer runs as root (threat model: sandbox.py).

Why: ``RLIMIT_NPROC`` counts the processes of a real uid, and a process may signal every process
of its uid, so programs sharing one uid (``nobody``) share one process limit and can kill each
other. Each run instead borrows a uid of its own from ``UID_BASE .. UID_BASE + SLOTS`` (a range
no account uses; ``/etc/passwd`` and ``/etc/subuid`` stop far below it), holding an exclusive
``flock`` on ``<lock dir>/<uid>`` so that no two runs on the machine, in any thread or trainer
process, hold the same uid at once. The lock file says "1" while the run is going on: a slot found
so marked (its holder died mid-run) is swept before reuse: every process of that uid is killed and
its files in the world-writable directories are removed. (A trainer that is not root has no
uid to lend: ``sweep_new_files`` clears what its Landlock-confined programs left in /dev/shm.)

    python -c "from runners.data._sandbox_uids import acquire, release; l = acquire(); print(l.uid); release(l)"
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

UID_BASE = 1_900_000_000
SLOTS = 1024
_KILL = shutil.which("kill", path="/usr/bin:/bin") or "/bin/kill"


@dataclass(frozen=True)
class UidLease:
    """One borrowed uid (also used as the gid); ``fd`` holds the lock."""

    uid: int
    fd: int


def _lock_dir() -> Path:
    """A directory only root can enter: /run/trustbench-sandbox, else one under the temp dir."""
    path = Path("/run/trustbench-sandbox") if os.access("/run", os.W_OK) else Path(tempfile.gettempdir())
    if path.name != "trustbench-sandbox":
        path = path / "trustbench-sandbox-uids"
    path.mkdir(mode=0o700, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise RuntimeError(
            f"sandbox uid lock directory {path} must be a directory owned by uid {os.geteuid()}, mode 700"
        )
    return path


def acquire() -> UidLease:
    """Lock a free uid of the range, sweeping it first if its last run did not finish."""
    lock_dir = _lock_dir()
    start = secrets.randbelow(SLOTS)
    for i in range(SLOTS):
        uid = UID_BASE + (start + i) % SLOTS
        fd = os.open(lock_dir / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if os.pread(fd, 1, 0):
            kill_processes(uid)
            sweep_files(uid)
        os.pwrite(fd, b"1", 0)
        return UidLease(uid, fd)
    raise RuntimeError(f"all {SLOTS} sandbox uids from {UID_BASE} are in use")


def release(lease: UidLease, *, clean: bool = True) -> None:
    """Unlock; ``clean=False`` leaves the slot marked for a sweep by its next holder."""
    if clean:
        os.ftruncate(lease.fd, 0)
    os.close(lease.fd)


def processes_of(uid: int) -> list[int]:
    """Live (non-zombie) processes whose real or saved uid is ``uid``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        real, _, saved, *_ = map(int, fields["Uid"].split())
        if uid in (real, saved) and not fields["State"].strip().startswith(("Z", "X")):
            found.append(int(name))
    return found


def kill_processes(uid: int, *, deadline_s: float = 10.0) -> None:
    """SIGKILL every process of ``uid``: ``kill -KILL -1`` run as that uid signals all of them at
    once (the kernel refuses a fork racing the signal), repeated until /proc shows none."""
    end = time.monotonic() + deadline_s
    while processes_of(uid):
        if time.monotonic() > end:
            raise RuntimeError(f"processes of sandbox uid {uid} survive SIGKILL: {processes_of(uid)}")
        subprocess.run(
            [_KILL, "-KILL", "-1"], user=uid, group=uid, extra_groups=[], env={}, capture_output=True, timeout=10
        )
        time.sleep(0.01)


def world_writable_dirs() -> list[str]:
    """Directories any user may create files in (besides its own), where a run without a
    private mount namespace can leave files: /tmp always, then the others that exist."""
    found = ["/tmp"]
    for path in ("/var/tmp", "/dev/shm", "/run/lock", "/var/lock", tempfile.gettempdir()):
        try:
            info = os.lstat(path)
        except OSError:
            continue
        real = os.path.realpath(path)
        if stat.S_ISDIR(info.st_mode) and info.st_mode & 0o002 and real not in found:
            found.append(real)
    return found


def sweep_files(uid: int, roots: list[str] | None = None, *, depth: int = 4) -> int:
    """Remove what ``uid`` created in ``roots`` (default: the world-writable directories),
    descending into world-writable subdirectories; returns how many entries were removed."""
    removed = 0
    for root in roots or world_writable_dirs():
        try:
            entries = list(os.scandir(root))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if info.st_uid == uid:
                if stat.S_ISDIR(info.st_mode):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                removed += 1
            elif stat.S_ISDIR(info.st_mode) and info.st_mode & 0o002 and depth > 0:
                removed += sweep_files(uid, [entry.path], depth=depth - 1)
    return removed


def listing(path: str) -> set[str]:
    try:
        return set(os.listdir(path))
    except OSError:
        return set()


def sweep_new_files(root: str, before: set[str]) -> int:
    """Remove the entries of ``root`` that this uid owns, that were not there before (``before``)
    and that no process of ours holds open or mapped: what a program running as our own uid
    (not root, confined by Landlock) left in /dev/shm. Returns how many were removed."""
    try:
        new = [
            e for e in os.scandir(root) if e.name not in before and e.stat(follow_symlinks=False).st_uid == os.getuid()
        ]
    except OSError:
        return 0
    if not new:
        return 0
    in_use = _paths_in_use(root.rstrip("/") + "/")  # after the listing: a file being created is open by then
    removed = 0
    for entry in new:
        if any(path == entry.path or path.startswith(entry.path + "/") for path in in_use):
            continue
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(entry.path, ignore_errors=True) if entry.is_dir(follow_symlinks=False) else os.unlink(
                entry.path
            )
        removed += 1
    return removed


def _paths_in_use(prefix: str) -> set[str]:
    """Paths under ``prefix`` open (/proc/*/fd) or mapped (/proc/*/maps) by a process we may inspect."""
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith(prefix):
                        found.add(target.removesuffix(" (deleted)"))
        with contextlib.suppress(OSError), open(f"/proc/{pid}/maps") as maps:
            found.update(
                line.split(None, 5)[5].rstrip("\n").removesuffix(" (deleted)") for line in maps if f" {prefix}" in line
            )
    return found
