"""Roofline points of verl runs: the built-in trainer's ``perf/<phase>_*`` and ``perf/peak_*`` for verl's steps.

Design: the same numbers from the same code (``runners.perf.roofline``) on verl's batch. The trustbench
trainer (``plugins_trainer``) calls ``StepRoofline.metrics`` in ``_compute_metrics`` with the step's real
prompt lengths (the jagged ``prompts`` field) and response lengths (``response_mask``), padding rows
left out, and verl's ``timing_raw`` (``gen``, ``old_log_prob``, ``update_actor``). The model's shape is
built from its config on the meta device, with the dtype the actor computes in (the FSDP engine's
``mixed_precision.param_dtype``, bf16 unless set; CPU mode sets fp32); the ceiling comes from the actor
worker (``TrustbenchActorRolloutRefWorker.roofline_ceiling``: the GPU table's row for its GPU, or its
CPU measured with its torch threads), since the driver may run where the work does not.
``perf/mfu/actor`` stays verl's own (its ``FlopsCounter`` against its device table).

    roofline = StepRoofline.for_trainer(trainer)      # None when the model's shape cannot be read
    metrics.update(roofline.metrics(prompts, responses, timing_raw))
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from runners.perf.flops import TransformerShape
from runners.perf.hardware import Ceiling
from runners.perf.roofline import optimizer_steps, phase_work, roofline_metrics

logger = logging.getLogger(__name__)
# bytes per element of verl's FSDP mixed-precision param_dtype names
DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}


def compute_bytes(config: Any) -> int:
    """Bytes per element of the dtype the actor computes in (verl's FSDP default: bf16)."""
    dtype = OmegaConf.select(config, "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype")
    return DTYPE_BYTES.get(str(dtype or "bf16").lower(), 2)


def update_shape(config: Any) -> tuple[int, int]:
    """(epochs, optimiser steps) of one actor update from verl's batch settings (both in prompts)."""
    actor = config.actor_rollout_ref.actor
    epochs = int(actor.ppo_epochs)
    prompts = int(config.data.train_batch_size)
    share = int(actor.ppo_mini_batch_size) / max(prompts, 1)
    return epochs, optimizer_steps(prompts, epochs, share)


@dataclass(frozen=True)
class StepRoofline:
    shape: TransformerShape
    ceiling: Ceiling | None
    epochs: int
    steps: int

    @classmethod
    def for_trainer(cls, trainer: Any) -> StepRoofline | None:
        """From the trainer's config and its actor workers (after ``init_workers``)."""
        config = trainer.config
        model = config.actor_rollout_ref.model
        try:
            shape = TransformerShape.from_pretrained_config(
                str(model.path),
                bytes_per_param=compute_bytes(config),
                trust_remote_code=bool(model.get("trust_remote_code", False)),
            )
        except Exception as exc:  # an architecture without the usual decoder config: no points, as built-in
            logger.warning("no Roofline points: the shape of %s cannot be read (%s)", model.path, exc)
            return None
        ceilings = []
        workers = getattr(trainer, "actor_rollout_wg", None)
        if workers is not None and hasattr(workers, "roofline_ceiling"):
            ceilings = [c for c in workers.roofline_ceiling() if c]
        epochs, steps = update_shape(config)
        return cls(shape, Ceiling(**ceilings[0]) if ceilings else None, epochs, steps)

    def metrics(self, prompts: Sequence[int], responses: Sequence[int], timing_raw: dict) -> dict[str, float]:
        """The step's Roofline points and ceilings (``timing_raw``: verl's phase name -> wall seconds)."""
        work = phase_work(
            self.shape, prompts, responses, old_pass="old_log_prob" in timing_raw, epochs=self.epochs, steps=self.steps
        )
        timing = {f"timing_s/{phase}": float(seconds) for phase, seconds in timing_raw.items()}
        return roofline_metrics(work, timing, self.ceiling, mfu=False)


__all__ = ["StepRoofline", "compute_bytes", "update_shape"]
