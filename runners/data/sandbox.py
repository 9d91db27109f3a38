"""Run untrusted Python programs (code-task responses) in a separate, limited process.

Design: never in the trainer's process. Each run is a fresh ``python -I`` subprocess in its own
session, started with a clean environment in a private temporary working directory that is
deleted afterwards. Isolation, strongest available first (``isolation()`` reports what is active):

- time: wall-clock limit enforced by the parent (the whole process group is SIGKILLed; 10 s by
  default, as troll.txt appendix C.2) plus ``RLIMIT_CPU`` as a backstop;
- memory: ``RLIMIT_AS`` (address space, default 1024 MiB); output: stdout/stderr go to files capped
  by ``RLIMIT_FSIZE`` (default 8 MiB), so a flood cannot exhaust the parent's memory;
- network: a new, empty network namespace with ``unshare -n`` when running as root, or
  ``unshare -rn`` (user namespace) when unprivileged namespaces are allowed; otherwise only the
  in-process socket guard of ``_sandbox_boot.py`` (WEAKER: a program using ctypes or a
  subprocess can bypass it; run the trainer as root or enable user namespaces for real isolation);
- privileges: as root, the child drops to ``nobody`` (uid/gid 65534) after entering the
  namespace, with ``RLIMIT_NPROC`` against fork bombs. The interpreter must be readable by that
  user: ``sys.executable`` is used when it is, else the system ``/usr/bin/python3``.

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
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NOBODY = 65534
_BOOT = Path(__file__).with_name("_sandbox_boot.py")
_CLEAN_PATH = "/usr/local/bin:/usr/bin:/bin"
STATUSES = ("ok", "error", "timeout", "memory", "output_limit")


@dataclass(frozen=True)
class SandboxConfig:
    """Limits of one sandboxed run."""

    # wall-clock limit in seconds (troll.txt C.2: 10 s per test case)
    timeout_s: float = 10.0
    # address-space limit of the child in MiB (RLIMIT_AS)
    memory_mb: int = 1024
    # cap on each of stdout and stderr in bytes (RLIMIT_FSIZE on the capture files)
    max_output_bytes: int = 8 << 20
    # interpreter for the program; None picks sys.executable or /usr/bin/python3 (see module doc)
    python: str | None = None
    # "auto" (namespace if available, else guard), "namespace" (require it), "guard" (socket guard only)
    network: str = "auto"
    # in-process socket guard on top of the namespace; False only to test the namespace alone
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
def _namespace_prefix() -> tuple[str, ...] | None:
    """The ``unshare`` command that gives the child an empty network namespace, or None."""
    unshare = shutil.which("unshare", path=_CLEAN_PATH)
    if unshare is None:
        return None
    candidates = [(unshare, "-n")] if os.geteuid() == 0 else []
    candidates.append((unshare, "-r", "-n"))
    for prefix in candidates:
        try:
            probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=10, env={"PATH": _CLEAN_PATH})
        except (OSError, subprocess.SubprocessError):
            continue
        if probe.returncode == 0:
            return prefix
    return None


def _drop_ids() -> tuple[int, int] | None:
    """(uid, gid) to drop to: ``nobody`` when the parent is root, else None (already unprivileged)."""
    return (NOBODY, NOBODY) if os.geteuid() == 0 else None


@functools.cache
def _pick_python(requested: str | None) -> str:
    """An interpreter that can start and import the standard library as the sandbox user."""
    candidates = [requested] if requested else [sys.executable, "/usr/bin/python3"]
    for python in candidates:
        if not python or not os.path.exists(python):
            continue
        result = _run(
            python,
            "import json, collections, heapq, math\nprint(6*7)",
            stdin="",
            mode="stdin",
            config=SandboxConfig(timeout_s=20),
            extra={},
        )
        if result.status == "ok" and result.stdout.strip() == "42":
            return python
    raise RuntimeError(
        f"no interpreter among {candidates} can run as the sandbox user (uid {_drop_ids()}); "
        "pass SandboxConfig(python=...) with an interpreter readable by that user"
    )


def isolation(config: SandboxConfig | None = None) -> dict[str, Any]:
    """What isolation runs get on this machine (logged once by the trainer, checked by tests)."""
    config = config or SandboxConfig()
    prefix = _namespace_prefix() if config.network != "guard" else None
    return {
        "network": "namespace" if prefix else "socket_guard",
        "namespace_command": " ".join(prefix) if prefix else None,
        "uid": (_drop_ids() or (os.getuid(), None))[0],
        "python": _pick_python(config.python),
        "timeout_s": config.timeout_s,
        "memory_mb": config.memory_mb,
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

    Never raises for anything the program does (crash, timeout, memory, output flood); raises
    ``RuntimeError`` only when the sandbox itself cannot start (e.g. ``network="namespace"`` on a
    machine without namespaces).
    """
    config = config or SandboxConfig()
    if config.network not in ("auto", "namespace", "guard"):
        raise ValueError(f"sandbox network must be 'auto', 'namespace' or 'guard', got {config.network!r}")
    if config.network == "namespace" and _namespace_prefix() is None:
        raise RuntimeError("sandbox network='namespace' but `unshare -n` / `unshare -rn` is not permitted here")
    python = _pick_python(config.python)
    extra = {"fn_name": fn_name, "args": list(args or [])} if fn_name else {}
    return _run(python, code, stdin=stdin, mode="call" if fn_name else "stdin", config=config, extra=extra)


def _limits(config: SandboxConfig, drop: tuple[int, int] | None) -> dict[str, Any]:
    cpu = int(math.ceil(config.timeout_s)) + 1
    limits: dict[str, Any] = {
        "RLIMIT_AS": config.memory_mb << 20,
        "RLIMIT_CPU": [cpu, cpu + 1],
        "RLIMIT_FSIZE": config.max_output_bytes,
        "RLIMIT_CORE": 0,
        "RLIMIT_NOFILE": 256,
    }
    if drop is not None:  # NPROC counts per real uid: only meaningful for the dedicated sandbox user
        limits["RLIMIT_NPROC"] = 64
    return limits


def _run(python: str, code: str, *, stdin: str, mode: str, config: SandboxConfig, extra: dict) -> RunResult:
    drop = _drop_ids()
    prefix = _namespace_prefix() if config.network != "guard" else None
    nonce = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="trustbench-sandbox-") as work:
        workdir = Path(work)
        program = workdir / "main.py"
        program.write_text(code, encoding="utf-8")
        (workdir / "stdin.txt").write_text(stdin, encoding="utf-8")
        if drop is not None:
            os.chown(workdir, *drop)
            os.chown(program, *drop)
        cfg = {
            "mode": mode,
            "program": str(program),
            "nonce": nonce,
            "limits": _limits(config, drop),
            "drop_uid": drop[0] if drop else None,
            "drop_gid": drop[1] if drop else None,
            "socket_guard": config.socket_guard,
            **extra,
        }
        cmd = [*(prefix or ()), python, "-I", "-c", _BOOT.read_text(encoding="utf-8"), json.dumps(cfg)]
        env = {
            "PATH": _CLEAN_PATH,
            "LANG": "C.UTF-8",
            "HOME": str(workdir),
            "TMPDIR": str(workdir),
            "PYTHONIOENCODING": "utf-8",
            "OMP_NUM_THREADS": "1",
        }
        out_path, err_path = workdir / "stdout.txt", workdir / "stderr.txt"
        start = time.monotonic()
        timed_out = False
        with open(workdir / "stdin.txt", "rb") as fin, open(out_path, "wb") as fout, open(err_path, "wb") as ferr:
            proc = subprocess.Popen(
                cmd, stdin=fin, stdout=fout, stderr=ferr, cwd=workdir, env=env, start_new_session=True, close_fds=True
            )
            try:
                proc.wait(timeout=config.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc.pid)
                proc.wait()
        wall = time.monotonic() - start
        stdout = _read_capped(out_path, config.max_output_bytes)
        stderr = _read_capped(err_path, config.max_output_bytes)
        output_full = max(out_path.stat().st_size, err_path.stat().st_size) >= config.max_output_bytes
    status = _classify(proc.returncode, timed_out, output_full, stderr)
    value = None
    if mode == "call" and status == "ok":
        stdout, value, found = _split_call_result(stdout, nonce)
        if not found:
            status = "error"
    info = {"network": "namespace" if prefix else "socket_guard", "python": python}
    return RunResult(status, proc.returncode, stdout, stderr, wall, value, info)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


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
