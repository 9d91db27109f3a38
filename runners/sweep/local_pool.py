"""``launcher=local`` with ``launcher.parallel=N > 1``: up to N cells at a time, each in its own process.

Every cell runs in a child process (``python -m runners.sweep.local_pool``) that does what the serial
path does in-process for that one cell: it composes the sweep's master config, points Hydra at the
sweep directory and hands the cell's overrides to Hydra's basic launcher with the cell's job index,
so its Hydra job directory (``<sweep dir>/<index>``), run key, status marker and MLflow run are the
ones a serial launch gives. The child's overrides and master overrides reach it on stdin (a
credential in a command-line override appears in no file and no process list).

The store is opened once by the parent before any child starts (``tracking_server.open_store``);
children log into it side by side. Each child's stdout and stderr go to ``<sweep dir>/logs/cell-<index>.log``
and what its task returned (status, error) to ``cell-<index>.result.json``; the parent prints one line
per finished cell (its status marker, its wall time, and the log of a cell that did not finish). A
child that exits without a final marker is reported LOST with its exit code and what it returned, e.g.
a configuration error (``runners.sweep.results``).

Ctrl-C: the children run in their own sessions, so the terminal's SIGINT reaches only the parent,
which starts nothing more and sends each running child SIGTERM (SIGTERM or SIGHUP to the parent do the same): the trainer checkpoints after its
current step and the cell ends PREEMPTED (MLflow KILLED), resumed by the next ``trustbench sweep``.
A second Ctrl-C, or children still alive after ``STOP_GRACE_S``, kill the children's process groups.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from runners import memory_guard, paths
from runners.sweep.planning import Cell, SweepPlan

STOP_GRACE_S = 180.0  # a training step plus a checkpoint, on a slow machine
POLL_S = 0.5
# overrides every child adds: a progress bar in a log file is noise (``progress`` is not part of the run key)
CHILD_OVERRIDES = ("progress=false",)


@dataclass
class LocalJob:
    """One cell's child process; ``describe``/``error``/``job_id`` as ``runners.cluster.queue.JobOutcome``."""

    index: int
    cell: Cell
    log: Path
    proc: subprocess.Popen | None = None
    started: float = 0.0
    ended: float | None = None
    returncode: int | None = None
    error: str | None = field(default=None)

    @property
    def job_id(self) -> str:
        return f"pid {self.proc.pid}" if self.proc is not None else "not started"

    def result(self) -> dict:
        """What the cell's task returned (``child_main`` writes it beside the log), or {}."""
        try:
            return json.loads(result_path(self.log).read_text())
        except (OSError, ValueError):
            return {}

    def describe(self) -> str:
        if self.proc is None:
            return f"not started; log {self.log}"
        got = self.result()
        said = f": {got.get('status')}" + (f" ({got['error']})" if got.get("error") else "") if got else ""
        return f"process {self.proc.pid} exited with code {self.returncode}{said}; log {self.log}"


def log_path(sweep_dir: Path, index: int) -> Path:
    return sweep_dir / "logs" / f"cell-{index}.log"


def result_path(log: Path) -> Path:
    return log.with_suffix(".result.json")


def master_overrides(p: SweepPlan) -> list[str]:
    """The overrides ``runners.sweep.planning`` composed the master config from."""
    from runners.config import SEARCHPATH_OVERRIDE

    sweep_file, *user = p.base_overrides
    return [sweep_file, SEARCHPATH_OVERRIDE, "hydra.mode=MULTIRUN", *user]


def run_parallel(
    p: SweepPlan, cells: list[Cell], extra: list[str], sweep_dir: Path, parallel: int, stream: TextIO
) -> list[LocalJob]:
    """Run ``cells`` (job indices 0..n-1, as the serial launcher numbers them), ``parallel`` at a time."""
    from runners.sweep.results import write_outcomes

    jobs = [LocalJob(i, cell, log_path(sweep_dir, i)) for i, cell in enumerate(cells)]
    (sweep_dir / "logs").mkdir(parents=True, exist_ok=True)
    # the sweep directory as an override: each job's Hydra config is composed again from the overrides
    # (a ``${now:...}`` in hydra.sweep.dir would give each child its own directory)
    spec = {
        "master_overrides": [*master_overrides(p), f"hydra.sweep.dir={_quoted(str(sweep_dir))}"],
        "sweep_dir": str(sweep_dir),
    }
    print(
        f"running {len(jobs)} cells, {parallel} at a time, each in its own process; "
        f"logs in {sweep_dir / 'logs'} (Ctrl-C stops them after their current step)",
        file=stream,
        flush=True,
    )
    pending, running, done = deque(jobs), [], 0
    share = {memory_guard.SHARE_ENV: str(memory_guard.share_bytes(parallel))}  # each cell's default memory limit
    previous = _stop_on_signals()
    try:
        while pending or running:
            while pending and len(running) < parallel:
                job = pending.popleft()
                _start(
                    job,
                    {**spec, "index": job.index, "overrides": [*p.base_overrides, *job.cell.overrides, *extra]},
                    share,
                )
                running.append(job)
            for job in [j for j in running if j.proc.poll() is not None]:
                running.remove(job)
                job.ended, job.returncode = time.monotonic(), job.proc.returncode
                done += 1
                _print_done(job, done, len(jobs), len(running) + len(pending), stream)
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        _stop(running, stream)
        print(
            f"interrupted: {len(running)} running cell(s) stopped (resumed from their checkpoint by the next "
            f"`trustbench sweep`), {len(pending)} not started",
            file=stream,
            flush=True,
        )
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for job in jobs:
            if job.proc is not None:
                p.jobs[job.cell.key] = job
        write_outcomes(p)
    return jobs


def _interrupt(signum, _frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _stop_on_signals() -> dict:
    """SIGTERM and SIGHUP (a closed terminal) stop the children as Ctrl-C does: in their own sessions they
    would outlive this process. Returns the previous handlers."""
    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            previous[sig] = signal.signal(sig, _interrupt)
        except ValueError:  # not the main thread: leave the handlers alone
            pass
    return previous


def _start(job: LocalJob, spec: dict[str, Any], extra_env: dict[str, str]) -> None:
    env = {**os.environ, **extra_env}
    root = str(Path(__file__).resolve().parents[2])  # the code this process runs, whatever the install
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    with open(job.log, "ab") as log:
        job.proc = subprocess.Popen(
            [sys.executable, "-m", "runners.sweep.local_pool"],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # the terminal's Ctrl-C reaches the parent only; it stops the children
        )
    job.started = time.monotonic()
    assert job.proc.stdin is not None
    job.proc.stdin.write(json.dumps(spec).encode())
    job.proc.stdin.close()


def _print_done(job: LocalJob, done: int, total: int, left: int, stream: TextIO) -> None:
    from runners.run import read_status

    status = (read_status(paths.run_dir(job.cell.key)) or {}).get("status", "MISSING")
    if status not in ("FINISHED", "FAILED"):  # no final marker: what the task returned, else LOST
        status = str(job.result().get("status") or "LOST")
    note = "" if status == "FINISHED" else f"  see {job.log}"
    print(
        f"  [{done}/{total}] {status:<9} {job.cell.name}  {job.cell.axes}  "
        f"({job.ended - job.started:.0f} s; {left} to go){note}",
        file=stream,
        flush=True,
    )


def _stop(running: list[LocalJob], stream: TextIO) -> None:
    """SIGTERM each running child (it checkpoints and stops); kill what is left after the grace time or
    on a second Ctrl-C."""
    for job in running:
        _signal(job, signal.SIGTERM, group=False)
    print(
        f"\nstopping {len(running)} running cell(s) after their current step (Ctrl-C again to kill them)",
        file=stream,
        flush=True,
    )
    deadline = time.monotonic() + STOP_GRACE_S
    try:
        while any(j.proc.poll() is None for j in running) and time.monotonic() < deadline:
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        pass
    for job in running:
        if job.proc.poll() is None:
            _signal(job, signal.SIGKILL, group=True)
        job.returncode = job.proc.wait()
        job.ended = time.monotonic()


def _signal(job: LocalJob, sig: int, *, group: bool) -> None:
    try:
        if group:  # the child's session: the child and anything it started
            os.killpg(job.proc.pid, sig)
        else:
            job.proc.send_signal(sig)
    except ProcessLookupError:
        pass


def _quoted(value: str) -> str:
    """``value`` as a quoted Hydra override value (Hydra's grammar: a backslash is escaped only before
    a quote or at the end)."""
    value = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, value)
    return "'" + value.replace("'", "\\'") + "'"


def child_main() -> int:
    """One cell in this process, as the serial launcher runs it (spec on stdin)."""
    from runners.config.grid import master_hydra
    from runners.sweep.hydra_launcher import instantiate_launcher

    spec = json.loads(sys.stdin.read())
    hydra, master = master_hydra(spec["master_overrides"])
    launcher = instantiate_launcher(hydra, master)
    (ret,) = launcher.launch([[*spec["overrides"], *CHILD_OVERRIDES]], initial_job_idx=int(spec["index"]))
    try:
        outcome = ret.return_value  # raises what the task raised (the marker may not say it)
    except BaseException as err:  # noqa: BLE001 - reported in the log and by the exit code
        outcome = {"status": "RAISED", "error": f"{type(err).__name__}: {err}"}
    outcome = outcome if isinstance(outcome, dict) else {"status": str(outcome)}
    said = {k: str(outcome[k]) for k in ("status", "error") if outcome.get(k) is not None}
    result_path(log_path(Path(spec["sweep_dir"]), int(spec["index"]))).write_text(json.dumps(said))
    print(
        f"trustbench: cell {spec['index']} ended {said.get('status')}"
        + (f": {said['error']}" if "error" in said else "")
    )
    return 1 if said.get("status") == "RAISED" else 0


if __name__ == "__main__":  # pragma: no cover - a child of run_parallel
    sys.exit(child_main())
