"""What runs inside a cell's Slurm (or local submitit) job: its job id, its attempts, its requeue.

Hydra's submitit launcher plugin (``hydra/launcher=submitit_slurm``, chosen by
``conf/launcher/slurm.yaml``) pickles itself as each job's function and runs ``runners.main.task``
in the job; a verl cell's batch script runs ``runners.cluster.verl_batch.run_cell`` instead. In the
job, trustbench owns the stop signals. submitit installs its handlers before the task runs (USR2,
the signal of ``sbatch --signal=USR2@signal_delay_s``, checkpoints *the callable* and requeues;
SIGTERM is ignored); ``task`` replaces them first thing (``in_submitit_job`` ->
``run.catch_stop_signals``). USR1/USR2 make the trainer finish its step and checkpoint; the job then
requeues itself with ``scontrol requeue`` (``requeue_or_fail``: bounded by ``launcher.max_requeues``,
counted by ``SLURM_RESTART_COUNT``) and exits *without* a submitit result, so whoever waits
(``runners.cluster.queue.wait_jobs``) keeps waiting for the requeued run, which resumes from the
checkpoint into the same MLflow run. SIGTERM (Slurm's preemption, ``scancel``, the time limit) also
checkpoints, but Slurm decides what follows (``PreemptMode=REQUEUE`` requeues, a cancel stays
cancelled): we never requeue after SIGTERM. submitit's own ``checkpoint()`` path (resubmit the same
cell) is reachable only before the task starts, while the job unpickles; it is bounded by
``max_num_timeout`` (= ``launcher.max_requeues``) and the cell resumes from its last checkpoint.

Outside Slurm there is nothing to requeue: a stopped cell is left PREEMPTED and the next
``trustbench sweep`` resumes it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

from omegaconf import DictConfig

from runners import paths
from runners.config import run_key
from runners.run import REQUEUE_SIGNALS, read_status, write_status

JOBS_FILE = "jobs.jsonl"  # one line per job attempt of a cell, in its run directory


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
