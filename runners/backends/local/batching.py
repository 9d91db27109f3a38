"""How the built-in trainer cuts one iteration's batch: mini-batches, micro-batches, the policy loss's mask.

Mini-batches are whole prompt groups, shuffled with a seeded generator (GTPO compares the responses
of a group, and group estimators normalise within it); a mini-batch is one optimiser step.
Micro-batches split a mini-batch into about ``micro_batch_size`` rows for gradient accumulation,
again keeping groups whole; the loss of each is aggregated with the mini-batch's counts so they add
up to the mini-batch loss. T-PPO may leave the last k tokens of unfinished responses out of the
policy loss (``policy_mask``, T-PPO arXiv 2506.15050 section 3).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def micro_rows(batch_rows: int, micro_batch_size: int) -> int:
    """Rows per forward of a no-grad pass: ``micro_batch_size``, or all rows when it is 0."""
    return micro_batch_size if micro_batch_size and micro_batch_size > 0 else batch_rows


def policy_mask(response_mask: Tensor, finished: Tensor, *, truncated: bool, drop_last_k: int) -> Tensor:
    """Response mask of the policy loss: T-PPO may drop the last ``drop_last_k`` tokens of unfinished rows."""
    if not truncated or not drop_last_k:
        return response_mask
    lengths = response_mask.sum(-1).long()
    pos = torch.arange(response_mask.shape[1], device=response_mask.device)[None, :]
    cut = (~finished)[:, None] & (pos >= (lengths[:, None] - drop_last_k))
    return response_mask * (~cut).float()


def mini_batches(group_index: Tensor, *, share: float, generator: torch.Generator) -> list[Tensor]:
    """Row indices per mini-batch: whole prompt groups in a seeded random order.

    ``share`` = mini_batch_prompts / prompts_per_step: the fraction of the groups per mini-batch.
    """
    groups = torch.unique(group_index)
    order = groups[torch.randperm(len(groups), generator=generator)]
    per = max(1, math.ceil(len(groups) * share))
    batches = []
    for s in range(0, len(order), per):
        chosen = order[s : s + per]
        rows = torch.nonzero(torch.isin(group_index, chosen.to(group_index.device))).squeeze(-1)
        batches.append(rows)
    return batches


def micro_batches(rows: Tensor, group_index: Tensor, size: int) -> list[Tensor]:
    """Split a mini-batch into micro-batches of about ``size`` rows, keeping groups whole."""
    if not size or size >= len(rows):
        return [rows]
    out, current, current_len = [], [], 0
    for g in torch.unique(group_index[rows]):
        members = rows[group_index[rows] == g]
        if current and current_len + len(members) > size:
            out.append(torch.cat(current))
            current, current_len = [], 0
        current.append(members)
        current_len += len(members)
    if current:
        out.append(torch.cat(current))
    return out


__all__ = ["micro_batches", "micro_rows", "mini_batches", "policy_mask"]
