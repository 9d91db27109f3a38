"""Per-step Roofline points and MFU from a step's real lengths and phase times (``perf/<phase>_*``,
``perf/mfu/actor``), the same for every backend.

The step's model FLOPs and modelled bytes per phase come from ``flops.TransformerShape`` on the real
prompt and response lengths of the batch; achieved TFLOP/s divide them by the phase's wall time;
the ceiling (``hardware.machine_ceiling``, taken where the work runs) is the GPU table's row or the
CPU's measured peak. Metric names: ``runners.metric_names`` (MFU_ACTOR, arithmetic_intensity,
achieved_tflops, PEAK_*). The built-in trainer calls it through ``runners.backends.local.perf``, the
verl trainer plugin from its step metrics.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from runners import metric_names as names
from runners.perf.flops import TransformerShape
from runners.perf.hardware import Ceiling


def optimizer_steps(groups: int, epochs: int, mini_batch_share: float) -> int:
    """Optimiser steps of an update: ``epochs`` x the mini-batches of ``mini_batch_share`` of the prompt groups."""
    return epochs * math.ceil(groups / max(1, math.ceil(groups * mini_batch_share)))


def phase_work(
    shape: TransformerShape,
    prompts: Sequence[int],
    responses: Sequence[int],
    *,
    old_pass: bool,
    epochs: int,
    steps: int,
    prefilled: Sequence[bool] | None = None,
    own_prompt: Sequence[bool] | None = None,
) -> dict[str, tuple[float, float]]:
    """(model FLOPs, bytes) of each phase that ran: rollout, old_log_prob (when separate), update_actor
    (``epochs`` passes over the batch, ``steps`` optimiser steps in all). Rows sharing a prompt
    (``flops`` module doc): ``prefilled`` False for a row whose prompt the sampler prefilled for another,
    ``own_prompt`` False for one whose prompt the forwards run for another; default: every row its own."""
    lengths = [p + r for p, r in zip(prompts, responses)]
    computed = None if own_prompt is None else [n if own else r for n, r, own in zip(lengths, responses, own_prompt)]
    work = {
        "rollout": (
            shape.generation_flops(prompts, responses, prefilled),
            shape.generation_bytes(prompts, responses, prefilled),
        )
    }
    if old_pass:
        work["old_log_prob"] = (
            shape.forward_flops(lengths, responses, computed),
            shape.forward_bytes(lengths, responses, computed),
        )
    train = shape.train_bytes(lengths, responses, computed)
    work["update_actor"] = (
        epochs * shape.train_flops(lengths, responses, computed),
        epochs * train + shape.optimizer_bytes(steps),
    )
    return work


# each phase's wall-time metric (``roofline_metrics`` divides the phase's FLOPs by it)
PHASE_WALL = {
    "rollout": names.TIMING_GEN,
    "old_log_prob": names.TIMING_OLD_LOG_PROB,
    "update_actor": names.TIMING_UPDATE_ACTOR,
}


def phase_flops(metrics: dict[str, float]) -> float:
    """A step's model FLOPs, back from its Roofline points: achieved TFLOP/s x the phase's wall time, summed
    over the phases that ran (0 without Roofline metrics)."""
    total = 0.0
    for phase, wall in PHASE_WALL.items():
        tflops, seconds = metrics.get(names.achieved_tflops(phase)), metrics.get(wall)
        if tflops is not None and seconds:
            total += tflops * 1e12 * seconds
    return total


def roofline_metrics(
    work: dict[str, tuple[float, float]], timing: dict[str, float], ceiling: Ceiling | None, *, mfu: bool = True
) -> dict[str, float]:
    """Roofline points per phase (``timing``: metric name -> wall seconds), the ceilings and, with ``mfu``,
    ``perf/mfu/actor`` (see module doc)."""
    out: dict[str, float] = {}
    for phase, (flops, moved) in work.items():
        seconds = timing.get(PHASE_WALL[phase], 0.0)
        if flops <= 0 or seconds <= 0:
            continue
        out[names.arithmetic_intensity(phase)] = flops / moved
        out[names.achieved_tflops(phase)] = flops / seconds / 1e12
    if ceiling is not None:
        out[names.PEAK_TFLOPS] = ceiling.tflops
        out[names.PEAK_MEM_BW_TBS] = ceiling.mem_bw_tbs
        if mfu and names.achieved_tflops("update_actor") in out:
            out[names.MFU_ACTOR] = out[names.achieved_tflops("update_actor")] / ceiling.tflops
    return out


__all__ = ["PHASE_WALL", "optimizer_steps", "phase_flops", "phase_work", "roofline_metrics"]
