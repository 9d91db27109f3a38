"""``run(cfg) -> dict``: train one grid cell, the function every launcher calls.

Steps: validate the config; derive the run key; if the cell's MLflow run is FINISHED return it
(skip); otherwise open or resume the MLflow run of that key, write the reproducibility artefacts
(resolved config, command line, git revision) next to the run and into MLflow, train with the
backend named by ``backend.name``, and record the outcome:

- success: MLflow status FINISHED and ``status.json`` ``{"status": "FINISHED"}``;
- an exception: MLflow status FAILED with the reason as tag ``trustbench.failure``, a
  ``status.json`` with the reason and traceback, and ``RunFailed`` raised (non-zero exit);
- a stop signal (Slurm preemption or time limit): checkpoint, MLflow status KILLED, status
  ``PREEMPTED``, and ``Preempted`` raised (naming the signal) so the launcher can requeue the job.

Signals: SIGUSR1 / SIGUSR2 (Slurm's ``--signal`` before the time limit or preemption; USR2 is
submitit's) and SIGTERM (Slurm's preemption, ``scancel``, the time limit itself) ask the trainer to
finish its step and checkpoint. After USR1/USR2 the job requeues itself (``runners.launch``); after
SIGTERM Slurm decides (preemption requeues, a cancel stays cancelled). A signal that arrives before
the trainer exists (a Slurm job installs the handlers at once: ``catch_stop_signals``) stops the
trainer after its first step.

The status file is what ``trustbench sweep`` reads after Hydra returns: Hydra and submitit report
a failed job as completed.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from runners import metric_names, paths, tracking
from runners.backends import BACKENDS, check_placement
from runners.backends.base import StopRequested
from runners.config import method_label, resolved, run_key, run_name, validate

STATUS_FILE = "status.json"
STOP_SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGTERM")
# after these the job requeues itself; after SIGTERM Slurm decides (runners.launch.requeue_or_fail)
REQUEUE_SIGNALS = ("SIGUSR1", "SIGUSR2")


class RunFailed(RuntimeError):
    """A cell failed; the message names the run and the reason."""


class Preempted(RuntimeError):
    """A cell stopped on a signal after checkpointing; requeue it to resume. ``signal``: its name."""

    def __init__(self, message: str, signal: str | None = None) -> None:
        super().__init__(message)
        self.signal = signal


def write_status(run_dir: Path, status: str, **extra: Any) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    data = {"status": status, "time": time.time(), **extra}
    tmp = run_dir / (STATUS_FILE + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, run_dir / STATUS_FILE)


def read_status(run_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((run_dir / STATUS_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def tracking_uri(cfg: DictConfig) -> str:
    """The URI jobs log to: explicit ``tracking.uri``, else the environment / the sqlite default."""
    if cfg.tracking.uri:
        return str(cfg.tracking.uri)
    if cfg.tracking.kind == "server":
        return os.environ.get("MLFLOW_TRACKING_URI") or f"http://{cfg.tracking.host}:{cfg.tracking.port}"
    return paths.default_tracking_uri()


def run_tags(cfg: DictConfig, label: str, choices: Mapping[str, str] | None) -> dict[str, str]:
    choices = choices or {}
    tags = {
        metric_names.TAG_METHOD: label,
        metric_names.TAG_ALGORITHM: cfg.algorithm.name,
        metric_names.TAG_OBJECTIVE: choices.get("objective", cfg.objective.name),
        metric_names.TAG_ESTIMATOR: choices.get("estimator", cfg.estimator.name),
        metric_names.TAG_MASK: choices.get("mask", cfg.mask.name),
        metric_names.TAG_ENTROPY_CONTROL: choices.get("entropy_control", cfg.entropy_control.name),
        metric_names.TAG_MODEL: cfg.model.name,
        metric_names.TAG_DATASET: cfg.dataset.name,
        metric_names.TAG_SEED: str(cfg.seed),
        metric_names.TAG_BACKEND: cfg.backend.name,
        metric_names.TAG_SWEEP: cfg.experiment,
        metric_names.TAG_GIT_REVISION: tracking.git_revision(),
        "mlflow.note.content": f"trustbench cell {label} (run key {run_key(cfg)})",
    }
    tags.update(tracking.host_tags())
    return tags


class _StopFlag:
    """Handlers for Slurm's stop signals that ask ``target`` (a trainer) to checkpoint and stop.

    ``received`` remembers the last stop signal of the process, so a signal caught before the trainer
    existed (``catch_stop_signals``) still stops it. As a context manager the previous handlers come
    back on exit; ``target=None`` only records.
    """

    received: str | None = None

    def __init__(self, target: Any = None) -> None:
        self.target = target
        self.previous: dict[int, Any] = {}

    def install(self) -> _StopFlag:
        for name in STOP_SIGNALS:
            sig = getattr(signal, name, None)
            if sig is None:
                continue
            try:
                self.previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def __enter__(self):
        self.install()
        if _StopFlag.received is not None and self.target is not None:
            self.target.stop_requested = True
        return self

    def _handle(self, signum, _frame) -> None:
        _StopFlag.received = signal.Signals(signum).name
        if self.target is not None:
            self.target.stop_requested = True
        print(f"[trustbench] received {_StopFlag.received}: checkpointing after this step", file=sys.stderr)

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def catch_stop_signals() -> None:
    """Own the stop signals for the rest of the process (a Slurm job, from its first line).

    Replaces submitit's handlers (its USR2 handler would requeue without a checkpoint; it ignores
    SIGTERM). A signal caught before ``run`` builds the trainer stops the trainer after one step.
    """
    _StopFlag.received = None
    _StopFlag().install()


def run(cfg: DictConfig, choices: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Train the cell ``cfg`` (validated first); returns status, run ids and final metrics."""
    validate(cfg)
    check_placement(cfg)  # before any MLflow run exists: a cell this machine cannot run is a config error
    key = run_key(cfg)
    label = method_label(cfg, choices)
    name = run_name(cfg, label)
    run_dir = paths.run_dir(key)
    uri = tracking.ensure_store(tracking_uri(cfg))
    existing = None if cfg.force else tracking.find_run(uri, cfg.experiment, key)
    backend_cls = BACKENDS.get(cfg.backend.name)
    if cfg.force:
        backend_cls.discard_checkpoints(run_dir)
    if existing is not None and existing.info.status == "FINISHED":
        write_status(run_dir, "FINISHED", run_id=existing.info.run_id, name=name, skipped=True)
        return {"status": "SKIPPED", "run_key": key, "run_id": existing.info.run_id, "name": name, "metrics": {}}

    params = tracking.flatten(resolved(cfg))
    tracker = tracking.RunTracker.open(
        uri=uri,
        experiment=cfg.experiment,
        run_key=key,
        run_name=name,
        tags=run_tags(cfg, label, choices),
        params=params,
        run_id=existing.info.run_id if existing is not None else None,
        new=bool(cfg.force),
    )
    tracker.flush_every_s = float(cfg.tracking.flush_every_s)
    run_dir.mkdir(parents=True, exist_ok=True)
    config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    command = shlex.join(sys.argv)
    (run_dir / "config.yaml").write_text(config_yaml)
    (run_dir / "command.txt").write_text(command + "\n")
    tracker.log_text(config_yaml, "config.yaml")
    tracker.log_text(command + "\n", "command.txt")
    attempts = (read_status(run_dir) or {}).get("attempts", 0) + 1
    write_status(run_dir, "RUNNING", run_id=tracker.run_id, name=name, attempts=attempts)

    try:
        trainer = backend_cls(cfg, tracker, run_dir, label)
        with _StopFlag(trainer):
            metrics = trainer.train()
    except BaseException as err:  # noqa: BLE001 - record every way a run can end
        if isinstance(err, StopRequested):
            tracker.finish("KILLED", reason=None)
            stop_signal = _StopFlag.received
            write_status(
                run_dir,
                "PREEMPTED",
                run_id=tracker.run_id,
                name=name,
                attempts=attempts,
                reason=str(err),
                signal=stop_signal,
            )
            raise Preempted(f"{name}: {err}", signal=stop_signal) from err
        reason = f"{type(err).__name__}: {err}"
        try:
            tracker.finish("FAILED", reason=reason)
        finally:
            write_status(
                run_dir,
                "FAILED",
                run_id=tracker.run_id,
                name=name,
                attempts=attempts,
                reason=reason,
                traceback=traceback.format_exc(),
            )
        if isinstance(err, KeyboardInterrupt):
            raise
        raise RunFailed(f"run {name!r} (key {key}) failed: {reason}") from err
    tracker.finish("FINISHED")
    write_status(run_dir, "FINISHED", run_id=tracker.run_id, name=name, attempts=attempts)
    return {"status": "FINISHED", "run_key": key, "run_id": tracker.run_id, "name": name, "metrics": metrics}
