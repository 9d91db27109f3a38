"""verl workers with the trustbench hooks: the engine's extra outputs and the actor's loss function.

Design: verl 0.9.1's ``ActorRolloutRefWorker`` builds its actor as ``self.actor_worker_cls(config)``
(a ``TrainingWorker`` owning the engine) and installs ``partial(ppo_loss, config=actor_config)`` as
the actor's loss in ``init_model``. Two small subclasses hook in there and nowhere else:

- ``TrustbenchTrainingWorker`` makes its engine a ``sparse_old.TrustbenchOutputsMixin`` (old-pass
  top-K, update-pass logits; inert unless the trustbench trainer flags a batch);
- ``TrustbenchActorRolloutRefWorker`` (``actor_worker_cls`` = the above) swaps the actor's loss for
  ``plugins_ppo_loss.trustbench_ppo_loss`` (verl's ``ppo_loss`` plus the trustbench inputs),
  keeping the same ``ActorConfig``, and tells the trainer its ceiling for the Roofline points
  (``roofline_ceiling``: where the work runs).

The trainer selects the worker class (``plugins_trainer``: ``trainer.v1.trainer_mode=trustbench_sync``);
verl's own reference and critic workers are unchanged.

Tests: ``pytest tests/verl/test_plugins_controllers.py`` (the loss swap); the engine hook in
``tests/verl/test_plugins_engine.py``.
"""

from __future__ import annotations

from functools import partial

from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker
from verl.workers.utils.losses import ppo_loss

from runners.backends.verl.plugins.config import is_trustbench_loss
from runners.backends.verl.plugins.ppo_loss import trustbench_ppo_loss
from runners.backends.verl.plugins.sparse_old import install_trustbench_outputs


class TrustbenchTrainingWorker(TrainingWorker):
    """verl's ``TrainingWorker`` whose engine adds the trustbench outputs when a batch asks for them."""

    def __init__(self, config) -> None:
        super().__init__(config)
        if hasattr(type(self.engine), "prepare_model_outputs"):  # FSDP-style engines; others fail loudly later
            install_trustbench_outputs(self.engine)


class TrustbenchActorRolloutRefWorker(ActorRolloutRefWorker):
    """verl's hybrid worker with ``TrustbenchTrainingWorker`` actors and the trustbench actor loss."""

    actor_worker_cls = TrustbenchTrainingWorker

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        super().init_model()
        if self.actor is None:
            return
        base = self.loss_fn
        config = base.keywords.get("config") if isinstance(base, partial) else None
        if not isinstance(base, partial) or base.func is not ppo_loss:
            if config is not None and is_trustbench_loss(config.policy_loss):
                raise ValueError(
                    "trustbench policy losses do not support verl's distillation loss (distillation.enabled)"
                )
            return
        self.loss_fn = partial(trustbench_ppo_loss, config=config)
        self.actor.set_loss_fn(self.loss_fn)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def roofline_ceiling(self) -> dict | None:
        """This worker's ceiling (``runners.perf.hardware.machine_ceiling``: its GPU's table row, or its CPU
        measured with its torch threads, cached per machine) as a dict, None for an unlisted GPU."""
        import dataclasses

        import torch

        from runners.perf.hardware import machine_ceiling

        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        ceiling = machine_ceiling(device)
        return None if ceiling is None else dataclasses.asdict(ceiling)


__all__ = ["TrustbenchActorRolloutRefWorker", "TrustbenchTrainingWorker"]
