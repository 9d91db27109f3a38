"""What every backend shares outside the policy update: stop requests, checkpoint housekeeping, machine load.

A backend is a class registered in ``runners.backends.BACKENDS``:

    backend = BACKENDS.get(name)(cfg, tracker, run_dir, label)
    backend.stop_requested = True        # set by runners.run on Slurm's stop signals
    metrics = backend.train()            # raises StopRequested after checkpointing on a stop request
    BACKENDS.get(name).discard_checkpoints(run_dir)   # ``force=true``: start the cell afresh

Torch-free: ``runners.run`` imports it before any backend.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable


class StopRequested(Exception):
    """Raised by a backend after a checkpoint when a stop signal (preemption, time limit) was received."""


def pause(
    seconds: float, stop: Callable[[], bool], *, clock=time.monotonic, sleep=time.sleep, tick: float = 0.1
) -> None:
    """Sleep ``seconds``, or less if ``stop()`` turns true first (checked every ``tick`` s).

    ``debug.step_delay_s`` uses it as a stand-in for a long step: a stop signal that arrives during
    the pause is acted on at its end, as one arriving during a real step is at the step's end."""
    deadline = clock() + seconds
    while not stop():
        left = deadline - clock()
        if left <= 0:
            return
        sleep(min(left, tick))


def available_cpus() -> int:
    """CPUs this process may run on (a Slurm job's cgroup / affinity), not the node's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def load_metrics() -> dict[str, float]:
    """The machine's 1-minute load average beside the CPUs available to this process."""
    from runners import metric_names

    try:
        load = os.getloadavg()[0]
    except OSError:  # pragma: no cover
        load = float("nan")
    return {metric_names.LOAD_AVG_1M: load, metric_names.CPU_COUNT_AVAILABLE: float(available_cpus())}


__all__ = ["StopRequested", "available_cpus", "load_metrics", "pause"]
