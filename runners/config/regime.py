"""The off-policy regime of a cell, named from the settings that make it (torch-free).

A regime is how far the updates of one iteration drift from the policy that sampled its responses:
several epochs or mini-batches per rollout (the policy moves between optimiser steps), a sampler some
iterations behind the trained policy (asynchronous RL), a sampler in a lower precision than the trainer
(an inference engine in bf16 beside an fp32 trainer). ``regime_label`` names it from those settings, so the
name a run is tagged with (``metric_names.TAG_REGIME``) is what it ran, whether the settings came from a
``regime=`` preset (``conf/regime/``) or were written by hand.

    regime_label(cfg)   # "on-policy", "4 epochs x 4 mini-batches", "stale k=2", "bfloat16 sampler", or
                        # several joined by " + " ("2 epochs x 2 mini-batches + stale k=1")
"""

from __future__ import annotations

from typing import Any

ON_POLICY = "on-policy"


def regime_label(cfg: Any) -> str:
    """The regime of a composed config (a DictConfig or its resolved dict); see the module docstring."""
    trainer, rollout, model = cfg["trainer"], cfg["rollout"], cfg["model"]
    epochs = int(trainer["ppo_epochs"])
    per_step, per_mini = int(trainer["prompts_per_step"]), int(trainer["mini_batch_prompts"])
    minis = max(1, per_step // per_mini) if per_mini > 0 else 1
    parts = []
    if epochs > 1 or minis > 1:
        parts.append(f"{epochs} epoch{'s' * (epochs != 1)} x {minis} mini-batch{'es' * (minis != 1)}")
    staleness = int(rollout.get("staleness", 0) or 0)
    if staleness > 0:
        parts.append(f"stale k={staleness}")
    sampler = str(rollout.get("dtype", "auto") or "auto")
    if sampler not in ("auto", str(model["dtype"])):
        parts.append(f"{sampler} sampler")
    return " + ".join(parts) or ON_POLICY
