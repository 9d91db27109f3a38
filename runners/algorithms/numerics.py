"""Numerics of log-probabilities and entropies from logits (Entropy-preserving RL, arXiv 2603.11682, section 4).

Design decisions:

- Log-probs are computed in float32 whatever the logits' dtype, as ``x[y] - logsumexp(x)``: the
  gather picks B*T numbers and ``logsumexp`` reduces over V, so no [B,T,V] log-softmax copy is kept
  for the forward value (verl's ``logprobs_from_logits_v2`` does the same). ``chunk_size`` bounds the
  float32 working set to ``chunk_size x V`` for bf16/fp16 logits or a temperature other than 1.
- ``precision="bf16"`` (or ``"fp16"``) rounds the float32 log-probs to that type and back, the regime
  of stacks that cast model outputs to the training dtype (Entropy-preserving RL, arXiv 2603.11682, s4.1, App. B.1): ratios from
  such log-probs are biased upward (Theorem 3). The result stays a float32 tensor holding the rounded
  values, so ``logp - old_logp`` downstream is exact on the rounded numbers, as in the theorem.
  Backward through the rounding is the cast's: gradients pass, rounded to that type.
- Entropy is ``-sum_v p log p`` with ``p log p := 0`` where ``p = 0``, written so that ``-inf``
  logits (masked vocabulary) give neither NaN values nor NaN gradients.

Run the tests: ``pytest tests/algorithms/test_numerics.py`` (includes a check of Theorem 3).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from runners.algorithms.workspace import Workspace

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def _rows(logits: Tensor, chunk_size: int | None) -> list[slice]:
    n = logits.shape[0]
    if chunk_size is None or chunk_size >= n:
        return [slice(0, n)]
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 or None, got {chunk_size!r}")
    return [slice(i, min(i + chunk_size, n)) for i in range(0, n, chunk_size)]


def token_logprobs(
    logits: Tensor,
    tokens: Tensor,
    *,
    precision: str = "fp32",
    temperature: float = 1.0,
    chunk_size: int | None = None,
    workspace: Workspace | None = None,
) -> Tensor:
    """Log-probability of each sampled token: ``log softmax(logits / temperature)[tokens]``.

    Args:
        logits: [B,T,V] (any float dtype), ``logits[b,t]`` scores the token at ``tokens[b,t]``.
        tokens: [B,T] long, sampled token ids.
        precision: ``"fp32"`` (default), ``"bf16"`` or ``"fp16"``: round the result to that type
            (Entropy-preserving RL, arXiv 2603.11682, s4.1, ``r_observed = exp(bf16(logp) - bf16(old_logp))``).
        temperature: the sampling temperature (> 0); logits are divided by it, as verl does.
        chunk_size: process this many of the B*T positions at a time (None: all at once).
        workspace: reuse its buffer for ``logsumexp``'s [rows, V] temporary (``logsumexp_rows``).

    Returns:
        [B,T] float32 log-probs (float64 for float64 logits), differentiable w.r.t. ``logits``.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}; valid values: {', '.join(PRECISIONS)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    if logits.shape[:-1] != tokens.shape:
        raise ValueError(f"logits {tuple(logits.shape)} must be tokens {tuple(tokens.shape)} + [V]")
    flat = logits.reshape(-1, logits.shape[-1])
    ids = tokens.reshape(-1, 1).long()
    compute = torch.promote_types(logits.dtype, torch.float32)
    parts = []
    for rows in _rows(flat, chunk_size):
        x = flat[rows].to(compute)
        if temperature != 1.0:
            x = x / temperature
        parts.append(x.gather(-1, ids[rows]).squeeze(-1) - logsumexp_rows(x, workspace))
    logp = torch.cat(parts) if len(parts) > 1 else parts[0]
    return round_logprobs(logp, precision).reshape(tokens.shape)


def logsumexp_rows(x: Tensor, workspace: Workspace | None = None) -> Tensor:
    """``torch.logsumexp(x, dim=-1)`` of float32 [N,V] rows. With a ``workspace`` (and no gradient to
    track) the shifted exponentials go into its ``"logsumexp"`` buffer instead of a fresh [N,V]
    tensor: the same operations as ATen's logsumexp (row maximum, infinite maxima replaced by 0, the
    exponential of the difference, its sum, log, plus the maximum), so the same values bit for bit."""
    if workspace is None or x.requires_grad or x.dtype != torch.float32 or x.dim() != 2:
        return torch.logsumexp(x, dim=-1)
    m = x.amax(-1, keepdim=True)
    m.masked_fill_(m.abs() == math.inf, 0.0)
    s = torch.sub(x, m, out=workspace.like("logsumexp", x)).exp_().sum(-1)
    return s.log_().add_(m.squeeze(-1))


def round_logprobs(logp: Tensor, precision: str = "fp32") -> Tensor:
    """``logp`` rounded to ``precision`` (``"bf16"``, ``"fp16"``) and back to its own dtype; as is for fp32."""
    rounded = PRECISIONS[precision]
    return logp if rounded is None else logp.to(rounded).to(logp.dtype)


def entropy_from_logits(logits: Tensor, *, chunk_size: int | None = None) -> Tensor:
    """Entropy ``H = -sum_v p_v log p_v`` of ``softmax(logits)`` [B,T,V] -> [B,T] float32 (or float64).

    ``-inf`` logits are allowed (their ``p log p`` counts 0, with zero gradient); a row whose logits
    are all ``-inf`` has no distribution and gets entropy 0.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    compute = torch.promote_types(logits.dtype, torch.float32)
    parts = []
    for rows in _rows(flat, chunk_size):
        x = flat[rows].to(compute)
        keep = x > float("-inf")
        valid_row = keep.any(-1, keepdim=True)
        x = torch.where(valid_row, x, torch.zeros_like(x))  # an all -inf row: no NaN in logsumexp's backward
        logp = x - torch.logsumexp(x, dim=-1, keepdim=True)
        keep = keep & valid_row
        safe_logp = torch.where(keep, logp, torch.zeros_like(logp))
        p = torch.where(keep, safe_logp.exp(), torch.zeros_like(safe_logp))
        parts.append(-(p * safe_logp).sum(-1))
    entropy = torch.cat(parts) if len(parts) > 1 else parts[0]
    return entropy.reshape(logits.shape[:-1])


__all__ = ["PRECISIONS", "entropy_from_logits", "logsumexp_rows", "token_logprobs"]
