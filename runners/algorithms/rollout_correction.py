"""Training-inference mismatch: verl's diagnostics and corrections, for the built-in trainer too.

The sampler (rollout policy: a vLLM engine in bf16, a stale copy in asynchronous RL) and the trainer's
recomputed old policy disagree; verl measures the gap per iteration and offers corrections. Both are
here under verl 0.9.1's names, so a run on either backend logs the same ``rollout_corr/*`` metrics and
TRM can be compared with what verl users run:

- ``offpolicy_metrics(old_logp, rollout_logp, mask)``: ``kl`` (E[log pi_roll - log pi_old]), ``k3_kl``,
  ``training_ppl`` / ``rollout_ppl`` (and their logs), ``log_ppl_diff`` (mean, abs, max, min),
  ``ppl_ratio``, ``chi2_token`` (E[rho^2] - 1), ``chi2_seq`` (E[(prod rho)^2] - 1), rho = pi_old / pi_roll;
- corrections (``ROLLOUT_CORRECTIONS``), computed once per iteration from the same log-probs:
  ``token_tis`` (truncated importance sampling: weights min(rho_t, cap) multiply the per-token loss),
  ``seq_max_k2`` / ``seq_max_k3`` (reject a sequence whose max token k2 = 0.5 (log rho)^2 or
  k3 = rho - 1 - log rho exceeds the threshold). As in verl, a rejection removes the sequence's tokens
  from the response mask, so the token-mean denominator shrinks; TRM's masks (``trm.py``) instead keep
  the denominator (TRM, arXiv 2512.23075, eq. 50) and compare the *current* policy with the rollout
  policy.

Log-ratios are clamped to [-20, 20] as verl does. ``tests/algorithms/test_rollout_correction.py``
checks every value against verl's own ``rollout_corr_helper`` on CPU. One departure: a row without a
real token (an all-padding row) is left out of the per-sequence statistics (the perplexities, their
logs and ratio, ``chi2_seq``, and the rows a sequence rejection counts), where verl counts it as a
sequence of log-prob 0 (perplexity 1). On batches without such rows the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from runners import metric_names

SAFETY_BOUND = 20.0
PREFIX = metric_names.ROLLOUT_CORR_PREFIX


@dataclass
class CorrectionOutput:
    """Per-token importance weights (None: no reweighting), the response mask to train with, metrics."""

    is_weights: Tensor | None
    response_mask: Tensor
    metrics: dict[str, float] = field(default_factory=dict)


def _masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1e-8)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1e-8)


def offpolicy_metrics(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor) -> dict[str, float]:
    """verl's off-policy diagnostics (``compute_offpolicy_metrics``), named without the prefix."""
    mask = mask.to(torch.float64)
    old, roll = old_logp.detach().double(), rollout_logp.detach().double()
    rows = mask.sum(-1) > 0
    mean_old = _masked_mean(old, mask, -1)[rows]
    mean_roll = _masked_mean(roll, mask, -1)[rows]
    log_ratio = old - roll
    log_ppl_diff = mean_roll - mean_old
    rho = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()
    seq_log_ratio = (log_ratio * mask).sum(-1)[rows].clamp(-SAFETY_BOUND, SAFETY_BOUND)
    out = {
        "training_ppl": torch.exp(-mean_old).mean(),
        "training_log_ppl": (-mean_old).mean(),
        "kl": _masked_mean(roll - old, mask),
        "k3_kl": _masked_mean(torch.exp(log_ratio) - log_ratio - 1, mask),
        "rollout_ppl": torch.exp(-mean_roll).mean(),
        "rollout_log_ppl": (-mean_roll).mean(),
        "log_ppl_diff": log_ppl_diff.mean(),
        "log_ppl_abs_diff": log_ppl_diff.abs().mean(),
        "log_ppl_diff_max": log_ppl_diff.max(),
        "log_ppl_diff_min": log_ppl_diff.min(),
        "ppl_ratio": torch.exp(log_ppl_diff).mean(),
        "chi2_token": _masked_mean(rho.square(), mask) - 1.0,
        "chi2_seq": torch.exp(2.0 * seq_log_ratio).mean() - 1.0,
    }
    return {key: float(value) for key, value in out.items()}


def _log_ratio(old_logp: Tensor, rollout_logp: Tensor) -> Tensor:
    return (old_logp.detach().double() - rollout_logp.detach().double()).clamp(-SAFETY_BOUND, SAFETY_BOUND)


def no_correction(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor) -> CorrectionOutput:
    """Train on the batch as sampled."""
    return CorrectionOutput(None, mask, {})


def token_tis(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, *, cap: float = 2.0) -> CorrectionOutput:
    """Token-level truncated importance sampling: weight rho_t = pi_old / pi_roll truncated at ``cap``
    (verl: ``rollout_is=token``, ``rollout_is_threshold=cap``)."""
    if not cap > 1:
        raise ValueError(f"token_tis cap must be > 1, got {cap}")
    fmask = mask.to(torch.float64)
    raw = _log_ratio(old_logp, rollout_logp).exp() * fmask
    weights = raw.clamp(max=cap)
    real = fmask > 0
    clamped = weights.clamp(0.0, cap)
    var = _masked_mean(clamped.square(), fmask) - _masked_mean(clamped, fmask).square()
    metrics = {
        "rollout_is_mean": float(_masked_mean(weights, fmask)),
        "rollout_is_ratio_fraction_high": float(_masked_mean((raw > cap).double(), fmask)),
        "rollout_is_ratio_fraction_low": float(_masked_mean((raw < 1.0 / cap).double(), fmask)),
        "rollout_is_max": float(weights[real].max()),
        "rollout_is_min": float(weights[real].min()),
        "rollout_is_std": float(var.clamp(min=0).sqrt()),
    }
    return CorrectionOutput(weights.to(old_logp.dtype).detach(), mask, metrics)


def _seq_max_rejection(name: str, stat: Tensor, mask: Tensor, threshold: float) -> CorrectionOutput:
    if not threshold > 0:
        raise ValueError(f"{name} threshold must be > 0, got {threshold}")
    real = mask > 0
    seq_max = torch.where(real, stat, float("-inf")).amax(-1)
    seq_max = torch.where(real.any(-1), seq_max, torch.zeros_like(seq_max))
    keep = seq_max <= threshold
    rows = real.any(-1)
    kept_mask = mask * keep.to(mask.dtype)[:, None]
    token_fraction = float(_masked_mean((~keep[:, None]).double().expand_as(stat), mask.double()))
    seq_fraction = float((~keep & rows).double().sum() / rows.double().sum().clamp(min=1))
    metrics = {
        f"rollout_rs_{name}_masked_fraction": token_fraction,
        f"rollout_rs_{name}_seq_masked_fraction": seq_fraction,
        "rollout_rs_masked_fraction": token_fraction,
        "rollout_rs_seq_masked_fraction": seq_fraction,
    }
    return CorrectionOutput(None, kept_mask, metrics)


def seq_max_k2(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, *, threshold: float = 0.05) -> CorrectionOutput:
    """Reject sequences whose max token k2 = 0.5 (log rho)^2 exceeds ``threshold`` (verl: ``rollout_rs=seq_max_k2``)."""
    return _seq_max_rejection("seq_max_k2", 0.5 * _log_ratio(old_logp, rollout_logp).square(), mask, threshold)


def seq_max_k3(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, *, threshold: float = 0.05) -> CorrectionOutput:
    """Reject sequences whose max token k3 = rho - 1 - log rho exceeds ``threshold`` (verl: ``seq_max_k3``)."""
    lr = _log_ratio(old_logp, rollout_logp)
    return _seq_max_rejection("seq_max_k3", lr.exp() - 1.0 - lr, mask, threshold)


def prefixed(metrics: dict[str, float]) -> dict[str, float]:
    return {f"{PREFIX}{key}": value for key, value in metrics.items()}


__all__ = [
    "PREFIX",
    "CorrectionOutput",
    "no_correction",
    "offpolicy_metrics",
    "prefixed",
    "seq_max_k2",
    "seq_max_k3",
    "token_tis",
]
