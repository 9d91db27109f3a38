"""Estimated CPU time of cells on the built-in trainer with the embedded default (torch-free).

The costs were measured on the 2-core reference machine (``EMBEDDED_CPU_COST``); ``trustbench sweep
--dry-run`` prints ``cpu_estimate_text`` for the cells it would run. Other backends and models have no
estimate (their cost was not measured).
"""

from __future__ import annotations

from typing import Any

from runners.config.regime import ON_POLICY, regime_label

# CPU seconds of one 1-thread cell, per part, measured on the 2-core reference machine (the first cells of
# sweeps/stability_map_cpu.yaml, 16 prompts x 8 responses per step, timing_cpu_s/* metrics): process start-up
# and model load; per step the fixed overhead, sampling per response, the old-log-prob pass per response
# (on-policy it comes from the update's forward and is nearly free), the update per response and epoch
# (timing_cpu_s/update_actor: 0.145 s for 128 responses x 1 epoch, 0.656 s for 128 x 4 epochs of 4
# mini-batches); each evaluation per sample (timing_s/testing: 0.53 s for 128 problems x 4 samples).
EMBEDDED_CPU_COST = {
    "startup": 8.0,
    "step": 0.05,
    "sample": 0.077 / 128,
    "old_pass": 0.062 / 128,
    "old_pass_on_policy": 0.021 / 128,
    "update": 0.15 / 128,
    "eval": 0.53 / 512,
}


def cpu_seconds(cfg: Any) -> float | None:
    """Estimated CPU seconds of one cell (a resolved config dict) on the built-in trainer with the embedded
    default (``EMBEDDED_CPU_COST``); None for other backends and models, whose cost was not measured."""
    model, trainer, backend = cfg["model"], cfg["trainer"], cfg["backend"]
    if backend["name"] != "local" or model["kind"] != "embedded":
        return None
    c = EMBEDDED_CPU_COST
    responses = int(trainer["prompts_per_step"]) * int(trainer["n"])
    epochs = int(trainer["ppo_epochs"])
    old = c["old_pass_on_policy"] if regime_label(cfg) == ON_POLICY else c["old_pass"]
    step = c["step"] + responses * (c["sample"] + old + c["update"] * epochs)
    steps = int(trainer["total_steps"])
    every = int(trainer.get("eval_every") or 0)
    evals = (steps // every + 1) if every > 0 else 0
    samples = int(cfg["dataset"].get("eval_limit") or 0) * int(trainer.get("eval_n") or 1)
    return c["startup"] + steps * step + evals * samples * c["eval"]


def cpu_estimate_text(configs: list[Any], parallel: int) -> str:
    """The dry run's line for the cells to run: estimated CPU hours and wall hours at ``parallel`` cells at a
    time ("" when no cell's cost is known)."""
    known = [s for s in (cpu_seconds(c) for c in configs) if s is not None]
    if not known:
        return ""
    total = sum(known)
    unknown = (
        f" ({len(configs) - len(known)} cell(s) of other models or backends not counted)"
        if len(known) < len(configs)
        else ""
    )
    wall = total / max(1, parallel)

    def hours(seconds: float) -> str:
        return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"

    return (
        f"estimated CPU time of the {len(known)} cell(s) to run: {hours(total)} of CPU, about {hours(wall)} at "
        f"{parallel} cell(s) at a time (built-in trainer on the embedded default, costs measured on 2 cores){unknown}"
    )
