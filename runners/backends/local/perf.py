"""Per-step MFU and Roofline points of the built-in trainer (``perf/mfu/actor``, ``perf/<phase>_*``):
``runners.perf.roofline`` on the real prompt and response lengths of its ``RolloutBatch``."""

from __future__ import annotations

import torch

from runners.backends.local.rollout import RolloutBatch
from runners.models.sampler import first_of_equal_rows
from runners.perf.flops import TransformerShape
from runners.perf.hardware import Ceiling
from runners.perf.roofline import optimizer_steps, phase_work, roofline_metrics


def model_shape(model) -> TransformerShape | None:
    """The model's shape for FLOP counting, or None for a model without the usual decoder config."""
    try:
        return TransformerShape.from_model(model)
    except (AttributeError, TypeError):
        return None


def batch_work(
    shape: TransformerShape,
    batch: RolloutBatch,
    *,
    old_pass: bool,
    epochs: int,
    mini_batch_share: float,
    packed: bool = False,
) -> dict[str, tuple[float, float]]:
    """``phase_work`` of the batch: its real prompt and response lengths, its prompt groups' mini-batches.
    Rows with equal contexts share one prefill (the sampler) and, with ``packed`` (the forward of
    ``runners.backends.local.packed``), one run of the context in every forward."""
    context = batch.context_length
    prompts = batch.attention_mask[:, :context].sum(-1).tolist()
    responses = batch.response_mask.sum(-1).long().tolist()
    steps = optimizer_steps(len(set(batch.group_index.tolist())), epochs, mini_batch_share)
    first = first_of_equal_rows(batch.input_ids[:, :context], batch.attention_mask[:, :context])
    own = (first == torch.arange(len(prompts))).tolist()
    return phase_work(
        shape,
        prompts,
        responses,
        old_pass=old_pass,
        epochs=epochs,
        steps=steps,
        prefilled=own,
        own_prompt=own if packed else None,
    )


def perf_metrics(
    shape: TransformerShape | None,
    ceiling: Ceiling | None,
    batch: RolloutBatch,
    timing: dict[str, float],
    *,
    old_pass: bool,
    settings,
    packed: bool = False,
) -> dict[str, float]:
    """``roofline_metrics`` of the step; none for a model ``model_shape`` cannot read. ``settings``: UpdateSettings;
    ``packed``: the forwards run shared contexts once (``batch_work``)."""
    if shape is None:
        return {}
    work = batch_work(
        shape,
        batch,
        old_pass=old_pass,
        epochs=settings.ppo_epochs,
        mini_batch_share=settings.mini_batch_share,
        packed=packed,
    )
    return roofline_metrics(work, timing, ceiling)


__all__ = ["batch_work", "model_shape", "perf_metrics"]
