"""Planning a sweep: every cell composed and validated, and what to do with each (``runners.sweep``).

``plan`` composes each cell with ``runners.config.grid.Composer`` (Hydra's composition, once per
combination of config-group overrides), validates it, and decides its action from the status of
its MLflow run (``_existing_runs``: one query for the whole experiment); ``format_plan`` is the dry
run's table.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from runners import metric_names, paths, sqlite_store, tracking
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
from runners.config.validate import check_seed
from runners.config.validate_more import check_sweep_file
from runners.redact import redact

JOB_FILE = "job.json"  # in a cell's run directory: the Slurm job that runs it


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
    stale_code: str | None = None  # FINISHED with other code than this checkout's: that code's label
    fresh: bool = False  # run from scratch (a new MLflow run): a stale cell rerun with rerun_stale

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
    tracking_source: str | None = None  # "tracking.uri" / "MLFLOW_TRACKING_URI" where given explicitly
    cluster_note: str = ""
    master: Any = field(repr=False, default=None)  # (hydra, master cfg) to launch with
    jobs: dict[str, Any] = field(default_factory=dict)  # run key -> runners.cluster.queue.JobOutcome
    sweep_dir: Path | None = None
    interrupted: bool = False  # Ctrl-C while waiting: jobs (and a server started here) keep running
    queued_s: float | None = None  # how long queueing every job array took
    code: str = ""  # this checkout's code version (``metric_names.code_version_label``)

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
    from runners.config.resources import RESOURCE_KEYS

    return tuple(res[k] for k in RESOURCE_KEYS)


def available_sweeps() -> list[str]:
    return sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml"))


# -- MLflow: which cells are done ------------------------------------------------------------------------
class RunRecord(NamedTuple):
    """The newest MLflow run of a cell: its status and the code it ran (``runners.tracking.code_version_tags``)."""

    status: str
    version: str | None = None
    revision: str | None = None

    @property
    def code(self) -> str:
        return metric_names.code_version_label(self.version, self.revision)


def _existing_runs(uri: str, experiment: str, source: str | None = None) -> dict[str, RunRecord]:
    """run key -> status and code version of the newest run with that key (one query for the experiment).

    A sqlite store is read with one SQL query (no mlflow import: the dry run stays fast). The sweep's own
    server (``source`` None), when down, is read through its sqlite file, this home's; a URI given by
    ``source`` (``tracking.uri``, ``MLFLOW_TRACKING_URI``) must answer (``ConfigError`` naming it); a damaged
    sqlite file is ``BrokenStore`` (``runners.sqlite_store.check_sqlite_store``)."""
    from runners import tracking_server

    db = _sqlite_file(uri)
    if db is None and uri.startswith("http") and not tracking_server.is_up(uri):
        if source is not None:
            raise ConfigError(source, f"no MLflow server answers at {redact(uri)}: cannot tell which cells finished")
        db = _sqlite_file(tracking_server.store_uri())
    if db is not None:
        sqlite_store.check_sqlite_store(db)  # damaged or half-built: BrokenStore naming the file and the way out
        try:
            return _existing_runs_sql(db, experiment) if db.exists() else {}
        except sqlite3.Error:
            pass  # an unexpected schema: ask MLflow
    client = tracking._client(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return {}
    out: dict[str, tuple[int, RunRecord]] = {}
    token = None
    while True:
        page = client.search_runs([exp.experiment_id], max_results=5000, page_token=token)
        for r in page:
            tags = r.data.tags
            key = tags.get(metric_names.TAG_RUN_KEY)
            if key and (key not in out or r.info.start_time > out[key][0]):
                record = RunRecord(
                    r.info.status, tags.get(metric_names.TAG_PACKAGE_VERSION), tags.get(metric_names.TAG_GIT_REVISION)
                )
                out[key] = (r.info.start_time, record)
        token = page.token
        if not token:
            break
    return {k: v[1] for k, v in out.items()}


def _sqlite_file(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None


def _existing_runs_sql(db: Path, experiment: str) -> dict[str, RunRecord]:
    query = """
        SELECT t.value, r.status, v.value, g.value FROM runs r
        JOIN experiments e ON e.experiment_id = r.experiment_id
        JOIN tags t ON t.run_uuid = r.run_uuid AND t.key = ?
        LEFT JOIN tags v ON v.run_uuid = r.run_uuid AND v.key = ?
        LEFT JOIN tags g ON g.run_uuid = r.run_uuid AND g.key = ?
        WHERE e.name = ? AND r.lifecycle_stage = 'active'
        ORDER BY r.start_time"""
    keys = (metric_names.TAG_RUN_KEY, metric_names.TAG_PACKAGE_VERSION, metric_names.TAG_GIT_REVISION)
    with sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True) as con:
        rows = con.execute(query, (*keys, experiment)).fetchall()
    return {key: RunRecord(*rest) for key, *rest in rows}  # newest last wins


def same_code(run: RunRecord, current: RunRecord) -> bool:
    """Whether a run came from the code checked out here: the git revisions when both are known (a
    dirty tree's revision carries a hash of its diff), else the package versions; a run that recorded
    neither comparable part counts as other code."""

    def known(v: str | None) -> bool:
        return bool(v) and v != "unknown"

    if known(run.revision) and known(current.revision):
        return run.revision == current.revision
    if known(run.version) and known(current.version):
        return run.version == current.version
    return False


# -- planning ----------------------------------------------------------------------------------------------
def plan(
    name: str,
    overrides: Sequence[str] = (),
    *,
    rerun_failed: bool = False,
    rerun_stale: bool = False,
    force: bool = False,
    check_mlflow: bool = True,
    check_cluster: bool = True,
) -> SweepPlan:
    """Compose and validate every cell of sweep ``name``; decide which ones to run.

    A FINISHED cell whose run came from other code than this checkout's (``same_code``) is named in
    the plan and skipped, or with ``rerun_stale`` run again from scratch. With ``launcher=slurm``
    every distinct resource request is checked against the cluster (``check_cluster``; skipped with
    a note when there is no ``sbatch``)."""
    if name not in available_sweeps():
        raise ConfigError("sweep", f"unknown sweep {name!r}; available: {', '.join(available_sweeps())}")
    check_sweep_file(SWEEPS_DIR / f"{name}.yaml")
    p = _compose_cells(name, list(overrides))
    if not p.cells:  # an axis such as range(3,3), on the command line or in the file
        raise ConfigError("hydra.sweeper.params", f"the grid of sweep {name!r} has no cells: an axis has no values")
    existing = _existing_runs(p.tracking_uri, p.experiment, p.tracking_source) if check_mlflow else {}
    current = RunRecord("", tracking.package_version(), tracking.git_revision())
    p.code = current.code
    _decide(p.cells, existing, rerun_failed=rerun_failed, force=force, rerun_stale=rerun_stale, current=current)
    if p.launcher == "slurm" and not force:
        _attach_active_jobs(p)
    if p.launcher == "slurm" and check_cluster:
        p.cluster_note = check_cluster_limits(p)
    return p


def _compose_cells(name: str, user: list[str]) -> SweepPlan:
    """The plan's cells, composed and validated (each distinct config once), all to run."""
    from runners.config.resources import cell_resources
    from runners.run import tracking_uri, uri_source

    sweep_free = [o for o in user if not _is_sweep_syntax(o)]
    # hydra.mode=MULTIRUN reaches every job (as with `-m`): runners.main.task then reports instead of raising
    hydra, master = master_hydra([f"+sweeps={name}", SEARCHPATH_OVERRIDE, "hydra.mode=MULTIRUN", *sweep_free])
    base = [f"+sweeps={name}", *sweep_free]
    cells_overrides = expand_grid(
        master, [o for o in user if _is_sweep_syntax(o)], hydra.config_loader, fixed_overrides=sweep_free
    )
    composer = Composer(hydra, master, base)
    cells: list[Cell] = []
    validated: set[str] = set()
    first = None  # (tracking URI, experiment, launcher, tracking kind, where the URI came from) of the first cell
    for ov in cells_overrides:
        composed = composer.compose(ov)
        cfg, data = composed.cfg, composed.data
        try:
            if data is None or composed.check not in validated:
                validate(cfg)
                validated.add(composed.check)
            check_seed(cfg)  # the one key validate leaves out (runners.config.grid)
        except ConfigError as err:
            raise ConfigError(err.key, f"{err.reason} (in cell: {' '.join(ov) or '<base>'})") from None
        if first is None:
            first = (tracking_uri(cfg), str(cfg.experiment), str(cfg.launcher.name), str(cfg.tracking.kind))
            first += (uri_source(cfg),)
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
    uri, experiment, launcher_name, tracking_kind, source = first or (None, None, "?", "?", None)
    return SweepPlan(
        name=name,
        experiment=experiment or name,
        tracking_uri=uri or paths.default_tracking_uri(),
        cells=cells,
        base_overrides=base,
        launcher=launcher_name,
        tracking_kind=tracking_kind,
        tracking_source=source,
        master=(hydra, master),
    )


def _decide(
    cells: list[Cell],
    existing: dict[str, RunRecord],
    *,
    rerun_failed: bool,
    force: bool,
    rerun_stale: bool = False,
    current: RunRecord | None = None,
) -> None:
    """Each cell's action from its MLflow status and code version (module docstring of ``runners.sweep``)."""
    seen: set[str] = set()
    for cell in cells:
        record = existing.get(cell.key)
        cell.mlflow_status = record.status if record else None
        if record and record.status == "FINISHED" and current and not same_code(record, current):
            cell.stale_code = record.code
        if cell.key in seen:
            cell.action = "skip-duplicate"
        elif force:
            cell.action = "run"
        elif cell.mlflow_status == "FINISHED":
            cell.fresh = bool(cell.stale_code and rerun_stale)
            cell.action = "run" if cell.fresh else "skip-finished"
        elif cell.mlflow_status == "FAILED" and not rerun_failed:
            cell.action = "skip-failed"
        seen.add(cell.key)


def _attach_active_jobs(p: SweepPlan) -> None:
    """Cells whose Slurm job from an earlier launch is still queued or running are waited for, not
    submitted again (``attach``): e.g. after Ctrl-C, or a lost login session, during a sweep."""
    from runners.cluster.queue import FINAL_STATES, queue_states
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
    from runners.cluster.resources import Cluster, check_request

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
            raise ConfigError(err.key, f"{err.reason} (cells: {names})") from None
    return f"cluster checked: {len(groups)} distinct request(s) fit (scontrol, sbatch --test-only)"


def _is_sweep_syntax(override: str) -> bool:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_override(override).is_sweep_override()


def format_plan(p: SweepPlan) -> str:
    """The dry-run table: one line per cell with its overrides, action and requested resources."""
    from runners.config.resources import gpu_hours
    from runners.perf.cpu_cost import cpu_estimate_text

    lines = [
        f"sweep {p.name!r}: {len(p.cells)} cells -> experiment {p.experiment!r} at {redact(p.tracking_uri)} "
        f"(launcher {p.launcher}, tracking {p.tracking_kind})"
    ]
    hours = 0.0
    for i, c in enumerate(p.cells):
        r = c.resources
        res = f"nodes={r['nodes']} gpus/node={r['gpus_per_node']} cpus={r['cpus_per_task']} mem={r['mem_gb']}G time={r['time_min']}m"
        stale = f"  | finished with other code: {c.stale_code}" if c.stale_code else ""
        lines.append(f"  [{i:>3}] {c.action:<15} {c.label:<22} {c.axes or '<base>'}  | {res}{stale}")
        if c.action == "run":
            hours += gpu_hours(r)
    done = sum(c.action == "skip-finished" for c in p.cells)
    stale, rerun = (sum(bool(c.stale_code) and c.action == a for c in p.cells) for a in ("skip-finished", "run"))
    if stale or rerun:
        lines.append(
            f"{stale + rerun} finished cell(s) ran other code than this checkout ({p.code}): "
            + (f"{rerun} rerun from scratch" if rerun else "kept; --rerun-stale to rerun them")
        )
    failed = sum(c.action == "skip-failed" for c in p.cells)
    attached = sum(c.action == "attach" for c in p.cells)
    if attached:
        lines.append(f"{attached} cell(s) still queued or running from an earlier launch: waited for, not resubmitted")
    if p.launcher != "local":
        lines.append(f"{len(p.groups())} job array(s), one per distinct resource request")
    if p.cluster_note:
        lines.append(p.cluster_note)
    if p.launcher == "local" and (to_run := [c.config for c in p.cells if c.action == "run"]):
        lines.append(cpu_estimate_text(to_run, int(to_run[0]["launcher"]["parallel"])))
    lines.append(
        f"{len(p.to_run)} to run, {done} already finished in MLflow (skipped), {failed} failed (skipped; "
        f"--rerun-failed to retry); estimated <= {hours:.1f} GPU-hours (time limit x GPUs)"
    )
    return "\n".join(line for line in lines if line)
