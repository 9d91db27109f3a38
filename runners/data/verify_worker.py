"""math-verify equivalence under a timeout that works in any thread and under any ``__main__``.

Design: math-verify's own timeout uses ``signal.alarm``, which works only in the main thread. In
the main thread it is used directly (no process hop, ~2 ms a comparison). From any other thread
(reward worker pools, verl reward managers) the comparison goes to one long-lived helper process
(``_verify_serve.py`` run with ``python -c``, JSON lines over pipes); when a reply does not arrive
within ``timeout_s`` the helper is killed and the comparison counts as unequal, and the next call
starts a fresh helper. A plain subprocess rather than ``multiprocessing``: spawn/forkserver
workers re-import the parent's ``__main__``, which fails (and respawns forever) for ``python -c``,
stdin scripts and notebooks.

    from runners.data.verify_worker import math_verify_equal
    math_verify_equal("2\\\\sqrt{3}", "\\\\sqrt{12}")   # True
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

_SERVE = Path(__file__).with_name("_verify_serve.py")


def _compare_here(gold: str, answer: str, seconds: int) -> bool:
    from math_verify import LatexExtractionConfig, parse, verify

    config = [LatexExtractionConfig(boxed_match_priority=0)]
    g = parse(f"\\boxed{{{gold}}}", extraction_config=config, parsing_timeout=seconds)
    a = parse(f"\\boxed{{{answer}}}", extraction_config=config, parsing_timeout=seconds)
    return bool(g) and bool(a) and bool(verify(g, a, timeout_seconds=seconds))


class VerifyWorker:
    """One helper process answering comparison requests; restarted after a timeout."""

    def __init__(self, startup_timeout_s: float = 120.0) -> None:
        self.startup_timeout_s = startup_timeout_s
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self.restarts = 0

    def _start(self) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-c", _SERVE.read_text(encoding="utf-8")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
        self._proc = proc
        # the first round trip pays interpreter start and the math-verify import, not a request's timeout
        if self._roundtrip({"gold": "1", "answer": "1"}, self.startup_timeout_s) is None:
            self.close()
            raise RuntimeError("the math-verify helper process did not start")
        return proc

    def _roundtrip(self, request: dict, timeout_s: float) -> dict | None:
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
        if not ready:
            return None
        line = proc.stdout.readline()
        return json.loads(line) if line else None

    def request(self, request: dict[str, Any], timeout_s: float) -> dict | None:
        """The reply to ``request``, or None if it took longer than ``timeout_s`` (helper killed)."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._start()
            reply = self._roundtrip(request, timeout_s)
            if reply is None:
                self.close()
                self.restarts += 1
            return reply

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


_WORKER: VerifyWorker | None = None
_WORKER_PID: int | None = None
_WORKER_LOCK = threading.Lock()


def shared_worker() -> VerifyWorker:
    """The process-wide helper (a forked child starts its own)."""
    global _WORKER, _WORKER_PID
    with _WORKER_LOCK:
        if _WORKER is None or _WORKER_PID != os.getpid():
            _WORKER, _WORKER_PID = VerifyWorker(), os.getpid()
            atexit.register(_WORKER.close)
        return _WORKER


def math_verify_equal(gold: str, answer: str, *, timeout_s: float = 5.0) -> bool:
    """math-verify equivalence of two LaTeX answers; False on timeout or error (see module doc)."""
    if threading.current_thread() is threading.main_thread():
        try:
            return _compare_here(gold, answer, max(1, int(round(timeout_s))))
        except Exception:
            return False
    reply = shared_worker().request({"gold": gold, "answer": answer}, timeout_s)
    return bool(reply and reply.get("equal"))
