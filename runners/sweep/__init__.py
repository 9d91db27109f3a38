"""Sweeps: expand a sweep file into cells, skip what is done, launch the rest, report outcomes.

``trustbench sweep NAME`` composes ``sweeps/NAME.yaml`` (a Hydra experiment file carrying
``hydra.sweeper.params``), expands the grid exactly like Hydra's BasicSweeper (cartesian product
of the sweep params and any sweep syntax on the command line), composes and validates EVERY cell
before anything starts, looks up each cell's MLflow run by its run key (one query for the whole
experiment), and hands only the cells that still need to run to the configured Hydra launcher
plugin (basic, submitit_local, submitit_slurm). Hydra's own sweeper cannot skip cells and it
only instantiates sweepers from the ``hydra_plugins`` namespace, hence this driver; the jobs
themselves are ordinary Hydra jobs (``runners.main.task``).

Three steps, one module each:

- ``planning``: the cells and what to do with each. FINISHED -> skip (named when its run came
  from other code than this checkout's; ``rerun_stale`` reruns those from scratch); FAILED -> skip unless
  ``rerun_failed``; anything else (never started, RUNNING or KILLED from an interrupted attempt) ->
  run, resuming its checkpoint; ``force`` reruns everything from scratch (old checkpoints removed,
  a new MLflow run). Cells are composed with ``runners.config.grid.Composer`` (once per combination
  of config-group overrides; ``tests/test_sweep_plan.py`` checks it equals Hydra's full composition).
- ``launching`` (``launch``): Hydra's submitit launcher takes one set of resources per launch, so
  cells are grouped by the resources they request (``runners.config.resources``: model size, backend,
  ``launcher.*``), every group is checked against the cluster before anything is queued
  (``runners.cluster.resources``), each group is queued as one job array and the command then waits
  for all jobs (``runners.cluster.queue``). ``launcher=local`` runs the cells
  in this process, or with ``launcher.parallel=N`` N at a time in child processes (``local_pool``).
- ``results``: every cell's status marker read back (Hydra and submitit report a failed cell as a
  completed job), one line per cell.

    from runners import sweep
    p = sweep.plan("demo", ["seed=0,1"])      # composes and validates every cell; raises ConfigError
    print(sweep.format_plan(p))
    sweep.launch(p)
    bad = sweep.report_outcomes(p)
"""

from __future__ import annotations

from runners.sweep.launching import SUBMITTED, launch
from runners.sweep.planning import (
    JOB_FILE,
    Cell,
    RunRecord,
    SweepPlan,
    _existing_runs,
    _existing_runs_sql,
    available_sweeps,
    check_cluster_limits,
    format_plan,
    plan,
    same_code,
)
from runners.sweep.results import outcomes, report_outcomes

__all__ = [
    "JOB_FILE",
    "SUBMITTED",
    "Cell",
    "RunRecord",
    "SweepPlan",
    "_existing_runs",
    "_existing_runs_sql",
    "available_sweeps",
    "check_cluster_limits",
    "format_plan",
    "launch",
    "outcomes",
    "plan",
    "report_outcomes",
    "same_code",
]
