"""Per-step MFU and Roofline points of the built-in trainer (``perf/mfu/actor``, ``perf/<phase>_*``).

The step's model FLOPs and modelled bytes per phase come from ``flops.TransformerShape`` on the real
prompt and response lengths of the batch; achieved TFLOP/s divide them by the phase's wall time;
the ceiling (``hardware.machine_ceiling``) is the GPU table's row or this CPU's measured peak. Metric
names: ``runners.metric_names`` (MFU_ACTOR, arithmetic_intensity, achieved_tflops, PEAK_*).
"""

from __future__ import annotations

import math

from runners import metric_names as names
from runners.backends.local.flops import TransformerShape
from runners.backends.local.hardware import Ceiling
from runners.backends.local.rollout import RolloutBatch


def model_shape(model) -> TransformerShape | None:
    """The model's shape for FLOP counting, or None for a model without the usual decoder config."""
    try:
        return TransformerShape.from_model(model)
    except (AttributeError, TypeError):
        return None


def phase_work(
    shape: TransformerShape, batch: RolloutBatch, *, old_pass: bool, epochs: int, mini_batch_share: float
) -> dict[str, tuple[float, float]]:
    """(model FLOPs, bytes) of each phase that ran: rollout, old_log_prob (when separate), update_actor."""
    groups = len(set(batch.group_index.tolist()))
    optimizer_steps = epochs * math.ceil(groups / max(1, math.ceil(groups * mini_batch_share)))
    prompts = batch.attention_mask[:, : batch.context_length].sum(-1).tolist()
    responses = batch.response_mask.sum(-1).long().tolist()
    lengths = [p + r for p, r in zip(prompts, responses)]
    work = {"rollout": (shape.generation_flops(prompts, responses), shape.generation_bytes(prompts, responses))}
    if old_pass:
        work["old_log_prob"] = (shape.forward_flops(lengths, responses), shape.forward_bytes(lengths, responses))
    train = shape.train_bytes(lengths, responses)
    work["update_actor"] = (
        epochs * shape.train_flops(lengths, responses),
        epochs * train + shape.optimizer_bytes(optimizer_steps),
    )
    return work


def perf_metrics(
    shape: TransformerShape | None,
    ceiling: Ceiling | None,
    batch: RolloutBatch,
    timing: dict[str, float],
    *,
    old_pass: bool,
    settings,
) -> dict[str, float]:
    """``roofline_metrics`` of the step; none for a model ``model_shape`` cannot read. ``settings``: UpdateSettings."""
    if shape is None:
        return {}
    work = phase_work(
        shape, batch, old_pass=old_pass, epochs=settings.ppo_epochs, mini_batch_share=settings.mini_batch_share
    )
    return roofline_metrics(work, timing, ceiling)


def roofline_metrics(
    work: dict[str, tuple[float, float]], timing: dict[str, float], ceiling: Ceiling | None
) -> dict[str, float]:
    """Roofline points per phase, the ceilings and ``perf/mfu/actor`` (see module doc)."""
    wall = {"rollout": names.TIMING_GEN, "old_log_prob": names.TIMING_OLD_LOG_PROB}
    out: dict[str, float] = {}
    for phase, (flops, moved) in work.items():
        seconds = timing.get(wall.get(phase, f"timing_s/{phase}"), 0.0)
        if flops <= 0 or seconds <= 0:
            continue
        out[names.arithmetic_intensity(phase)] = flops / moved
        out[names.achieved_tflops(phase)] = flops / seconds / 1e12
    if ceiling is not None:
        out[names.PEAK_TFLOPS] = ceiling.tflops
        out[names.PEAK_MEM_BW_TBS] = ceiling.mem_bw_tbs
        if names.achieved_tflops("update_actor") in out:
            out[names.MFU_ACTOR] = out[names.achieved_tflops("update_actor")] / ceiling.tflops
    return out


__all__ = ["model_shape", "perf_metrics", "phase_work", "roofline_metrics"]
