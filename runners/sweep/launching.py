"""Launching a planned sweep (``runners.sweep``): queue the cells, wait for them, keep how each ended.

``launch`` runs the plan's cells through the configured Hydra launcher: in this process
(``launcher=local``, Hydra's basic launcher; ``launcher.parallel=N``: N cells at a time, each in its
own process, ``runners.sweep.local_pool``) or as submitit jobs, one job array per group of cells
requesting the same resources (``_submit``; queued and waited for by ``runners.cluster.queue``); with
``tracking=server`` it first starts (or reuses) the MLflow server the jobs log to.
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from runners import paths, tracking, tracking_server
from runners.backends import check_placement
from runners.cluster.queue import signal_delay
from runners.config import ConfigError
from runners.redact import redact
from runners.sweep.hydra_launcher import instantiate_launcher
from runners.sweep.planning import JOB_FILE, Cell, SweepPlan
from runners.sweep.results import write_outcomes

SUBMITTED = "SUBMITTED"


def launch(
    p: SweepPlan, *, force: bool = False, poll_s: float = 5.0, wait: bool = True, stream=sys.stdout
) -> list[Any]:
    """Run the cells to run through the configured launcher and wait for them.

    Returns Hydra's JobReturns (basic launcher) or ``runners.cluster.queue.JobOutcome``s (submitit); with
    ``wait=False`` (submitit launchers) the submitit jobs as soon as all are queued."""
    cells = p.to_run
    if not cells:
        return []
    for cell in cells:  # a cell this machine would run must be runnable here (a cluster cell is checked there)
        check_placement(OmegaConf.create(cell.config))
    hydra, master = p.master
    master = copy.deepcopy(master)
    os.environ["TRUSTBENCH_HOME"] = str(paths.trustbench_home())  # jobs share this home, wherever they start
    sweep_dir = Path(str(master.hydra.sweep.dir)).resolve()
    with open_dict(master.hydra):
        master.hydra.sweep.dir = str(sweep_dir)
    p.sweep_dir = sweep_dir
    sweep_dir.mkdir(parents=True, exist_ok=True)
    server = _connect(p, stream)
    tracking_server.open_store(p.tracking_uri)  # once, before any parallel writer
    tracking.get_or_create_experiment(p.tracking_uri, p.experiment)
    for cell in cells:  # from scratch: every cell with --force, stale ones with --rerun-stale
        if force or cell.fresh:
            shutil.rmtree(paths.run_dir(cell.key), ignore_errors=True)
    (sweep_dir / "multirun.yaml").write_text(redact(OmegaConf.to_yaml(master)))
    (sweep_dir / "cells.json").write_text(
        redact(
            json.dumps(
                [{"overrides": c.overrides, "key": c.key, "name": c.name, "resources": c.resources} for c in cells],
                indent=2,
            )
        )
    )
    extra = ["force=true"] if force else []
    try:
        if p.launcher == "local":
            return _launch_local(p, hydra, master, cells, extra, stream)
        jobs, order = _submit(p, hydra, master, extra, stream)
        for cell in cells:
            if cell.action == "attach":
                jobs.append(_reattach(cell))
                order.append(cell)
        if not wait:
            p.interrupted = True  # nobody waits: a server started here must stay up for the jobs
            return jobs
        return _wait(p, jobs, order, poll_s, stream)
    finally:
        if server is not None and p.interrupted:  # jobs that outlive the sweep keep the server
            server.detach()
        elif server is not None:  # leave it: the last user stops a server trustbench started
            server.stop()


def _connect(p: SweepPlan, stream):
    """Reach the tracking store as ``trustbench run`` does (``runners.tracking_server.connect``); a
    server started (or found) for ``tracking=server`` is handed to the jobs through
    ``MLFLOW_TRACKING_URI``. Returns the server, held until the jobs are done (``stop`` or ``detach``)."""
    uri, server = tracking_server.connect(p.cells[0].config["tracking"])
    p.tracking_uri = uri
    if server is not None:
        os.environ["MLFLOW_TRACKING_URI"] = server.url
        print(f"MLflow server at {server.url} ({'started here' if server.started else 'already running'})", file=stream)
    return server


def _launch_local(p: SweepPlan, hydra, master, cells: list[Cell], extra: list[str], stream) -> list[Any]:
    """``launcher=local``: the cells one after another in this process, or with ``launcher.parallel=N``
    up to N at a time, each in its own process (``runners.sweep.local_pool``)."""
    parallel = int(p.cells[0].config["launcher"].get("parallel", 1))
    if parallel > 1 and len(cells) > 1:
        from runners.sweep.local_pool import run_parallel

        return run_parallel(p, cells, extra, Path(str(master.hydra.sweep.dir)), parallel, stream)
    launcher = instantiate_launcher(hydra, master)
    return list(launcher.launch([_job_overrides(p, c, extra) for c in cells], initial_job_idx=0))


def _job_overrides(p: SweepPlan, cell: Cell, extra: list[str]) -> list[str]:
    """The overrides one cell's job runs with (``force=true`` also for a stale cell rerun from scratch)."""
    fresh = ["force=true"] if cell.fresh and "force=true" not in extra else []
    return [*p.base_overrides, *cell.overrides, *extra, *fresh]


def _group_master(master: DictConfig, p: SweepPlan, res: dict[str, Any]) -> DictConfig:
    """The master config with ``hydra.launcher`` set to one group's resources and job environment."""
    gm = copy.deepcopy(master)
    launcher = p.cells[0].config["launcher"]
    exports = {"TRUSTBENCH_HOME": os.environ["TRUSTBENCH_HOME"]}
    if os.environ.get("MLFLOW_TRACKING_URI"):
        exports["MLFLOW_TRACKING_URI"] = os.environ["MLFLOW_TRACKING_URI"]
    with open_dict(gm.hydra.launcher):
        hl = gm.hydra.launcher
        hl.timeout_min = res["time_min"]
        if "signal_delay_s" in hl:
            hl.signal_delay_s = signal_delay(hl.signal_delay_s, res["time_min"])
        if p.launcher == "slurm":
            hl.nodes = res["nodes"]
            hl.gpus_per_node = res["gpus_per_node"] or None
            hl.cpus_per_task = res["cpus_per_task"]
            hl.mem_gb = res["mem_gb"]
            hl.setup = [*launcher["setup"], *(f"export {k}={shlex.quote(v)}" for k, v in exports.items())]
            hl.additional_parameters = dict(launcher["additional_parameters"])
    return gm


def _submit(p: SweepPlan, hydra, master: DictConfig, extra: list[str], stream) -> tuple[list, list[Cell]]:
    """Queue every resource group as one job array; returns the submitit jobs and their cells."""
    from runners.cluster.queue import submit_array
    from runners.run import read_status, write_status

    if p.launcher == "slurm" and shutil.which("sbatch") is None:
        raise ConfigError("launcher.name", "launcher=slurm needs sbatch on PATH (run from a Slurm login node)")
    started = time.monotonic()
    jobs, order = [], []
    for group in p.groups().values():
        for cell in group:  # before submission: a fast job may already write RUNNING
            run_dir = paths.run_dir(cell.key)
            kept = {k: v for k, v in (read_status(run_dir) or {}).items() if k in ("attempts", "run_id", "name")}
            write_status(run_dir, SUBMITTED, **kept)
        launcher = instantiate_launcher(hydra, _group_master(master, p, group[0].resources))
        submitted = submit_array(launcher, [_job_overrides(p, c, extra) for c in group], len(jobs))
        for cell, job in zip(group, submitted):
            info = {"job_id": job.job_id, "folder": str(job.paths.folder), "submitted": time.time()}
            (paths.run_dir(cell.key) / JOB_FILE).write_text(json.dumps(info))
        jobs += submitted
        order += group
        array = submitted[0].job_id.split("_")[0]
        print(f"queued {len(group)} cell(s) as job {array} ({_describe_res(group[0].resources)})", file=stream)
    p.queued_s = time.monotonic() - started
    if jobs:
        print(f"all {len(jobs)} cells queued in {p.queued_s:.1f} s", file=stream, flush=True)
    return jobs, order


def _reattach(cell: Cell):
    """The submitit job of a cell queued by an earlier launch (its result file and Slurm state)."""
    from submitit.slurm.slurm import SlurmJob

    info = json.loads((paths.run_dir(cell.key) / JOB_FILE).read_text())
    return SlurmJob(folder=info["folder"], job_id=info["job_id"])


def _wait(p: SweepPlan, jobs: list, order: list[Cell], poll_s: float, stream) -> list[Any]:
    """Wait for every job (Ctrl-C leaves them running) and keep how each one ended."""
    from runners.cluster.queue import wait_jobs
    from runners.run import read_status

    print("waiting for them (Ctrl-C leaves them running)", file=stream, flush=True)
    done = [0]

    def progress(i: int, out) -> None:
        done[0] += 1
        st = (read_status(paths.run_dir(order[i].key)) or {}).get("status", "?")
        print(f"  [{done[0]}/{len(jobs)}] {st:<9} {order[i].name}  (job {out.job_id})", file=stream, flush=True)

    try:
        results = wait_jobs(jobs, poll_s=poll_s, on_done=progress)
    except KeyboardInterrupt:
        p.interrupted = True
        print("\ninterrupted: the jobs keep running; run the same sweep again later to collect them", file=stream)
        raise
    for cell, out in zip(order, results):
        p.jobs[cell.key] = out
    write_outcomes(p)
    return results


def _describe_res(r: dict[str, Any]) -> str:
    return f"nodes={r['nodes']} gpus/node={r['gpus_per_node']} cpus={r['cpus_per_task']} mem={r['mem_gb']}G time={r['time_min']}m"
