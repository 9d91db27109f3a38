"""``run(cfg) -> dict``: train one grid cell, the function every launcher calls.

Steps: validate the config; derive the run key; hold the cell (``runners.cell_lock``: a second
start of the same cell is refused with ``CellBusy``); reach the tracking store (``tracking=server``
starts the server as ``trustbench sweep`` does, ``runners.tracking_server.connect``); if the cell's
MLflow run is FINISHED return it (skip); build the backend (it loads the model and the data: a
configuration mistake found there, ``ConfigError``, ends the command before any MLflow run exists,
with the status marker ``CONFIG_ERROR``); open or resume the MLflow run of that key, write the
reproducibility artefacts (resolved config and command line, credentials masked by
``runners.redact``; git revision) next to the run and into MLflow, train, and record the outcome:

- success: MLflow status FINISHED and ``status.json`` ``{"status": "FINISHED"}``;
- an exception: MLflow status FAILED with the reason as tag ``trustbench.failure``, a
  ``status.json`` with the reason and traceback, and ``RunFailed`` raised (non-zero exit);
- resident memory above ``launcher.memory_limit_gb`` (``runners.memory_guard``): a failure, its
  reason naming the limit and the memory measured;
- a stop signal (Slurm preemption or time limit): checkpoint, MLflow status KILLED, status
  ``PREEMPTED``, and ``Preempted`` raised (naming the signal) so the launcher can requeue the job.

Recording an end tries every part (MLflow, the marker) even when one fails (a full disk, an
unwritable run directory) and says in the raised message what could not be recorded; a full disk
is named there once, with what to free (``runners.disk_full``), and log records that cannot be
written to it are dropped rather than printed with their tracebacks.

Signals: SIGUSR1 / SIGUSR2 (Slurm's ``--signal`` before the time limit or preemption; USR2 is
submitit's) and SIGTERM (Slurm's preemption, ``scancel``, the time limit itself) ask the trainer to
finish its step and checkpoint. After USR1/USR2 the job requeues itself (``runners.cluster.job``); after
SIGTERM Slurm decides (preemption requeues, a cancel stays cancelled). A signal that arrives before
the trainer exists (a Slurm job installs the handlers at once: ``catch_stop_signals``) stops the
trainer after its first step.

The status file (``runners.status``) is what ``trustbench sweep`` reads after Hydra returns: Hydra
and submitit report a failed job as completed.
"""

from __future__ import annotations

import atexit
import os
import shlex
import signal
import sys
import traceback
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from runners import disk_full, memory_guard, metric_names, paths, tracking, tracking_server
from runners.backends import BACKENDS, check_placement
from runners.backends.base import StopRequested
from runners.cell_lock import hold_cell
from runners.config import ConfigError, method_label, resolved, run_key, run_name, validate
from runners.config.regime import regime_label
from runners.config.validate import check_seed
from runners.redact import redact, redact_values
from runners.status import STATUS_FILE, read_status, write_status  # noqa: F401  (re-exported)

STOP_SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGTERM")
# after these the job requeues itself; after SIGTERM Slurm decides (runners.cluster.job.requeue_or_fail)
REQUEUE_SIGNALS = ("SIGUSR1", "SIGUSR2")


class RunFailed(RuntimeError):
    """A cell failed; the message names the run and the reason."""


class Preempted(RuntimeError):
    """A cell stopped on a signal after checkpointing; requeue it to resume. ``signal``: its name."""

    def __init__(self, message: str, signal: str | None = None) -> None:
        super().__init__(message)
        self.signal = signal


def tracking_uri(cfg: DictConfig) -> str:
    """The URI jobs log to: explicit ``tracking.uri``, else the environment / the sqlite default."""
    if cfg.tracking.uri:
        return str(cfg.tracking.uri)
    if cfg.tracking.kind == "server":
        return os.environ.get("MLFLOW_TRACKING_URI") or f"http://{cfg.tracking.host}:{cfg.tracking.port}"
    return paths.default_tracking_uri()


def uri_source(cfg: DictConfig) -> str | None:
    """Where ``tracking_uri(cfg)`` came from when the user gave it (``tracking.uri`` or the environment
    variable ``MLFLOW_TRACKING_URI``); None for this home's sqlite file or the sweep's own server."""
    if cfg.tracking.uri:
        return "tracking.uri"
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return "MLFLOW_TRACKING_URI"
    return None


def run_tags(cfg: DictConfig, label: str, choices: Mapping[str, str] | None) -> dict[str, str]:
    choices = choices or {}
    tags = {
        metric_names.TAG_METHOD: label,
        metric_names.TAG_ALGORITHM: cfg.algorithm.name,
        metric_names.TAG_OBJECTIVE: choices.get("objective", cfg.objective.name),
        metric_names.TAG_ESTIMATOR: choices.get("estimator", cfg.estimator.name),
        metric_names.TAG_MASK: choices.get("mask", cfg.mask.name),
        metric_names.TAG_ENTROPY_CONTROL: choices.get("entropy_control", cfg.entropy_control.name),
        metric_names.TAG_ROLLOUT_CORRECTION: choices.get("rollout_correction", cfg.rollout_correction.name),
        metric_names.TAG_REGIME: regime_label(cfg),
        metric_names.TAG_MODEL: cfg.model.name,
        metric_names.TAG_DATASET: cfg.dataset.name,
        metric_names.TAG_SEED: str(cfg.seed),
        metric_names.TAG_BACKEND: cfg.backend.name,
        metric_names.TAG_SWEEP: cfg.experiment,
        **tracking.code_version_tags(),
        "mlflow.note.content": f"trustbench cell {label} (run key {run_key(cfg)})",
    }
    tags.update(tracking.host_tags())
    return tags


def _say_from_handler(line: str) -> None:
    """Write ``line`` to stderr from a signal handler in one ``os.write``. ``print`` goes through the
    buffered stream, and a second signal arriving while the first handler's line is being written runs the
    handler again inside that write: ``RuntimeError: reentrant call`` raised out of the handler (under
    repeated signals it ended the process, or stopped the exit hook that ignores the requeue signals)."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a stream without a descriptor (a test's capture)
        print(line, file=sys.stderr)
        return
    os.write(fd, (line + "\n").encode())


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
        _say_from_handler(f"[trustbench] received {_StopFlag.received}: checkpointing after this step")

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def catch_stop_signals() -> None:
    """Own the stop signals for the rest of the process (a Slurm job, from its first line).

    Replaces submitit's handlers (its USR2 handler would requeue without a checkpoint; it ignores
    SIGTERM). A signal caught before ``run`` builds the trainer stops the trainer after one step.
    At exit the requeue signals are ignored (``_ignore_requeue_signals``).
    """
    _StopFlag.received = None
    _StopFlag().install()
    atexit.unregister(_ignore_requeue_signals)  # once, however often a process calls this
    atexit.register(_ignore_requeue_signals)


def _ignore_requeue_signals() -> None:
    """USR1/USR2 ignored from here to the end of the process: there is nothing left to stop, and once the
    interpreter finalizes, CPython puts back the default action of every signal that had a Python
    handler, which for these ends the process. Slurm's ``--signal=B:USR1@N`` forwarded as a job that
    finished its run was exiting made the job FAILED after its run had FINISHED."""
    for name in REQUEUE_SIGNALS:
        sig = getattr(signal, name, None)
        if sig is not None:
            signal.signal(sig, signal.SIG_IGN)


@dataclass
class _Cell:
    key: str
    label: str
    name: str
    run_dir: Path
    store: str = ""  # the tracking URI (a full disk: which file system)

    def full_disk(self, message: str) -> str:
        """'' or the note naming the full file system and what to free (``runners.disk_full``)."""
        home = paths.trustbench_home()
        return disk_full.note(message, self.store, self.run_dir, home, home=home)


def run(cfg: DictConfig, choices: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Train the cell ``cfg`` (validated first); returns status, run ids and final metrics."""
    validate(cfg)
    check_seed(cfg)
    memory_guard.check_config(cfg)
    disk_full.quiet_log_errors()
    check_placement(cfg)  # before any MLflow run exists: a cell this machine cannot run is a config error
    key, label = run_key(cfg), method_label(cfg, choices)
    cell = _Cell(key, label, run_name(cfg, label), paths.run_dir(key), tracking_uri(cfg))
    backend_cls = BACKENDS.get(cfg.backend.name)
    with ExitStack() as stack:
        try:
            stack.enter_context(hold_cell(cell.run_dir, cell.name))
        except OSError as err:
            raise RunFailed(f"run {cell.name!r}: cannot use its run directory {cell.run_dir}: {err}") from None
        with _store_failure(cell, f"open the tracking store {redact(tracking_uri(cfg))}"):
            uri = tracking_server.open_store(stack.enter_context(tracking_server.serving(cfg.tracking)))
            existing = None if cfg.force else tracking.find_run(uri, cfg.experiment, key)
        if cfg.force:
            backend_cls.discard_checkpoints(cell.run_dir)
        if existing is not None and existing.info.status == "FINISHED":
            write_status(cell.run_dir, "FINISHED", run_id=existing.info.run_id, name=cell.name, skipped=True)
            return {
                "status": "SKIPPED",
                "run_key": key,
                "run_id": existing.info.run_id,
                "name": cell.name,
                "metrics": {},
            }
        backend, early = _build_backend(backend_cls, cfg, cell)
        with _store_failure(cell, f"open its MLflow run in {redact(uri)}"):
            tracker = tracking.RunTracker.open(
                uri=uri,
                experiment=cfg.experiment,
                run_key=key,
                run_name=cell.name,
                tags=run_tags(cfg, label, choices),
                params=redact_values(tracking.flatten(resolved(cfg))),
                run_id=existing.info.run_id if existing is not None else None,
                new=bool(cfg.force),
            )
        tracker.flush_every_s = float(cfg.tracking.flush_every_s)
        return _train(cfg, cell, backend, early, tracker)


@contextmanager
def _store_failure(cell: _Cell, doing: str) -> Iterator[None]:
    """A tracking store that fails before the MLflow run is open (a full disk, a broken server):
    ``RunFailed`` naming it in one line, and the marker says FAILED, unless it says FINISHED: a store
    that cannot be read does not undo a finished run (a config error, e.g. a damaged store, passes)."""
    try:
        yield
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - any failure of the store: reported in one line
        reason = f"could not {doing}: {tracking.describe_error(err)}"
        marker = read_status(cell.run_dir) or {}
        if marker.get("status") == "FINISHED":
            raise RunFailed(
                f"run {cell.name!r} (key {cell.key}, FINISHED before): {reason}{cell.full_disk(reason)}"
            ) from None
        kept = {k: v for k, v in marker.items() if k in ("attempts", "run_id")}
        notes = _try(lambda: write_status(cell.run_dir, "FAILED", **kept, name=cell.name, reason=reason))
        notes = f"; {cell.run_dir / STATUS_FILE} could not be written ({notes})" if notes else ""
        text = f"{reason}{notes}"
        raise RunFailed(f"run {cell.name!r} (key {cell.key}) failed: {text}{cell.full_disk(text)}") from None


def _build_backend(backend_cls, cfg: DictConfig, cell: _Cell) -> tuple[Any, BaseException | None]:
    """The backend, built before the MLflow run is opened (its tracker is attached afterwards).

    Building loads the model and the data: a configuration mistake found there (``ConfigError``)
    ends the command before any MLflow run exists. Any other error is returned, to be recorded in
    the run as a failure in training is."""
    try:
        return backend_cls(cfg, None, cell.run_dir, cell.label), None
    except ConfigError as err:
        kept = {k: v for k, v in (read_status(cell.run_dir) or {}).items() if k in ("attempts", "run_id")}
        marker = {**kept, "name": cell.name, "reason": redact(str(err))}
        _try(lambda: write_status(cell.run_dir, "CONFIG_ERROR", **marker))
        raise
    except Exception as err:  # noqa: BLE001 - recorded in the MLflow run by _train
        return None, err


def _train(cfg: DictConfig, cell: _Cell, backend, early: BaseException | None, tracker) -> dict[str, Any]:
    attempts = (read_status(cell.run_dir) or {}).get("attempts", 0) + 1
    record = {"run_id": tracker.run_id, "name": cell.name, "attempts": attempts}
    try:
        _write_artefacts(cfg, cell.run_dir, tracker)
        write_status(cell.run_dir, "RUNNING", **record)
        if early is not None:
            raise early
        backend.tracker = tracker
        on_hard_stop = lambda reason: write_status(cell.run_dir, "FAILED", **record, reason=reason)  # noqa: E731
        with _StopFlag(backend), memory_guard.guard_for(cfg, on_hard_stop):
            metrics = backend.train()
    except BaseException as err:  # noqa: BLE001 - record every way a run can end
        _end_abnormally(err, tracker, cell, record)
    try:
        tracker.finish("FINISHED")
    except Exception as err:  # noqa: BLE001 - e.g. a full disk at the last flush
        reason = f"trained to the end, but its MLflow run could not be finished: {tracking.describe_error(err)}"
        notes = _record(tracker, cell, "FAILED", reason, {**record, "status": "FAILED", "reason": reason})
        text = f"{reason}{notes}"
        raise RunFailed(f"run {cell.name!r} (key {cell.key}) failed: {text}{cell.full_disk(text)}") from err
    notes = _record(tracker, cell, None, None, {**record, "status": "FINISHED"})
    if notes:
        raise RunFailed(f"run {cell.name!r} (key {cell.key}) finished in MLflow{notes}{cell.full_disk(notes)}")
    return {"status": "FINISHED", "run_key": cell.key, "run_id": tracker.run_id, "name": cell.name, "metrics": metrics}


def _write_artefacts(cfg: DictConfig, run_dir: Path, tracker) -> None:
    """The resolved config and the command line, beside the run and in MLflow (credentials masked)."""
    config_yaml = redact(OmegaConf.to_yaml(cfg, resolve=True))
    command = redact(shlex.join(sys.argv)) + "\n"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(config_yaml)
    (run_dir / "command.txt").write_text(command)
    tracker.log_text(config_yaml, "config.yaml")
    tracker.log_text(command, "command.txt")


def _end_abnormally(err: BaseException, tracker, cell: _Cell, record: dict[str, Any]) -> None:
    """Record a stop (KILLED / PREEMPTED) or a failure (FAILED) and raise what the launcher expects."""
    if isinstance(err, StopRequested):
        stop_signal = _StopFlag.received
        marker = {**record, "status": "PREEMPTED", "reason": str(err), "signal": stop_signal}
        notes = _record(tracker, cell, "KILLED", None, marker)
        raise Preempted(f"{cell.name}: {err}{notes}", signal=stop_signal) from err
    reason = tracking.describe_error(err)
    marker = {**record, "status": "FAILED", "reason": reason, "traceback": redact(traceback.format_exc())}
    notes = _record(tracker, cell, "FAILED", reason, marker)
    if isinstance(err, KeyboardInterrupt):
        if notes:
            print(f"[trustbench] {cell.name}: interrupted{notes}", file=sys.stderr)
        raise err
    text = f"{reason}{notes}"
    raise RunFailed(f"run {cell.name!r} (key {cell.key}) failed: {text}{cell.full_disk(text)}") from err


def _record(tracker, cell: _Cell, mlflow_status: str | None, reason: str | None, marker: dict[str, Any]) -> str:
    """End the MLflow run (unless ``mlflow_status`` is None) and write the marker, each tried even if
    the other fails; returns '' or '; ...' naming what could not be recorded (for the raised message)."""
    problems = []
    if mlflow_status is not None:
        problem = _try(lambda: tracker.finish(mlflow_status, reason=reason))
        if problem:
            problems.append(f"its MLflow run {tracker.run_id} could not be marked {mlflow_status} ({problem})")
    problem = _try(lambda: write_status(cell.run_dir, **marker))
    if problem:
        problems.append(f"{cell.run_dir / STATUS_FILE} could not be written ({problem})")
    return "".join(f"; {text}" for text in problems)


def _try(action) -> str | None:
    """Run ``action``; None if it worked, else what went wrong."""
    try:
        action()
    except Exception as err:  # noqa: BLE001 - reported by the caller
        return " ".join(tracking.describe_error(err).split())[:500]
    return None
