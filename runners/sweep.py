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
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from runners import paths, schema, tracking
from runners.config import SEARCHPATH_OVERRIDE, SWEEPS_DIR, ConfigError, method_label, run_key, run_name, validate


@dataclass
class Cell:
    """One grid cell of a sweep."""

    overrides: list[str]
    cfg: DictConfig
    key: str
    label: str
    name: str
    resources: dict[str, Any]
    mlflow_status: str | None = None
    action: str = "run"  # run | skip-finished | skip-failed

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
    master: Any = field(repr=False, default=None)  # (hydra, master cfg) to launch with

    @property
    def to_run(self) -> list[Cell]:
        return [c for c in self.cells if c.action == "run"]


def available_sweeps() -> list[str]:
    return sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml"))


def _hydra(overrides: Sequence[str]):
    """A Hydra instance and the composed MULTIRUN master config for ``overrides``."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    from runners.config import CONF_DIR, register_configs

    register_configs()
    GlobalHydra.instance().clear()
    hydra = Hydra.create_main_hydra2(task_name="trustbench", config_search_path=create_config_search_path(str(CONF_DIR)))
    master = hydra.compose_config("config", list(overrides), run_mode=RunMode.MULTIRUN, with_log_configuration=False)
    return hydra, master


def expand_grid(master: DictConfig, user_overrides: Sequence[str], config_loader) -> list[list[str]]:
    """Cells as override lists: sweep params x command-line sweeps (Hydra BasicSweeper semantics)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = master.hydra.sweeper.get("params") or {}
    arguments = [f"{k}={v}" for k, v in params.items()] + list(user_overrides)
    parsed = OverridesParser.create(config_loader=config_loader).parse_overrides(arguments)
    batches = BasicSweeper.split_arguments(parsed, None)
    return [list(cell) for batch in batches for cell in batch]


def _existing_runs(uri: str, experiment: str) -> dict[str, str]:
    """run key -> MLflow status of the newest run with that key (one query for the experiment)."""
    client = tracking._client(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return {}
    out: dict[str, tuple[int, str]] = {}
    token = None
    while True:
        page = client.search_runs([exp.experiment_id], max_results=5000, page_token=token)
        for r in page:
            key = r.data.tags.get(schema.TAG_RUN_KEY)
            if key and (key not in out or r.info.start_time > out[key][0]):
                out[key] = (r.info.start_time, r.info.status)
        token = page.token
        if not token:
            break
    return {k: v[1] for k, v in out.items()}


def plan(
    name: str,
    overrides: Sequence[str] = (),
    *,
    rerun_failed: bool = False,
    force: bool = False,
    check_mlflow: bool = True,
) -> SweepPlan:
    """Compose and validate every cell of sweep ``name``; decide which ones to run."""
    from runners.resources import cell_resources
    from runners.run import tracking_uri

    if name not in available_sweeps():
        raise ConfigError("sweep", f"unknown sweep {name!r}; available: {', '.join(available_sweeps())}")
    user = list(overrides)
    sweep_free = [o for o in user if not _is_sweep_syntax(o)]
    base = [f"+sweeps={name}", SEARCHPATH_OVERRIDE, *sweep_free]
    hydra, master = _hydra(base)
    cells_overrides = expand_grid(master, [o for o in user if _is_sweep_syntax(o)], hydra.config_loader)
    cells: list[Cell] = []
    for ov in cells_overrides:
        job_overrides = [f"+sweeps={name}", *sweep_free, *ov]
        cfg = hydra.config_loader.load_sweep_config(master, job_overrides)
        choices = dict(cfg.hydra.runtime.choices)
        OmegaConf.set_struct(cfg, False)
        del cfg["hydra"]
        try:
            validate(cfg)
        except ConfigError as err:
            raise ConfigError(err.key, f"{err} (in cell: {' '.join(ov) or '<base>'})") from None
        label = method_label(cfg, choices)
        cells.append(
            Cell(
                overrides=ov,
                cfg=cfg,
                key=run_key(cfg),
                label=label,
                name=run_name(cfg, label),
                resources=cell_resources(cfg),
            )
        )
    experiment = str(cells[0].cfg.experiment) if cells else name
    uri = tracking_uri(cells[0].cfg) if cells else paths.default_tracking_uri()
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
    return SweepPlan(name=name, experiment=experiment, tracking_uri=uri, cells=cells, base_overrides=base, master=(hydra, master))


def _is_sweep_syntax(override: str) -> bool:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_override(override).is_sweep_override()


def format_plan(p: SweepPlan) -> str:
    """The dry-run table: one line per cell with its overrides, action and requested resources."""
    lines = [f"sweep {p.name!r}: {len(p.cells)} cells -> experiment {p.experiment!r} at {p.tracking_uri}"]
    gpu_hours = 0.0
    for i, c in enumerate(p.cells):
        r = c.resources
        res = f"nodes={r['nodes']} gpus/node={r['gpus_per_node']} cpus={r['cpus_per_task']} mem={r['mem_gb']}G time={r['time_min']}m"
        lines.append(f"  [{i:>3}] {c.action:<15} {c.label:<22} {c.axes or '<base>'}  | {res}")
        if c.action == "run":
            gpu_hours += r["nodes"] * r["gpus_per_node"] * r["time_min"] / 60.0
    done = sum(c.action == "skip-finished" for c in p.cells)
    failed = sum(c.action == "skip-failed" for c in p.cells)
    lines.append(
        f"{len(p.to_run)} to run, {done} already finished in MLflow (skipped), {failed} failed (skipped; "
        f"--rerun-failed to retry); estimated <= {gpu_hours:.1f} GPU-hours (time limit x GPUs)"
    )
    return "\n".join(lines)


def launch(p: SweepPlan, *, force: bool = False) -> list[Any]:
    """Start the cells to run through the configured Hydra launcher; returns Hydra's JobReturns."""
    from hydra.core.callbacks import Callbacks
    from hydra.core.plugins import Plugins
    from hydra.types import HydraContext

    from runners.main import task

    cells = p.to_run
    if not cells:
        return []
    tracking.ensure_store(p.tracking_uri)  # once, before any parallel writer
    tracking.get_or_create_experiment(p.tracking_uri, p.experiment)
    if force:
        for cell in cells:
            shutil.rmtree(paths.run_dir(cell.key), ignore_errors=True)
    hydra, master = p.master
    sweep_dir = Path(master.hydra.sweep.dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(master, sweep_dir / "multirun.yaml")
    (sweep_dir / "cells.json").write_text(
        json.dumps([{"overrides": c.overrides, "key": c.key, "name": c.name} for c in cells], indent=2)
    )
    callbacks = Callbacks(master)
    launcher = Plugins.instance().instantiate_launcher(
        hydra_context=HydraContext(config_loader=hydra.config_loader, callbacks=callbacks),
        task_function=task,
        config=master,
    )
    job_overrides = [[f"+sweeps={p.name}", *p.base_overrides[2:], *c.overrides] for c in cells]
    if force:
        job_overrides = [[*ov, "force=true"] for ov in job_overrides]
    return list(launcher.launch(job_overrides, initial_job_idx=0))


def outcomes(p: SweepPlan) -> list[tuple[Cell, str, str]]:
    """(cell, status, reason) of every cell from its status marker (Hydra reports failures as completed)."""
    from runners.run import read_status

    out = []
    for cell in p.cells:
        st = read_status(paths.run_dir(cell.key)) or {}
        status = st.get("status", "MISSING")
        if cell.action == "skip-finished":
            status = "FINISHED"
        out.append((cell, status, st.get("reason", "")))
    return out


def report_outcomes(p: SweepPlan, stream=sys.stdout) -> int:
    """Print one line per cell; return the number of cells that did not finish."""
    bad = 0
    for cell, status, reason in outcomes(p):
        mark = "ok " if status == "FINISHED" else "!! "
        if status != "FINISHED":
            bad += 1
        extra = f"  ({reason})" if reason and status != "FINISHED" else ""
        print(f"{mark}{status:<10} {cell.label:<22} {cell.axes or '<base>'}{extra}", file=stream)
    return bad
