"""The submitting side: queue a sweep's cells as Slurm (or local submitit) jobs and wait for them.

- ``submit_array`` queues one job array through the Hydra submitit launcher plugin's own launcher
  object and returns the submitit jobs without waiting, so a sweep queues every resource group
  first and then waits for all of them (the plugin's ``launch`` submits and waits for one array at a
  time, and raises on the first job that ends without a result). Each job runs ``runners.main.task``
  (``runners.cluster.job``: signals, attempts, requeue).
- ``wait_jobs`` tolerates jobs that die without a result (time limit, node failure, cancel): it
  checks result files every second and ``squeue`` every few seconds (``queue_states``), and reports
  Slurm's final state (``final_state``, from ``sacct``) in a ``JobOutcome``.
- ``signal_delay``: the ``--signal`` delay a job of a given time limit gets.
"""

from __future__ import annotations

import getpass
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Slurm job states after which a job never runs again
FINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
)

# slurmctld checks time limits every 30 s and sends a --signal warning at the first check within
# 30 s of its due time: up to 30 s early (1-30 s early, measured on the test cluster). A signal in a
# job's first seconds kills Python before any handler is installed.
SIGNAL_EARLY_S = 30
JOB_STARTUP_S = 10


def signal_delay(requested_s: int, time_min: int) -> int:
    """The ``--signal`` delay a job gets: ``launcher.signal_delay_s``, shortened for short time
    limits so the signal is never sent within the job's first ``JOB_STARTUP_S`` seconds."""
    return max(0, min(int(requested_s), time_min * 60 - SIGNAL_EARLY_S - JOB_STARTUP_S))


# -- submitting -------------------------------------------------------------------------------------------
def submit_array(launcher, job_overrides: Sequence[Sequence[str]], initial_job_idx: int = 0) -> list:
    """Queue one job per override list (one job array) through a set-up Hydra submitit launcher.

    The same steps as the plugin's ``launch`` (its parameters, its pickled ``__call__`` as the job),
    without waiting: returns the submitit jobs as soon as sbatch accepted the array."""
    import submitit
    from hydra.core.singleton import Singleton
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from omegaconf import OmegaConf

    assert launcher.config is not None, "launcher.setup() first"
    kind = launcher._EXECUTOR
    params = dict(launcher.params)
    init = {"folder": params.pop("submitit_folder")}
    if "max_num_timeout" in params:
        init[f"{kind}_max_num_timeout"] = params.pop("max_num_timeout")
    executor = submitit.AutoExecutor(cluster=kind, **init)
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{k if k in base else f"{kind}_{k}": v for k, v in params.items()})
    Path(str(launcher.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
    state = Singleton.get_state()
    args = [
        (list(ov), "hydra.sweep.dir", initial_job_idx + i, f"job_id_for_{initial_job_idx + i}", state)
        for i, ov in enumerate(job_overrides)
    ]
    return executor.map_array(launcher, *zip(*args))


# -- waiting ----------------------------------------------------------------------------------------------
@dataclass
class JobOutcome:
    """How one submitted job ended: its Hydra ``JobReturn`` if it wrote a result, else Slurm's view."""

    job_id: str
    job_return: Any = None
    state: str = "RESULT"  # RESULT, or the final Slurm state of a job that ended without a result
    error: str | None = None  # the traceback of a job that raised outside the task

    def describe(self) -> str:
        if self.error:
            return f"job {self.job_id} raised: {self.error.strip().splitlines()[-1]}"
        if self.job_return is None:
            return f"job {self.job_id} ended {self.state} without a result"
        return f"job {self.job_id} returned"


def queue_states(user: str | None = None) -> dict[str, str]:
    """``{job id: state}`` of the user's jobs that Slurm still knows (array tasks expanded)."""
    proc = subprocess.run(
        ["squeue", "-h", "-r", "-u", user or getpass.getuser(), "-o", "%i|%T"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"squeue failed: {proc.stderr.strip()}")
    return dict(line.split("|", 1) for line in proc.stdout.split() if "|" in line)


def final_state(job_id: str) -> str:
    """Slurm's accounting state of a finished job (``sacct``), or UNKNOWN without accounting."""
    try:
        proc = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "JobID,State"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return "UNKNOWN"
    states = [line.split("|")[1].split()[0] for line in proc.stdout.splitlines() if line.startswith(f"{job_id}|")]
    return states[-1] if states else "UNKNOWN"


def _collect(job) -> JobOutcome:
    try:
        outcome, value = job._get_outcome_and_result()
    except Exception as err:  # noqa: BLE001 - unreadable result: report it
        return JobOutcome(job.job_id, state="UNREADABLE", error=str(err))
    if outcome == "success":
        return JobOutcome(job.job_id, job_return=value)
    return JobOutcome(job.job_id, state="ERROR", error=str(value))


def wait_jobs(
    jobs: Sequence,
    *,
    poll_s: float = 5.0,
    on_done: Callable[[int, JobOutcome], None] | None = None,
) -> list[JobOutcome]:
    """Wait until every job wrote its result or left the Slurm queue; outcomes in ``jobs`` order.

    A job that leaves the queue without a result (seen gone twice, ``poll_s`` apart) is reported
    with its ``sacct`` state. Local submitit jobs are polled through submitit."""
    outcomes: list[JobOutcome | None] = [None] * len(jobs)
    pending = set(range(len(jobs)))
    gone: dict[int, int] = {}  # Slurm jobs seen gone from the queue: how many probes in a row
    next_probe = time.monotonic() + poll_s

    def finish(i: int, out: JobOutcome) -> None:
        outcomes[i] = out
        pending.discard(i)
        gone.pop(i, None)
        if on_done is not None:
            on_done(i, out)

    while pending:
        for i in sorted(pending):
            out = _outcome_if_done(jobs[i])
            if out is not None:
                finish(i, out)
        if pending and time.monotonic() >= next_probe:
            for i, out in _left_the_queue(jobs, pending, gone):
                finish(i, out)
            next_probe = time.monotonic() + poll_s
        if pending:
            time.sleep(1.0)
    return [o for o in outcomes if o is not None]


def _outcome_if_done(job) -> JobOutcome | None:
    """The job's outcome if it wrote its result (or, a local job, ended), else None."""
    from submitit.slurm.slurm import SlurmJob

    if job.paths.result_pickle.exists():
        return _collect(job)
    if not isinstance(job, SlurmJob) and job.done():
        return _collect(job) if job.paths.result_pickle.exists() else JobOutcome(job.job_id, state=job.state)
    return None


def _left_the_queue(jobs: Sequence, pending: set[int], gone: dict[int, int]) -> list[tuple[int, JobOutcome]]:
    """Slurm jobs of ``pending`` seen gone from the queue on two probes in a row without a result,
    with their ``sacct`` state; ``gone`` counts the probes."""
    from submitit.slurm.slurm import SlurmJob

    slurm = [i for i in pending if isinstance(jobs[i], SlurmJob)]
    if not slurm:
        return []
    states = queue_states()
    ended = []
    for i in slurm:
        state = states.get(jobs[i].job_id)
        if state is not None and state not in FINAL_STATES:
            gone.pop(i, None)
            continue
        gone[i] = gone.get(i, 0) + 1
        if gone[i] >= 2 and not jobs[i].paths.result_pickle.exists():
            ended.append((i, JobOutcome(jobs[i].job_id, state=final_state(jobs[i].job_id))))
    return ended
