"""Random CPU batches shared by the estimator, objective and aggregation tests.

Shapes follow ``runners.algorithms.types``: B responses in shuffled prompt groups, T positions,
right padding (optionally with holes inside a response, like multi-turn observation tokens).
"""

from __future__ import annotations

import numpy as np
import torch


def random_mask(gen: torch.Generator, batch: int, length: int, *, holes: bool = False) -> torch.Tensor:
    """[B,T] float mask, each row 1..T real tokens; ``holes`` zeroes some interior positions."""
    lengths = torch.randint(1, length + 1, (batch,), generator=gen)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    if holes:
        interior = torch.rand(batch, length, generator=gen) < 0.2
        interior &= torch.arange(length)[None, :] < (lengths[:, None] - 1)
        interior[:, 0] = False
        mask = mask.masked_fill(interior, 0.0)
    return mask


def outcome_batch(seed: int, *, group_sizes=(4, 4, 3, 1, 5), length: int = 7, binary: bool = False):
    """Outcome rewards on each response's last real token, groups shuffled.

    Returns ``(token_rewards [B,T], mask [B,T], group_ids long [B], uids np.ndarray of str [B])``.
    """
    gen = torch.Generator().manual_seed(seed)
    groups = torch.repeat_interleave(torch.arange(len(group_sizes)), torch.tensor(group_sizes))
    groups = groups[torch.randperm(groups.numel(), generator=gen)]
    batch = groups.numel()
    mask = random_mask(gen, batch, length)
    last = mask.sum(-1).long() - 1
    if binary:
        scores = torch.randint(0, 2, (batch,), generator=gen).float()
    else:
        scores = torch.randn(batch, generator=gen)
    rewards = torch.zeros(batch, length)
    rewards[torch.arange(batch), last] = scores
    uids = np.array([f"prompt-{int(g)}" for g in groups], dtype=object)
    return rewards, mask, groups, uids


def policy_batch(seed: int, *, batch: int = 8, length: int = 9, spread: float = 0.3, dtype=torch.float32):
    """``(logp [B,T] leaf with grad, old_logp [B,T], advantages [B,T], mask [B,T])``."""
    gen = torch.Generator().manual_seed(seed)
    old_logp = -torch.rand(batch, length, generator=gen) * 3
    logp = (old_logp + spread * torch.randn(batch, length, generator=gen)).clamp(max=0)
    adv = torch.randn(batch, 1, generator=gen).expand(batch, length) + 0.1 * torch.randn(batch, length, generator=gen)
    mask = random_mask(gen, batch, length)
    return logp.to(dtype).requires_grad_(True), old_logp.to(dtype), adv.contiguous(), mask
