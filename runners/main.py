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

from runners.config import CONF_DIR, register_configs
from runners.run import Preempted, RunFailed, run

log = logging.getLogger("trustbench")


def task(cfg: DictConfig) -> dict:
    """One Hydra job. In a multirun a failed cell returns its status instead of raising, so the
    other cells still run; ``trustbench sweep`` reads every cell's status marker afterwards."""
    hc = HydraConfig.get()
    choices = dict(hc.runtime.choices)
    if hc.mode != RunMode.MULTIRUN:
        return run(cfg, choices)
    try:
        return run(cfg, choices)
    except RunFailed as err:
        log.error("%s", err)
        return {"status": "FAILED", "error": str(err)}
    except Preempted:
        from runners.launch import requeue_or_fail

        return requeue_or_fail(cfg)


register_configs()
main = hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")(task)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
