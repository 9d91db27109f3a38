"""A verl cell's files under its run directory, verl's checkpoints, and the stop protocol.

- ``VerlLayout``: ``<run_dir>/verl`` (datasets, verl's checkpoints, one log and metrics file per attempt,
  the stop file);
- ``latest_checkpoint_step`` / ``check_resume``: verl's checkpoint tracker, and the guard against a resume
  into zero training steps;
- the stop protocol between the backend (driver side, ``StopWatch``) and the trustbench trainer inside
  verl (``check_stop_request``, called after each step): the backend writes the file named by
  ``TRUSTBENCH_VERL_STOP_FILE``; the trainer checkpoints, writes ``<stop file>.done`` with the step and
  ends verl's loop. See ``VerlBackend`` (``backend.py``'s module docstring) for the whole sequence.

Importing this module imports neither torch nor verl (the trainer hook runs inside verl's processes).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from runners.backends.verl.layout import VerlLayout
from runners.config.validate import ConfigError

STOP_FILE_ENV = "TRUSTBENCH_VERL_STOP_FILE"
STOPPED_SUFFIX = ".done"
CHECKPOINT_TRACKER = "latest_checkpointed_iteration.txt"


def latest_checkpoint_step(checkpoint_dir: str | Path) -> int | None:
    """The step of verl's newest complete checkpoint (its tracker file), or None."""
    tracker = Path(checkpoint_dir) / CHECKPOINT_TRACKER
    try:
        step = int(tracker.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return step if (Path(checkpoint_dir) / f"global_step_{step}").is_dir() else None


def check_resume(layout: VerlLayout, total_steps: int) -> int | None:
    """The checkpoint step to resume from, after guarding against a resume into zero steps.

    Returns None without a checkpoint. Raises ``ConfigError('trainer.total_steps')`` when the
    checkpoint lies beyond ``total_steps`` (the total changed between attempts). A checkpoint AT
    ``total_steps`` is returned as is: the caller finishes without launching verl.
    """
    step = latest_checkpoint_step(layout.checkpoints)
    if step is not None and step > total_steps:
        raise ConfigError(
            "trainer.total_steps",
            f"verl's checkpoint in {layout.checkpoints} is at step {step}, beyond total_steps={total_steps}; "
            "a changed total needs a new run (force=true) or the old value",
        )
    return step


# -- the verl-side stop hook --------------------------------------------------------------------------
def check_stop_request(trainer: Any) -> bool:
    """Called by the trustbench verl trainer at the end of each step (``on_step_end``).

    If the file named by ``TRUSTBENCH_VERL_STOP_FILE`` exists: save a checkpoint of this step
    unless verl just saved one, write ``<stop file>.done`` with the step, and make this the last
    step (verl's loop logs the step's metrics, then ends normally). Returns True when stopping.
    """
    stop_file = os.environ.get(STOP_FILE_ENV)
    if not stop_file or not os.path.exists(stop_file) or getattr(trainer, "_trustbench_stopping", False):
        return False
    step = int(trainer.global_steps)
    save_freq = int(trainer.config.trainer.save_freq)
    if not (save_freq > 0 and step % save_freq == 0):
        trainer._save_checkpoint()
    trainer._trustbench_stopping = True
    trainer.total_training_steps = step  # the loop condition ends training after this step
    Path(stop_file + STOPPED_SUFFIX).write_text(str(step))
    return True


class StopWatch:
    """Waits for verl to honour a stop request; says when to stop waiting.

    verl honours the stop file (the trustbench trainer calls ``check_stop_request``): it writes
    ``STOP.done`` and exits within moments, so wait for it up to ``timeout_s``. A trainer without
    the hook never writes it: once verl's next periodic checkpoint is complete (plus a grace
    period for a hook that is about to write it) nothing more is gained by waiting.
    """

    GRACE_S = 60.0

    def __init__(self, layout: VerlLayout, timeout_s: float) -> None:
        self.layout, self.timeout_s = layout, timeout_s
        self.started = False
        self.done_file = Path(str(layout.stop_file) + STOPPED_SUFFIX)
        self.done_file.unlink(missing_ok=True)

    def start(self) -> None:
        self.layout.stop_file.write_text(f"{time.time()}\n")
        self.deadline = time.monotonic() + self.timeout_s
        self.checkpoint = latest_checkpoint_step(self.layout.checkpoints)
        self.periodic_seen: float | None = None
        self.started = True

    def give_up(self) -> bool:
        now = time.monotonic()
        if now > self.deadline:
            return True
        if self.done_file.exists():
            return False
        newer = latest_checkpoint_step(self.layout.checkpoints)
        if newer is not None and newer != self.checkpoint:
            self.periodic_seen = self.periodic_seen or now
            return now - self.periodic_seen > self.GRACE_S
        return False

    def stopped_at(self) -> int | None:
        if not self.done_file.exists():
            return None
        step = int(self.done_file.read_text().strip() or 0)
        self.done_file.unlink()
        return step
