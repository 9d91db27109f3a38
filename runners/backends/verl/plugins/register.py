"""Entry module of the trustbench verl plugins: ``VERL_USE_EXTERNAL_MODULES=runners.backends.verl.plugins.register``.

verl 0.9.1 imports every module listed in ``VERL_USE_EXTERNAL_MODULES`` at the end of
``verl/__init__.py``, i.e. in every process that imports verl (driver, TaskRunner, Ray workers),
before any config is read. Importing this module registers, in verl's own registries:

- policy losses ``trustbench_<objective>`` (``plugins_losses``; ``LOSS_MODES``), each composing
  the library objective with the configured TRM / LN-TRM / SER mask and entropy controller;
- advantage estimators ``trustbench_<estimator>`` (``plugins_advantages``; ``ADV_ESTIMATORS``);
- the v1 trainer ``trustbench_sync`` (``plugins_trainer``), which carries the sparse old
  distribution, the logits and the per-iteration controller state through verl's data flow.

The trainer needs verl's v1 stack (TransferQueue, Ray); where that cannot be imported the losses
and estimators are still registered and ``TRAINER_IMPORT_ERROR`` says why the trainer is missing.

    VERL_USE_EXTERNAL_MODULES=runners.backends.verl.plugins.register python -m verl.trainer.main_ppo ...
    python -m runners.backends.verl.plugins.register          # prints the registered names

Tests: ``pytest tests/verl/test_plugins_registry.py``.
"""

from __future__ import annotations

import logging

from runners.backends.verl import ADV_ESTIMATORS, LOSS_MODES, TRAINER_MODE
from runners.backends.verl.plugins import advantages as _advantages  # noqa: F401  (registers estimators)
from runners.backends.verl.plugins import losses as _losses  # noqa: F401  (registers policy losses)

TRAINER_IMPORT_ERROR: Exception | None = None
try:
    from runners.backends.verl.plugins import trainer as _trainer  # noqa: F401  (registers trustbench_sync)
except ImportError as exc:  # e.g. TransferQueue missing: losses and estimators still work
    TRAINER_IMPORT_ERROR = exc
    logging.getLogger(__name__).warning("trustbench verl trainer %r not registered: %s", TRAINER_MODE, exc)


def registered_names() -> dict[str, list[str]]:
    """The trustbench names present in verl's registries (policy losses, estimators, trainers)."""
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY

    names = {
        "policy_loss": sorted(n for n in POLICY_LOSS_REGISTRY if n in LOSS_MODES),
        "adv_estimator": sorted(n for n in ADV_ESTIMATOR_REGISTRY if n in ADV_ESTIMATORS),
        "trainer": [],
    }
    if TRAINER_IMPORT_ERROR is None:
        from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

        names["trainer"] = sorted(n for n in TRAINER_REGISTRY if n == TRAINER_MODE)
    return names


if __name__ == "__main__":
    import json

    print(json.dumps(registered_names(), indent=2))
