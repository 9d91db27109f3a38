"""Run untrusted Python programs (code-task responses) in a separate, limited process.

Threat model: the program is hostile but runs within the rules of the kernel. It may fork, call
``setsid``, double-fork daemons, fork-bomb, write files anywhere it can, fill the disk, open
sockets, and signal any process it can see; it does not hold a kernel exploit. The sandbox must
keep (1) the trainer's machine and data intact, (2) one program's result independent of every
other program's, run before or at the same time, and (3) the result honest: a program is
judged on what it printed, within its limits. Every mechanism below is exercised by
tests/data/test_sandbox.py and tests/data/test_sandbox_escapes.py; ``isolation()`` reports which
of them are active on this machine.

Mechanisms (a ``python -I`` subprocess per run, started by ``_sandbox_boot.py``, which documents
its process tree; clean environment, no file of ours readable by the program):

- processes: a new pid namespace whose init reaps everything and exits when the program's main
  process ends; the kernel then SIGKILLs every process left in it (setsid and double-fork
  included) and ``run_python`` returns only after all are gone. Fallback when the kernel refuses
  namespaces: the supervisor is a child subreaper (orphans re-parent to it) and SIGKILLs every
  descendant it finds in /proc; as root, any process of the run's uid still alive is killed too.
- uid: as root, each run gets a uid of its own (``_sandbox_uids``), so ``RLIMIT_NPROC``
  (``max_processes``, a fork bomb's limit) and the right to send signals are per run: no program
  can exhaust another's process limit or kill another's processes. Not root, the program's nested
  user namespace plays that part for ``RLIMIT_NPROC`` (the kernel counts per user namespace).
- time: wall-clock limit enforced by the parent (SIGTERM to the supervisor, which kills the whole
  tree; SIGKILL after a grace period), 10 s by default as in TROLL (arXiv 2510.03817, appendix
  C.2), plus ``RLIMIT_CPU`` as a backstop.
- memory: ``RLIMIT_AS`` per process (default 1024 MiB); output: stdout/stderr go to files capped
  by ``RLIMIT_FSIZE`` (default 8 MiB), so a flood cannot exhaust the parent's memory.
- files: a new mount namespace in which every mount is read-only except one tmpfs of
  ``scratch_mb`` bytes and ``max_files`` inodes, bound over /tmp, /var/tmp, /dev/shm and
  /run/lock; the working directory (/tmp/work) lives in it. It vanishes with the namespace.
  Fallback: the working directory is a private directory deleted after the run and, as root,
  every file the run's uid left in the world-writable directories is removed (not bounded in
  number while the program runs: only by ``RLIMIT_FSIZE`` per file and the time limit).
- network: a new, empty network namespace (and a new IPC namespace: System V objects and
  POSIX message queues die with it); the in-process socket guard of ``_sandbox_boot.py`` on top
  (in the fallback the only one as root, Landlock's TCP rules too when not; WEAKER: ctypes bypass it).
- not root: a user namespace maps the trainer's uid to root of the namespaces above and the
  program enters a nested one (no power over their mounts, a process count of its own).
- not root and no private file system (namespaces refused, or ``namespaces="off"``): the
  program runs as the trainer's uid (a uid sweep would remove the trainer's files). Landlock
  (Linux >= 5.13, unprivileged) confines it: it may create, write and remove files only in its
  working directory (deleted after the run) and /dev/shm (POSIX semaphores: ``multiprocessing``),
  elsewhere EACCES; what it left in /dev/shm is removed (entries of our uid, new since the start,
  that no process of ours holds open or mapped: one the trainer or a concurrent program created
  there meanwhile and closed would go too); from ABI 4 no TCP bind or connect, from ABI 6 no
  signal outside the run. ``RLIMIT_NPROC`` is the uid's count at the start plus
  ``max_processes``: a fork bomb is bounded, but concurrent programs share the count (one can
  make another's ``fork`` fail). ``isolation()`` says what runs get (files, signals, process_limit).
- trainer death: the supervisor and init die with their parent (PR_SET_PDEATHSIG), which ends
  the namespace; in the fallback, a uid slot left marked busy is swept by its next holder.

Not used: cgroups. On our machines (Debian, root in a container) cgroup v2 delegates no ``pids``
or ``memory`` controller (they sit in v1 hierarchies), and the pid namespace plus a per-run
``RLIMIT_NPROC`` already give "kill everything" and "bounded fork bomb" without them.

Not protected: kernel exploits; the CPU and memory bandwidth other programs get (a busy program
slows a concurrent one down; time limits are wall-clock); the total memory of one run (up to
``max_processes`` times ``RLIMIT_AS`` plus its tmpfs); reading world-readable files of the
machine; unix sockets on the host file system that accept anyone (outside /tmp and friends).
In the fallback: the number of files while the program runs, other world-writable directories
than those listed above, System V IPC objects, seeing (not signalling) the host's processes,
and processes of a run whose trainer was SIGKILLed until their uid slot is reused. Not root, no
namespaces and no Landlock (a kernel before 5.13, or one without it): files written outside the
working directory stay, and the program can signal every process of the trainer's uid.

Modes: ``stdin`` feeds ``stdin`` to the program and returns its stdout; ``call`` calls a function
(``fn_name`` top-level or a ``Solution`` method) with JSON arguments and returns its JSON value.

    python -c "from runners.data.sandbox import run_python; print(run_python('print(input()[::-1])', stdin='abc'))"
"""

from __future__ import annotations

import functools
import json
import math
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runners.data import _sandbox_uids

_BOOT = Path(__file__).with_name("_sandbox_boot.py")
_CLEAN_PATH = "/usr/local/bin:/usr/bin:/bin"
_SHM = "/dev/shm"
_GRACE_S = 5.0  # after SIGTERM, how long the supervisor gets to kill the tree before it is SIGKILLed
STATUSES = ("ok", "error", "timeout", "memory", "output_limit")
NAMESPACES = ("auto", "require", "off")


class SandboxUnavailable(RuntimeError):
    """The sandbox itself could not start (e.g. ``namespaces="require"`` where they are refused)."""


@dataclass(frozen=True)
class SandboxConfig:
    """Limits of one sandboxed run."""

    # wall-clock limit in seconds (TROLL, arXiv 2510.03817, appendix C.2: 10 s per test case)
    timeout_s: float = 10.0
    # address-space limit of each process of the program in MiB (RLIMIT_AS)
    memory_mb: int = 1024
    # cap on each of stdout and stderr in bytes (RLIMIT_FSIZE: also the cap of any file it writes)
    max_output_bytes: int = 8 << 20
    # bytes the program may store in its private /tmp, /var/tmp, /dev/shm and working directory together
    scratch_mb: int = 64
    # files and directories it may create there (tmpfs inodes)
    max_files: int = 1024
    # processes and threads of one run at once (RLIMIT_NPROC of its own uid or user namespace; not
    # root and without namespaces: this many more than the trainer's uid has at the start)
    max_processes: int = 64
    # interpreter for the program; None picks sys.executable or /usr/bin/python3 (see _pick_python)
    python: str | None = None
    # "auto": namespaces when the kernel allows them, else the fallback; "require": SandboxUnavailable
    # without them; "off": the fallback (to test it)
    namespaces: str = "auto"
    # in-process socket guard on top of the network namespace; False only to test the namespace alone
    socket_guard: bool = True


@dataclass
class RunResult:
    """Outcome of one run; ``status`` is one of ``STATUSES``."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    # call mode: the function's return value (decoded JSON); None otherwise
    value: Any = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@functools.cache
def _pick_python(requested: str | None, namespaces: str) -> tuple[str, dict[str, Any]]:
    """An interpreter that can start and import the standard library as the sandbox user, and
    the isolation its probe run got."""
    candidates = [requested] if requested else [sys.executable, "/usr/bin/python3"]
    config = SandboxConfig(timeout_s=20, namespaces=namespaces)
    for python in candidates:
        if not python or not os.path.exists(python):
            continue
        probe = _run(python, "import json, collections, heapq, math\nprint(6*7)", "", "stdin", config, {})
        if probe.status == "ok" and probe.stdout.strip() == "42":
            return python, probe.info
    raise RuntimeError(
        f"no interpreter among {candidates} can run as the sandbox user; "
        "pass SandboxConfig(python=...) with an interpreter readable by every user"
    )


def isolation(config: SandboxConfig | None = None) -> dict[str, Any]:
    """What isolation runs get on this machine (logged once by the trainer, checked by tests)."""
    config = config or SandboxConfig()
    python, info = _pick_python(config.python, config.namespaces)
    return {
        **info,
        "uid": f"per run, from {_sandbox_uids.UID_BASE}" if os.geteuid() == 0 else os.getuid(),
        "python": python,
        "timeout_s": config.timeout_s,
        "memory_mb": config.memory_mb,
        "max_processes": config.max_processes,
    }


def run_python(
    code: str,
    *,
    stdin: str = "",
    fn_name: str | None = None,
    args: list[Any] | None = None,
    config: SandboxConfig | None = None,
) -> RunResult:
    """Run ``code`` in the sandbox: stdin mode, or call mode when ``fn_name`` is given.

    Never raises for anything the program does (crash, timeout, memory, output flood, leftover
    processes or files); raises ``SandboxUnavailable`` (a ``RuntimeError``) only when the
    sandbox itself cannot start (e.g. ``namespaces="require"`` on a machine that refuses them).
    """
    config = config or SandboxConfig()
    if config.namespaces not in NAMESPACES:
        raise ValueError(f"sandbox namespaces must be one of {NAMESPACES}, got {config.namespaces!r}")
    python, _ = _pick_python(config.python, config.namespaces)
    extra = {"fn_name": fn_name, "args": list(args or [])} if fn_name else {}
    return _run(python, code, stdin, "call" if fn_name else "stdin", config, extra)


def _limits(config: SandboxConfig, per_run_uid: bool) -> dict[str, Any]:
    cpu = int(math.ceil(config.timeout_s)) + 1
    limits: dict[str, Any] = {
        "RLIMIT_AS": config.memory_mb << 20,
        "RLIMIT_CPU": [cpu, cpu + 1],
        "RLIMIT_FSIZE": config.max_output_bytes,
        "RLIMIT_CORE": 0,
        "RLIMIT_NOFILE": 256,
    }
    if per_run_uid:  # NPROC counts per real uid: only meaningful for a uid of the run's own
        limits["RLIMIT_NPROC"] = config.max_processes
    return limits


@functools.cache
def _shared_dirs() -> tuple[str, ...]:
    """World-writable directories to cover with the private tmpfs; the one holding our control
    directories last (binding over it hides them)."""
    tmp = os.path.realpath(tempfile.gettempdir())
    dirs = _sandbox_uids.world_writable_dirs()
    return tuple(sorted(dirs, key=lambda d: (tmp + "/").startswith(d.rstrip("/") + "/")))


def _run(python: str, code: str, stdin: str, mode: str, config: SandboxConfig, extra: dict) -> RunResult:
    lease = _sandbox_uids.acquire() if os.geteuid() == 0 else None
    clean = False
    try:
        result = _run_as(lease.uid if lease else None, python, code, stdin, mode, config, extra)
    except SandboxUnavailable:
        clean = True  # raised after the run's processes and files were dealt with
        raise
    else:
        clean = True
        return result
    finally:
        if lease is not None:
            _sandbox_uids.release(lease, clean=clean)


def _prepare(control: Path, code: str, stdin: str, uid: int | None) -> None:
    """The control directory: our files (root only), fs/ (tmpfs mount point), work/ (the
    program's working directory in the fallback, owned by its uid)."""
    os.chmod(control, 0o711)  # the program may pass through to work/, not list it
    for name, text in (
        ("main.py", code),
        ("stdin.txt", stdin),
        ("stdout.txt", ""),
        ("stderr.txt", ""),
        ("report.json", ""),
    ):
        fd = os.open(control / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with open(fd, "w", encoding="utf-8") as f:
            f.write(text)
    (control / "fs").mkdir()
    (control / "work").mkdir(mode=0o700)
    if uid is not None:
        os.chown(control / "work", uid, uid)


def _run_as(
    uid: int | None, python: str, code: str, stdin: str, mode: str, config: SandboxConfig, extra: dict
) -> RunResult:
    nonce = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="trustbench-sandbox-") as control_dir:
        control = Path(control_dir)
        _prepare(control, code, stdin, uid)
        cfg = {
            "mode": mode,
            "control": str(control),
            "nonce": nonce,
            "limits": _limits(config, uid is not None),
            "uid": uid,
            "gid": uid,
            "namespaces": config.namespaces,
            "scratch_bytes": config.scratch_mb << 20,
            "max_files": config.max_files,
            "max_processes": config.max_processes,
            "shared_dirs": list(_shared_dirs()),
            "socket_guard": config.socket_guard,
            **extra,
        }
        cmd = [python, "-I", "-c", _BOOT.read_text(encoding="utf-8"), json.dumps(cfg)]
        env = {"PATH": _CLEAN_PATH, "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8", "OMP_NUM_THREADS": "1"}
        out_path, err_path = control / "stdout.txt", control / "stderr.txt"
        shm_before = _sandbox_uids.listing(_SHM) if uid is None else set()  # what a program as our uid may leave there
        start = time.monotonic()
        with open(control / "stdin.txt", "rb") as fin, open(out_path, "wb") as fout, open(err_path, "wb") as ferr:
            proc = subprocess.Popen(
                cmd, stdin=fin, stdout=fout, stderr=ferr, cwd="/", env=env, start_new_session=True, close_fds=True
            )
            timed_out = _wait(proc, config.timeout_s)
        wall = time.monotonic() - start
        report = _read_report(control / "report.json")
        _clean_up(uid, report, shm_before)
        if report.get("fatal"):
            raise SandboxUnavailable(f"the sandbox could not start: {report['fatal']} (see runners/data/sandbox.py)")
        stdout = _read_capped(out_path, config.max_output_bytes)
        stderr = _read_capped(err_path, config.max_output_bytes)
        output_full = max(out_path.stat().st_size, err_path.stat().st_size) >= config.max_output_bytes
    returncode = report.get("returncode", proc.returncode)
    status = _classify(returncode, timed_out, output_full, stderr)
    value = None
    if mode == "call" and status == "ok":
        stdout, value, found = _split_call_result(stdout, nonce)
        if not found:
            status = "error"
    names = report.get("namespaces", [])
    landlock = report.get("landlock", 0)
    info = {
        "network": "namespace" if "net" in names else "landlock" if landlock >= 4 else "socket_guard",
        "namespaces": names,
        "processes": "pid_namespace" if "pid" in names else "subreaper",
        # RLIMIT_NPROC of a uid or user namespace of the run's own, else shared with the trainer's uid
        "process_limit": "per_run" if uid is not None or "user" in names else "shared",
        # who the program may signal: its own uid's / pid namespace's processes, its Landlock domain, any of ours
        "signals": "own_uid"
        if uid is not None
        else "pid_namespace"
        if "pid" in names
        else "landlock"
        if landlock >= 6
        else "trainer_uid",  # fmt: skip
        "files": "private_tmpfs"
        if report.get("private_fs")
        else "uid_sweep"
        if uid is not None
        else "landlock"
        if landlock
        else "workdir_only",  # fmt: skip
        "landlock": landlock,
        "uid": uid if uid is not None else os.getuid(),
    }
    return RunResult(status, returncode, stdout, stderr, wall, value, info)


def _clean_up(uid: int | None, report: dict[str, Any], shm_before: set[str]) -> None:
    """What the supervisor could not: the processes of a run's uid (the supervisor was killed), its
    files in the world-writable directories (no private tmpfs), or, a program as our own uid
    under Landlock, what it left in /dev/shm."""
    if uid is not None and "returncode" not in report:
        _sandbox_uids.kill_processes(uid)
    if uid is not None and not report.get("private_fs"):
        _sandbox_uids.sweep_files(uid, list(_shared_dirs()))
    if uid is None and report.get("landlock"):
        _sandbox_uids.sweep_new_files(_SHM, shm_before)


def _wait(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Wait for the supervisor; at the limit ask it to kill the tree, SIGKILL it after a grace
    period. True if the time limit was hit."""
    try:
        proc.wait(timeout=timeout_s)
        return False
    except subprocess.TimeoutExpired:
        pass
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=_GRACE_S)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
    return True


def _read_report(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, json.JSONDecodeError):
        return {}


def _read_capped(path: Path, limit: int) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", errors="replace")


def _classify(returncode: int | None, timed_out: bool, output_full: bool, stderr: str) -> str:
    if timed_out or returncode == -signal.SIGXCPU:
        return "timeout"
    if output_full or returncode == -signal.SIGXFSZ:
        return "output_limit"
    if returncode == 0:
        return "ok"
    if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
        return "memory"
    return "error"


def _split_call_result(stdout: str, nonce: str) -> tuple[str, Any, bool]:
    head, sep, tail = stdout.rpartition("\n" + nonce)
    if not sep:
        return stdout, None, False
    try:
        return head, json.loads(tail.strip()), True
    except json.JSONDecodeError:
        return head, None, False
