"""The built-in trainer's critic: clipped value regression, and T-PPO's finished-sequence batch.

Full rollouts train the value model on the step's batch with the estimator's returns. Truncated
rollouts (T-PPO, arXiv 2506.15050 section 3) train it only on sequences that finished this step,
on all their tokens (prompt plus every window), with Monte-Carlo returns; the value loss is clipped
asymmetrically around the old values (xi_low 0.5, xi_high 0.6).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
from torch import Tensor

from runners.backends.local.batching import micro_rows
from runners.backends.local.rollout import RolloutBatch


@dataclass
class CriticBatch:
    """What the value regression reads: sequences, their response mask, old values and returns ([B,T])."""

    input_ids: Tensor
    attention_mask: Tensor
    context_length: int
    response_mask: Tensor
    values_old: Tensor
    returns: Tensor


@dataclass
class CriticSettings:
    ppo_epochs: int
    micro_batch_size: int
    grad_clip: float
    value_clip_low: float
    value_clip_high: float
    gamma: float
    truncated: bool

    @classmethod
    def from_config(cls, cfg, method) -> CriticSettings:
        """From a composed cell config and its ``Method`` (the estimator's ``gamma``)."""
        t = cfg.trainer
        return cls(
            ppo_epochs=t.ppo_epochs,
            micro_batch_size=t.micro_batch_size,
            grad_clip=t.grad_clip,
            value_clip_low=t.value_clip_low,
            value_clip_high=t.value_clip_high,
            gamma=float(method.estimator_kw.get("gamma", 1.0)),
            truncated=cfg.rollout.mode == "truncated",
        )


def finished_sequences(critic, batch: RolloutBatch, *, pad_id: int, gamma: float, device) -> CriticBatch | None:
    """Prompt + whole response of every slot that finished this step, with MC returns (T-PPO)."""
    # finished and scores read once (the batch is on the trainer's device): no transfer per slot
    rows = zip(batch.slots, batch.finished.tolist(), batch.scores.tolist())
    done = [(s, score) for s, finished, score in rows if finished and s.response_ids]
    if not done:
        return None
    P = max(len(s.prompt_ids) for s, _ in done)
    R = max(len(s.response_ids) for s, _ in done)
    B = len(done)
    ids = torch.full((B, P + R), pad_id, dtype=torch.long)
    attn = torch.zeros((B, P + R), dtype=torch.long)
    mask = torch.zeros((B, R))
    returns = torch.zeros((B, R))
    for i, (s, score) in enumerate(done):
        p, r = s.prompt_ids, s.response_ids
        ids[i, P - len(p) : P] = torch.tensor(p)
        attn[i, P - len(p) : P] = 1
        ids[i, P : P + len(r)] = torch.tensor(r)
        attn[i, P : P + len(r)] = 1
        mask[i, : len(r)] = 1
        steps_to_end = torch.arange(len(r) - 1, -1, -1, dtype=torch.float32)
        returns[i, : len(r)] = score * gamma**steps_to_end
    ids, attn, mask = ids.to(device), attn.to(device), mask.to(device)
    with torch.no_grad():
        values_old = critic(ids, attn, P) * mask
    return CriticBatch(ids, attn, P, mask, values_old, returns.to(device))


def update_critic(
    critic,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    values_old: Tensor,
    returns: Tensor,
    *,
    settings: CriticSettings,
    pad_id: int,
) -> dict[str, float]:
    """Clipped value regression over ``settings.ppo_epochs`` on ``batch`` (the trainer's device); returns the
    value-loss metrics."""
    from runners.algorithms.objectives import value_loss

    device = batch.input_ids.device
    if settings.truncated:
        data = finished_sequences(critic, batch, pad_id=pad_id, gamma=settings.gamma, device=device)
        if data is None:
            return {}
    else:
        data = CriticBatch(
            batch.input_ids, batch.attention_mask, batch.context_length, batch.response_mask, values_old, returns
        )
    critic.train()
    sums: dict[str, float] = defaultdict(float)
    count = 0
    rows_all = torch.arange(data.input_ids.shape[0], device=device)
    chunk = micro_rows(len(rows_all), settings.micro_batch_size)
    clip = settings.grad_clip if settings.grad_clip > 0 else float("inf")
    for _epoch in range(settings.ppo_epochs):
        optimizer.zero_grad(set_to_none=True)
        total_tokens = data.response_mask.sum().clamp(min=1)
        for s in range(0, len(rows_all), chunk):
            rows = rows_all[s : s + chunk]
            v = critic(data.input_ids[rows], data.attention_mask[rows], data.context_length)
            mask = data.response_mask[rows]
            out = value_loss(
                v,
                data.values_old[rows],
                data.returns[rows],
                mask,
                clip_low=settings.value_clip_low,
                clip_high=settings.value_clip_high,
            )
            loss = (out.loss_mat * mask).sum() / total_tokens
            loss.backward()
            for key, value in out.metrics.items():
                sums[key] += float(value)
            count += 1
        torch.nn.utils.clip_grad_norm_(critic.parameters(), clip)
        optimizer.step()
    critic.eval()
    return {k: v / max(count, 1) for k, v in sums.items()}


__all__ = ["CriticBatch", "CriticSettings", "finished_sequences", "update_critic"]
