"""Sweeps: expand a sweep file into cells, skip what is done, launch the rest, report outcomes.

``trustbench sweep NAME`` composes ``sweeps/NAME.yaml`` (a Hydra experiment file carrying
``hydra.sweeper.params``), expands the grid exactly like Hydra's BasicSweeper (cartesian product
of the sweep params and any sweep syntax on the command line), composes and validates EVERY cell
before anything starts, looks up each cell's MLflow run by its run key (one query for the whole
experiment), and hands only the cells that still need to run to the configured Hydra launcher
plugin (basic, submitit_local, submitit_slurm). Hydra's own sweeper cannot skip cells and it
only instantiates sweepers from the ``hydra_plugins`` namespace, hence this driver; the jobs
themselves are ordinary Hydra jobs (``runners.main.task``).

Decisions per cell: FINISHED -> skip; FAILED -> skip unless ``rerun_failed``; anything else
(never started, RUNNING or KILLED from an interrupted attempt) -> run, resuming its checkpoint;
``force`` reruns everything from scratch (old checkpoints removed, a new MLflow run).

Planning composes cells with ``runners.config.grid.Composer`` (once per combination of config-group
overrides; ``tests/test_sweep_plan.py`` checks it equals Hydra's full composition).

Launching (``launch``): Hydra's submitit launcher takes one set of resources per launch, so cells
are grouped by the resources they request (``runners.resources``: model size, backend,
``launcher.*``), every group is checked against the cluster before anything is queued, each group
is queued as one job array, and the command then waits for all jobs and reads every cell's status
marker (Hydra and submitit report a failed cell as a completed job).
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import shutil
import sqlite3
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from runners import metric_names, paths, tracking
from runners.backends import check_placement
from runners.config import (
    SEARCHPATH_OVERRIDE,
    SWEEPS_DIR,
    ConfigError,
    method_label,
    run_key,
    run_name,
    validate,
)
from runners.config.grid import Composer, expand_grid, master_hydra

SUBMITTED = "SUBMITTED"
JOB_FILE = "job.json"  # in a cell's run directory: the Slurm job that runs it
# slurmctld checks time limits every 30 s and sends a --signal warning at the first check within
# 30 s of its due time: up to 30 s early (1-30 s early, measured on the test cluster). A signal in a
# job's first seconds kills Python before any handler is installed.
SIGNAL_EARLY_S = 30
JOB_STARTUP_S = 10


def signal_delay(requested_s: int, time_min: int) -> int:
    """The ``--signal`` delay a job gets: ``launcher.signal_delay_s``, shortened for short time
    limits so the signal is never sent within the job's first ``JOB_STARTUP_S`` seconds."""
    return max(0, min(int(requested_s), time_min * 60 - SIGNAL_EARLY_S - JOB_STARTUP_S))


@dataclass
class Cell:
    """One grid cell of a sweep."""

    overrides: list[str]
    config: dict  # resolved config (plain containers)
    key: str
    label: str
    name: str
    resources: dict[str, Any]
    mlflow_status: str | None = None
    action: str = "run"  # run | attach | skip-finished | skip-failed | skip-duplicate

    @property
    def axes(self) -> str:
        return " ".join(self.overrides)


@dataclass
class SweepPlan:
    name: str
    experiment: str
    tracking_uri: str
    cells: list[Cell]
    base_overrides: list[str]
    launcher: str = "local"
    tracking_kind: str = "sqlite"
    cluster_note: str = ""
    master: Any = field(repr=False, default=None)  # (hydra, master cfg) to launch with
    jobs: dict[str, Any] = field(default_factory=dict)  # run key -> runners.launch.JobOutcome
    sweep_dir: Path | None = None
    interrupted: bool = False  # Ctrl-C while waiting: jobs (and a server started here) keep running
    queued_s: float | None = None  # how long queueing every job array took

    @property
    def to_run(self) -> list[Cell]:
        """Cells this launch submits or (``attach``: still queued or running from an earlier launch) waits for."""
        return [c for c in self.cells if c.action in ("run", "attach")]

    def groups(self) -> dict[tuple, list[Cell]]:
        """Cells to submit, by the resources they request (one job array each)."""
        out: dict[tuple, list[Cell]] = {}
        for cell in self.cells:
            if cell.action != "run":
                continue
            out.setdefault(_resource_key(cell.resources), []).append(cell)
        return out


def _resource_key(res: dict[str, Any]) -> tuple:
    from runners.resources import RESOURCE_KEYS

    return tuple(res[k] for k in RESOURCE_KEYS)


def available_sweeps() -> list[str]:
    return sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml"))


# -- MLflow: which cells are done ------------------------------------------------------------------------
def _existing_runs(uri: str, experiment: str) -> dict[str, str]:
    """run key -> MLflow status of the newest run with that key (one query for the experiment).

    A sqlite store is read with one SQL query (no mlflow import: the dry run stays fast); a server
    that does not answer is read through its sqlite file when that is this home's store."""
    from runners import tracking_server

    db = _sqlite_file(uri)
    if db is None and uri.startswith("http") and not tracking_server.is_up(uri):
        db = _sqlite_file(tracking_server.store_uri())
    if db is not None:
        if not db.exists():
            return {}
        try:
            return _existing_runs_sql(db, experiment)
        except sqlite3.Error:
            pass  # an unexpected schema: ask MLflow
    client = tracking._client(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return {}
    out: dict[str, tuple[int, str]] = {}
    token = None
    while True:
        page = client.search_runs([exp.experiment_id], max_results=5000, page_token=token)
        for r in page:
            key = r.data.tags.get(metric_names.TAG_RUN_KEY)
            if key and (key not in out or r.info.start_time > out[key][0]):
                out[key] = (r.info.start_time, r.info.status)
        token = page.token
        if not token:
            break
    return {k: v[1] for k, v in out.items()}


def _sqlite_file(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None


def _existing_runs_sql(db: Path, experiment: str) -> dict[str, str]:
    query = """
        SELECT t.value, r.status FROM runs r
        JOIN experiments e ON e.experiment_id = r.experiment_id
        JOIN tags t ON t.run_uuid = r.run_uuid
        WHERE e.name = ? AND t.key = ? AND r.lifecycle_stage = 'active'
        ORDER BY r.start_time"""
    with sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True) as con:
        rows = con.execute(query, (experiment, metric_names.TAG_RUN_KEY)).fetchall()
    return dict(rows)  # newest last wins


# -- planning ----------------------------------------------------------------------------------------------
def plan(
    name: str,
    overrides: Sequence[str] = (),
    *,
    rerun_failed: bool = False,
    force: bool = False,
    check_mlflow: bool = True,
    check_cluster: bool = True,
) -> SweepPlan:
    """Compose and validate every cell of sweep ``name``; decide which ones to run.

    With ``launcher=slurm`` every distinct resource request is checked against the cluster
    (``check_cluster``; skipped with a note when there is no ``sbatch``)."""
    from runners.resources import cell_resources
    from runners.run import tracking_uri

    if name not in available_sweeps():
        raise ConfigError("sweep", f"unknown sweep {name!r}; available: {', '.join(available_sweeps())}")
    user = list(overrides)
    sweep_free = [o for o in user if not _is_sweep_syntax(o)]
    # hydra.mode=MULTIRUN reaches every job (as with `-m`): runners.main.task then reports instead of raising
    hydra, master = master_hydra([f"+sweeps={name}", SEARCHPATH_OVERRIDE, "hydra.mode=MULTIRUN", *sweep_free])
    base = [f"+sweeps={name}", *sweep_free]
    cells_overrides = expand_grid(master, [o for o in user if _is_sweep_syntax(o)], hydra.config_loader)
    composer = Composer(hydra, master, base)
    cells: list[Cell] = []
    validated: set[str] = set()
    uri = experiment = None
    launcher_name = tracking_kind = "?"
    for ov in cells_overrides:
        composed = composer.compose(ov)
        cfg, data = composed.cfg, composed.data
        if data is None or composed.check not in validated:
            try:
                validate(cfg)
            except ConfigError as err:
                raise ConfigError(err.key, f"{err} (in cell: {' '.join(ov) or '<base>'})") from None
            validated.add(composed.check)
        if uri is None:
            uri, experiment = tracking_uri(cfg), str(cfg.experiment)
            launcher_name, tracking_kind = str(cfg.launcher.name), str(cfg.tracking.kind)
        label = method_label(cfg, composed.choices)
        cells.append(
            Cell(
                overrides=ov,
                config=data,
                key=run_key(data),
                label=label,
                name=run_name(cfg, label),
                resources=cell_resources(data),
            )
        )
    experiment = experiment or name
    uri = uri or paths.default_tracking_uri()
    existing = _existing_runs(uri, experiment) if check_mlflow else {}
    seen: set[str] = set()
    for cell in cells:
        cell.mlflow_status = existing.get(cell.key)
        if cell.key in seen:
            cell.action = "skip-duplicate"
        elif force:
            cell.action = "run"
        elif cell.mlflow_status == "FINISHED":
            cell.action = "skip-finished"
        elif cell.mlflow_status == "FAILED" and not rerun_failed:
            cell.action = "skip-failed"
        seen.add(cell.key)
    p = SweepPlan(
        name=name,
        experiment=experiment,
        tracking_uri=uri,
        cells=cells,
        base_overrides=base,
        launcher=launcher_name,
        tracking_kind=tracking_kind,
        master=(hydra, master),
    )
    if launcher_name == "slurm" and not force:
        _attach_active_jobs(p)
    if launcher_name == "slurm" and check_cluster:
        p.cluster_note = check_cluster_limits(p)
    return p


def _attach_active_jobs(p: SweepPlan) -> None:
    """Cells whose Slurm job from an earlier launch is still queued or running are waited for, not
    submitted again (``attach``): e.g. after Ctrl-C, or a lost login session, during a sweep."""
    from runners.launch import FINAL_STATES, queue_states
    from runners.run import read_status

    candidates = {}
    for cell in p.cells:
        job_file = paths.run_dir(cell.key) / JOB_FILE
        if cell.action == "run" and job_file.exists():
            status = (read_status(job_file.parent) or {}).get("status")
            if status not in ("FINISHED", "FAILED"):
                candidates[cell.key] = json.loads(job_file.read_text())
    if not candidates or shutil.which("squeue") is None:
        return
    states = queue_states()
    for cell in p.cells:
        job = candidates.get(cell.key)
        if job is not None and states.get(job["job_id"], "COMPLETED") not in FINAL_STATES:
            cell.action = "attach"


def check_cluster_limits(p: SweepPlan) -> str:
    """Raise ``ConfigError`` if the cluster can never run some group of cells; return a note."""
    from runners.resources import Cluster, check_request

    groups = p.groups()
    if not groups:
        return ""
    if shutil.which("sbatch") is None:
        return "cluster not checked: no sbatch on PATH"
    launcher = p.cells[0].config["launcher"]
    cluster = Cluster.query()
    for cells in groups.values():
        try:
            check_request(cells[0].resources, launcher, cluster)
        except ConfigError as err:
            names = ", ".join(c.name for c in cells[:3]) + (f" and {len(cells) - 3} more" if len(cells) > 3 else "")
            raise ConfigError(err.key, f"{str(err).split(': ', 1)[1]} (cells: {names})") from None
    return f"cluster checked: {len(groups)} distinct request(s) fit (scontrol, sbatch --test-only)"


def _is_sweep_syntax(override: str) -> bool:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_override(override).is_sweep_override()


def format_plan(p: SweepPlan) -> str:
    """The dry-run table: one line per cell with its overrides, action and requested resources."""
    from runners.resources import gpu_hours

    lines = [
        f"sweep {p.name!r}: {len(p.cells)} cells -> experiment {p.experiment!r} at {p.tracking_uri} "
        f"(launcher {p.launcher}, tracking {p.tracking_kind})"
    ]
    hours = 0.0
    for i, c in enumerate(p.cells):
        r = c.resources
        res = f"nodes={r['nodes']} gpus/node={r['gpus_per_node']} cpus={r['cpus_per_task']} mem={r['mem_gb']}G time={r['time_min']}m"
        lines.append(f"  [{i:>3}] {c.action:<15} {c.label:<22} {c.axes or '<base>'}  | {res}")
        if c.action == "run":
            hours += gpu_hours(r)
    done = sum(c.action == "skip-finished" for c in p.cells)
    failed = sum(c.action == "skip-failed" for c in p.cells)
    attached = sum(c.action == "attach" for c in p.cells)
    if attached:
        lines.append(f"{attached} cell(s) still queued or running from an earlier launch: waited for, not resubmitted")
    if p.launcher != "local":
        lines.append(f"{len(p.groups())} job array(s), one per distinct resource request")
    if p.cluster_note:
        lines.append(p.cluster_note)
    lines.append(
        f"{len(p.to_run)} to run, {done} already finished in MLflow (skipped), {failed} failed (skipped; "
        f"--rerun-failed to retry); estimated <= {hours:.1f} GPU-hours (time limit x GPUs)"
    )
    return "\n".join(lines)


# -- launching ---------------------------------------------------------------------------------------------
def launch(
    p: SweepPlan, *, force: bool = False, poll_s: float = 5.0, wait: bool = True, stream=sys.stdout
) -> list[Any]:
    """Run the cells to run through the configured launcher and wait for them.

    Returns Hydra's JobReturns (basic launcher) or ``runners.launch.JobOutcome``s (submitit); with
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
    server = None
    if p.tracking_kind == "server" and not os.environ.get("MLFLOW_TRACKING_URI"):
        from runners import tracking_server

        t = p.cells[0].config["tracking"]
        server = tracking_server.ensure_server(t["host"], t["port"], start=bool(t["start_server"]))
        p.tracking_uri = server.url
        os.environ["MLFLOW_TRACKING_URI"] = server.url
        print(f"MLflow server at {server.url} ({'started here' if server.started else 'already running'})", file=stream)
    tracking.ensure_store(p.tracking_uri)  # once, before any parallel writer
    tracking.get_or_create_experiment(p.tracking_uri, p.experiment)
    if force:
        for cell in cells:
            shutil.rmtree(paths.run_dir(cell.key), ignore_errors=True)
    OmegaConf.save(master, sweep_dir / "multirun.yaml")
    (sweep_dir / "cells.json").write_text(
        json.dumps(
            [{"overrides": c.overrides, "key": c.key, "name": c.name, "resources": c.resources} for c in cells],
            indent=2,
        )
    )
    extra = ["force=true"] if force else []
    try:
        if p.launcher == "local":
            return _launch_in_process(p, hydra, master, cells, extra)
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
        if server is not None and server.started and not p.interrupted:
            server.stop()


def _instantiate(hydra, master: DictConfig):
    from hydra._internal.callbacks import Callbacks
    from hydra.core.plugins import Plugins
    from hydra.types import HydraContext

    from runners.main import task

    return Plugins.instance().instantiate_launcher(
        hydra_context=HydraContext(config_loader=hydra.config_loader, callbacks=Callbacks(master)),
        task_function=task,
        config=master,
    )


def _launch_in_process(p: SweepPlan, hydra, master, cells: list[Cell], extra: list[str]) -> list[Any]:
    launcher = _instantiate(hydra, master)
    return list(launcher.launch([[*p.base_overrides, *c.overrides, *extra] for c in cells], initial_job_idx=0))


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
    from runners.launch import submit_jobs
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
        launcher = _instantiate(hydra, _group_master(master, p, group[0].resources))
        submitted = submit_jobs(launcher, [[*p.base_overrides, *c.overrides, *extra] for c in group], len(jobs))
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
    from runners.launch import wait_jobs
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
    _write_outcomes(p)
    return results


def _describe_res(r: dict[str, Any]) -> str:
    return f"nodes={r['nodes']} gpus/node={r['gpus_per_node']} cpus={r['cpus_per_task']} mem={r['mem_gb']}G time={r['time_min']}m"


# -- outcomes ----------------------------------------------------------------------------------------------
def outcomes(p: SweepPlan) -> list[tuple[Cell, str, str]]:
    """(cell, status, reason) of every cell from its status marker and, for Slurm jobs, how the job ended.

    Hydra and submitit report a failed cell as a completed job: the marker says what happened. A job
    that ended without reaching a final marker (time limit, cancel, node failure) is LOST."""
    from runners.run import read_status

    out = []
    for cell in p.cells:
        st = read_status(paths.run_dir(cell.key)) or {}
        status, reason = st.get("status", "MISSING"), st.get("reason", "")
        job = p.jobs.get(cell.key)
        if cell.action == "skip-finished":
            status, reason = "FINISHED", ""
        elif job is not None and status not in ("FINISHED", "FAILED"):
            reason = f"{job.describe()}; last marker {status}" + (f" ({reason})" if reason else "")
            status = "LOST"
        elif job is not None and job.error and status != "FAILED":
            status, reason = "FAILED", job.describe()
        out.append((cell, status, reason))
    return out


def _write_outcomes(p: SweepPlan) -> None:
    if p.sweep_dir is None:
        return
    rows = [
        {"name": c.name, "key": c.key, "overrides": c.overrides, "status": s, "reason": r,
         "job": p.jobs[c.key].job_id if c.key in p.jobs else None}
        for c, s, r in outcomes(p)
    ]  # fmt: skip
    (p.sweep_dir / "outcomes.json").write_text(json.dumps(rows, indent=2))


def report_outcomes(p: SweepPlan, stream=sys.stdout) -> int:
    """Print one line per cell; return the number of cells that did not finish."""
    bad = 0
    for cell, status, reason in outcomes(p):
        mark = "ok " if status == "FINISHED" else "!! "
        if status != "FINISHED":
            bad += 1
        extra = f"  ({reason})" if reason and status != "FINISHED" else ""
        print(f"{mark}{status:<10} {cell.name:<40} {cell.axes or '<base>'}{extra}", file=stream)
    return bad
