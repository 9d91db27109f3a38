"""What every backend shares outside the policy update: stop requests and checkpoint housekeeping.

A backend is a class registered in ``runners.backends.BACKENDS``:

    backend = BACKENDS.get(name)(cfg, tracker, run_dir, label)
    backend.stop_requested = True        # set by runners.run on Slurm's stop signals
    metrics = backend.train()            # raises StopRequested after checkpointing on a stop request
    BACKENDS.get(name).discard_checkpoints(run_dir)   # ``force=true``: start the cell afresh

``runners.run`` builds a backend with ``tracker=None`` and sets ``backend.tracker`` before ``train()``:
building loads the model and the data, and a ``ConfigError`` raised there ends the command before
any MLflow run exists. A backend's constructor therefore only keeps the tracker.

Torch-free: ``runners.run`` imports it before any backend.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable


class StopRequested(Exception):
    """Raised by a backend after a checkpoint when a stop signal (preemption, time limit) was received."""


class NonFiniteMetric(RuntimeError):
    """A metric came out NaN or infinite: the run stops as FAILED, its last good checkpoint kept."""


def check_finite(metrics: dict, step: int) -> None:
    """Raise ``NonFiniteMetric`` naming the first non-finite metric and the step (before it is logged
    or checkpointed, so the run's last checkpoint is the last good one)."""
    bad = sorted(k for k, v in metrics.items() if isinstance(v, int | float) and not math.isfinite(v))
    if bad:
        others = f" (and {len(bad) - 1} more: {', '.join(bad[1:4])})" if len(bad) > 1 else ""
        raise NonFiniteMetric(
            f"metric {bad[0]!r} is {metrics[bad[0]]} at step {step}{others}; stopped before logging or "
            "checkpointing it, the last checkpoint is the last good step"
        )


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


def progress_postfix(metrics: dict[str, float]) -> dict[str, str]:
    """The few numbers a person watches per step, as both backends print them: training score, the
    evaluation (when the step has one) and the entropy H."""
    from runners import metric_names

    out = {}
    if metric_names.SCORE_MEAN in metrics:
        out["score"] = f"{metrics[metric_names.SCORE_MEAN]:.2f}"
    for key, value in metrics.items():
        if key.startswith("val-core/") and "mean_at" in key:
            out["eval"] = f"{value:.2f}"
    if metric_names.ENTROPY in metrics:
        out["H"] = f"{metrics[metric_names.ENTROPY]:.2f}"
    return out


__all__ = ["NonFiniteMetric", "StopRequested", "check_finite", "pause", "progress_postfix"]
