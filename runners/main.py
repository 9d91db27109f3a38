"""The thin Hydra entry point: ``@hydra.main`` around ``runners.run.run``.

``trustbench run OVERRIDES`` calls ``main()`` (one cell; any Hydra flag works, e.g. ``--cfg job``);
``trustbench sweep`` hands ``task`` to Hydra's launcher for each cell (``runners.sweep``).
Equivalent plain Hydra call:  ``python -m runners.main algorithm=gspo objective=troll``.
"""

from __future__ import annotations

import logging
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from runners.cell_lock import CellBusy
from runners.config import CONF_DIR, ConfigError, register_configs
from runners.redact import redact
from runners.run import Preempted, RunFailed, run

log = logging.getLogger("trustbench")


def task(cfg: DictConfig) -> dict:
    """One Hydra job. In a multirun a failed cell returns its status instead of raising, so the
    other cells still run; ``trustbench sweep`` reads every cell's status marker afterwards.

    In a submitit job trustbench takes over the stop signals from submitit first
    (``runners.cluster.job``), records the attempt (``start_attempt``: job id, restart count, visible
    GPUs) and fails a cell requeued more than ``launcher.max_requeues`` times. A cell stopped by a
    signal asks Slurm to requeue it (``requeue_or_fail``); in a Slurm job it then exits without a
    result, so the sweep keeps waiting for the requeued run."""
    hc = HydraConfig.get()
    choices = dict(hc.runtime.choices)
    if hc.mode != RunMode.MULTIRUN:
        return _run_one(cfg, choices)
    from runners.cluster import job
    from runners.run import catch_stop_signals

    if job.in_submitit_job():
        catch_stop_signals()
    refused = job.start_attempt(cfg)
    if refused is not None:
        return refused
    try:
        return run(cfg, choices)
    except ConfigError as err:  # found while building the cell: no MLflow run, the marker says CONFIG_ERROR
        log.error("configuration error: %s", redact(str(err)))
        return {"status": "CONFIG_ERROR", "error": redact(str(err))}
    except CellBusy as err:
        log.error("%s", redact(str(err)))
        return {"status": "BUSY", "error": redact(str(err))}
    except RunFailed as err:
        log.error("%s", redact(str(err)))
        return {"status": "FAILED", "error": redact(str(err))}
    except Preempted as err:
        log.warning("%s", err)
        outcome = job.requeue_or_fail(cfg, signal=err.signal)
        if outcome["status"] in ("REQUEUED", "PREEMPTED") and job.slurm_job_id() is not None:
            log.warning("stopped by %s: %s; exiting without a result", err.signal, outcome["status"])
            raise SystemExit(0) from None
        return outcome


def _run_one(cfg: DictConfig, choices: dict) -> dict:
    """``trustbench run``: one message and an exit code (2: configuration, 1: the run did not finish),
    never Hydra's traceback (it catches every ``Exception``; ``SystemExit`` passes through). A cell
    already finished in MLflow is not run again, and the command says so (exit 0)."""
    try:
        outcome = run(cfg, choices)
        if outcome.get("status") == "SKIPPED":
            print(
                f"trustbench: run {outcome['name']!r} (key {outcome['run_key']}) already finished in MLflow "
                f"(run {outcome['run_id']}); nothing to do (force=true runs it again from scratch)"
            )
        return outcome
    except ConfigError as err:
        print(f"trustbench: configuration error: {redact(str(err))}", file=sys.stderr)
        raise SystemExit(2) from None
    except (RunFailed, Preempted, CellBusy) as err:
        print(f"trustbench: {redact(str(err))}", file=sys.stderr)
        raise SystemExit(1) from None


register_configs()
main = hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")(task)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
