"""Cells as Slurm (or local submitit) jobs: who handles signals, who requeues, how a sweep waits.

Hydra's submitit launcher plugin (``hydra/launcher=submitit_slurm``, chosen by
``conf/launcher/slurm.yaml``) pickles itself as each job's function and runs ``runners.main.task``
in the job. trustbench adds three things:

1. In the job, trustbench owns the stop signals. submitit installs its handlers before the task
   runs (USR2, the signal of ``sbatch --signal=USR2@signal_delay_s``, checkpoints *the callable*
   and requeues; SIGTERM is ignored); ``task`` replaces them first thing (``in_submitit_job`` ->
   ``run.catch_stop_signals``). USR1/USR2 make the trainer finish its step and checkpoint; the job
   then requeues itself with ``scontrol requeue`` (``requeue_or_fail``: bounded by
   ``launcher.max_requeues``, counted by ``SLURM_RESTART_COUNT``) and exits *without* a submitit
   result, so whoever waits keeps waiting for the requeued run, which resumes from the checkpoint
   into the same MLflow run. SIGTERM (Slurm's preemption, ``scancel``, the time limit) also
   checkpoints, but Slurm decides what follows (``PreemptMode=REQUEUE`` requeues, a cancel stays
   cancelled): we never requeue after SIGTERM. submitit's own ``checkpoint()`` path (resubmit the
   same cell) is reachable only before the task starts, while the job unpickles; it is bounded by
   ``max_num_timeout`` (= ``launcher.max_requeues``) and the cell resumes from its last checkpoint.
2. ``submit_jobs`` queues one job array through the plugin's own launcher object and returns the
   submitit jobs without waiting, so a sweep queues every resource group first and then waits for
   all of them (the plugin's ``launch`` submits and waits for one array at a time, and raises on
   the first job that ends without a result).
3. ``wait_jobs`` tolerates jobs that die without a result (time limit, node failure, cancel): it
   checks result files every second and ``squeue`` every few seconds, and reports Slurm's final
   state (``sacct``).

Outside Slurm there is nothing to requeue: a stopped cell is left PREEMPTED and the next
``trustbench sweep`` resumes it.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from runners import paths
from runners.config import run_key
from runners.run import REQUEUE_SIGNALS, read_status, write_status

JOBS_FILE = "jobs.jsonl"  # one line per job attempt of a cell, in its run directory
# Slurm job states after which a job never runs again
FINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
)


# -- inside a job ----------------------------------------------------------------------------------
def slurm_job_id() -> str | None:
    array_job, array_task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array_job and array_task:
        return f"{array_job}_{array_task}"
    return os.environ.get("SLURM_JOB_ID")


def in_submitit_job() -> bool:
    """Whether this process is a job started by submitit (Slurm or local executor)."""
    return bool(os.environ.get("SUBMITIT_EXECUTOR"))


def _restarts() -> int:
    return int(os.environ.get("SLURM_RESTART_COUNT") or 0)


def start_attempt(cfg: DictConfig) -> dict | None:
    """Record this job attempt in ``<run dir>/jobs.jsonl``; refuse a cell requeued too often.

    Returns None to go on, or the FAILED outcome when Slurm requeued the job (e.g. preemption)
    more than ``launcher.max_requeues`` times."""
    job = slurm_job_id()
    if job is None:
        return None
    run_dir = paths.run_dir(run_key(cfg))
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "job_id": job,
        "restart": _restarts(),
        "host": socket.gethostname(),
        "node": os.environ.get("SLURMD_NODENAME"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "gpus_on_node": os.environ.get("SLURM_GPUS_ON_NODE"),
        "time": time.time(),
    }
    with open(run_dir / JOBS_FILE, "a") as fh:
        fh.write(json.dumps(record) + "\n")
    limit = int(cfg.launcher.max_requeues)
    if _restarts() > limit:
        reason = f"requeued {_restarts()} times by Slurm; launcher.max_requeues={limit} reached"
        _fail(cfg, run_dir, reason)
        return {"status": "FAILED", "error": reason}
    return None


def requeue_or_fail(cfg: DictConfig, signal: str | None = "SIGUSR1") -> dict:
    """After a checkpoint on ``signal``: requeue this Slurm job, or record why not.

    USR1/USR2 (the pre-timeout or preemption notice) requeue, unless ``launcher.max_requeues``
    requeues happened already (then FAILED). SIGTERM leaves the decision to Slurm (PREEMPTED).
    Outside Slurm: PREEMPTED (the next sweep resumes the cell)."""
    run_dir = paths.run_dir(run_key(cfg))
    previous = {k: v for k, v in (read_status(run_dir) or {}).items() if k not in ("status", "time")}
    job = slurm_job_id()
    if job is None or signal not in REQUEUE_SIGNALS:
        return {"status": "PREEMPTED", "signal": signal}
    restarts = _restarts()
    if restarts >= int(cfg.launcher.max_requeues):
        reason = f"stopped {restarts + 1} times; launcher.max_requeues={cfg.launcher.max_requeues} reached"
        _fail(cfg, run_dir, reason, previous)
        return {"status": "FAILED", "error": reason}
    write_status(run_dir, "REQUEUED", **{**previous, "restarts": restarts + 1, "job_id": job})
    proc = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        reason = f"scontrol requeue {job} failed: {proc.stderr.strip()}"
        _fail(cfg, run_dir, reason, previous)
        return {"status": "FAILED", "error": reason}
    return {"status": "REQUEUED", "job_id": job}


def _fail(cfg: DictConfig, run_dir: Path, reason: str, previous: dict | None = None) -> None:
    """Mark the cell FAILED in its marker and in MLflow (its run was left KILLED by the stop)."""
    from runners import metric_names, tracking
    from runners.run import tracking_uri

    previous = (
        previous
        if previous is not None
        else {k: v for k, v in (read_status(run_dir) or {}).items() if k not in ("status", "time")}
    )
    write_status(run_dir, "FAILED", **{**previous, "reason": reason})
    try:
        uri = tracking_uri(cfg)
        found = tracking.find_run(uri, str(cfg.experiment), run_key(cfg))
        if found is not None:
            client = tracking._client(uri)
            client.set_tag(found.info.run_id, metric_names.TAG_FAILURE, reason)
            client.set_terminated(found.info.run_id, status="FAILED")
    except Exception as err:  # noqa: BLE001 - the marker already says FAILED
        print(f"[trustbench] could not mark the MLflow run FAILED: {err}")


# -- in the sweep command: submitting ---------------------------------------------------------------
def submit_jobs(launcher, job_overrides: Sequence[Sequence[str]], initial_job_idx: int = 0) -> list:
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


# -- in the sweep command: waiting ------------------------------------------------------------------
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
