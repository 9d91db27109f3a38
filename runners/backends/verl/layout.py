"""A verl cell's files under its run directory: the one description of ``<run_dir>/verl``.

``VerlLayout`` names every file the backend and verl share (datasets, verl's checkpoint root, one log
and metrics file per attempt, the stop file); ``VerlPaths`` is one attempt's view of it as the absolute
strings the translation hands to verl, derived from the layout and never written a second time.
Importing this module imports neither torch nor verl.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# the datasets runners.backends.verl.data writes into VerlLayout.data
TRAIN_FILE = "train.parquet"
VAL_FILE = "val.parquet"


@dataclass(frozen=True)
class VerlLayout:
    """Files of the verl backend under a run directory (``<run_dir>/verl``)."""

    root: Path

    @classmethod
    def of(cls, run_dir: str | Path) -> VerlLayout:
        return cls(Path(run_dir) / "verl")

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def train_file(self) -> Path:
        return self.data / TRAIN_FILE

    @property
    def val_file(self) -> Path:
        return self.data / VAL_FILE

    @property
    def checkpoints(self) -> Path:
        """verl's checkpoint root (``trainer.default_local_dir``): global_step_N/ and the tracker file."""
        return self.root / "checkpoints"

    @property
    def stop_file(self) -> Path:
        return self.root / "STOP"

    def attempt(self) -> int:
        """The number of the attempt about to start (1 + the attempts that wrote a log)."""
        return 1 + len(list(self.root.glob("verl.*.log")))

    def log_file(self, attempt: int) -> Path:
        return self.root / f"verl.{attempt}.log"

    def metrics_file(self, attempt: int) -> Path:
        """The file verl's "file" logger appends this attempt's metrics to (``VERL_FILE_LOGGER_PATH``)."""
        return self.root / f"metrics.{attempt}.jsonl"

    def paths(self, attempt: int) -> VerlPaths:
        return VerlPaths(
            train_files=str(self.train_file),
            val_files=str(self.val_file),
            checkpoint_dir=str(self.checkpoints),
            metrics_file=str(self.metrics_file(attempt)),
        )


@dataclass(frozen=True)
class VerlPaths:
    """One attempt's inputs and outputs as verl receives them (absolute strings; ``VerlLayout.paths``)."""

    # parquet files written by runners.backends.verl.data
    train_files: str
    val_files: str
    # verl's checkpoint root (trainer.default_local_dir)
    checkpoint_dir: str
    # file verl's "file" logger appends metrics to (VERL_FILE_LOGGER_PATH; also passed in the env)
    metrics_file: str

    @classmethod
    def under(cls, root: str | Path, attempt: int = 1) -> VerlPaths:
        """The paths of attempt ``attempt`` of the layout rooted at ``root`` (the ``verl`` directory)."""
        return VerlLayout(Path(root)).paths(attempt)
