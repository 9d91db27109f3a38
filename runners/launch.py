"""Requeue after preemption or a time limit (Slurm), bounded by ``launcher.max_requeues``.

When a cell receives Slurm's pre-timeout or preemption signal, the trainer checkpoints and
``run`` raises ``Preempted``. Under Slurm the job then asks the controller to requeue it
(``scontrol requeue``): the same job id starts again, ``SLURM_RESTART_COUNT`` goes up, and
``run`` resumes from the checkpoint into the same MLflow run. Past ``max_requeues`` the cell is
recorded as FAILED. Outside Slurm there is nothing to requeue: the cell is left PREEMPTED and the
next ``trustbench sweep`` resumes it.
"""

from __future__ import annotations

import os
import subprocess

from omegaconf import DictConfig

from runners import paths
from runners.config import run_key
from runners.run import read_status, write_status


def slurm_job_id() -> str | None:
    array_job, array_task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array_job and array_task:
        return f"{array_job}_{array_task}"
    return os.environ.get("SLURM_JOB_ID")


def requeue_or_fail(cfg: DictConfig) -> dict:
    run_dir = paths.run_dir(run_key(cfg))
    previous = {k: v for k, v in (read_status(run_dir) or {}).items() if k not in ("status", "time")}
    job = slurm_job_id()
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    if job is None:
        return {"status": "PREEMPTED"}
    if restarts >= int(cfg.launcher.max_requeues):
        reason = f"preempted {restarts + 1} times; launcher.max_requeues={cfg.launcher.max_requeues} reached"
        write_status(run_dir, "FAILED", **{**previous, "reason": reason})
        return {"status": "FAILED", "error": reason}
    write_status(run_dir, "REQUEUED", **{**previous, "restarts": restarts + 1})
    subprocess.run(["scontrol", "requeue", job], check=False)
    return {"status": "REQUEUED"}
