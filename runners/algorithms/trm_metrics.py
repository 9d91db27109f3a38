"""TRM's per-token sample divergences and its monitoring metrics (TRM, arXiv 2512.23075, appendices B and D).

Split from ``trm.py`` (the masks): the sample-based estimators of the divergence between the current and
the rollout policy from the sampled tokens' log-ratio (k2, k3), masked per-sequence reductions, and the
metric set every mask reports (acceptance overall and by response length, max / mean KL, log PPL gap,
token TV by position for the Adaptive bound).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from runners import metric_names
from runners.algorithms.types import PolicyInputs

# |log r| clamp, as verl's rollout_corr_helper (exp(20) ~ 4.9e8)
SAFETY_BOUND = 20.0
# response-length buckets for trm/accept_rate/len_* and position buckets for trm/tv/pos_*
DEFAULT_EDGES = (0, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


# -- sample estimators -------------------------------------------------------------------------
def sample_log_ratio(logp: Tensor, rollout_logp: Tensor) -> Tensor:
    """``log r = logp - rollout_logp`` [B,T], detached, NaN -> +SAFETY_BOUND, clamped to +-SAFETY_BOUND."""
    log_ratio = logp.detach().float() - rollout_logp.detach().float()
    log_ratio = torch.nan_to_num(log_ratio, nan=SAFETY_BOUND, posinf=SAFETY_BOUND, neginf=-SAFETY_BOUND)
    return log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)


def k2_estimator(log_ratio: Tensor) -> Tensor:
    """k2 = 0.5 (log r)^2 [B,T]: symmetric per-token divergence for the max criterion (TRM, arXiv 2512.23075, B.2)."""
    return 0.5 * log_ratio.square()


def k3_estimator(log_ratio: Tensor) -> Tensor:
    """k3 = r - 1 - log r [B,T]: >= 0, unbiased for KL(pi_roll || pi_theta) under pi_roll (TRM, arXiv 2512.23075, B.1)."""
    return torch.expm1(log_ratio) - log_ratio


# -- masked reductions -------------------------------------------------------------------------
def _real(mask: Tensor) -> Tensor:
    return mask > 0


def _seq_max(values: Tensor, mask: Tensor) -> Tensor:
    """Max over real tokens [B]; 0 for all-padding rows (as verl)."""
    real = _real(mask)
    out = torch.where(real, values, torch.full_like(values, float("-inf"))).amax(-1)
    return torch.where(real.any(-1), out, torch.zeros_like(out))


def _seq_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean over real tokens [B]; 0 for all-padding rows."""
    real = _real(mask)
    total = torch.where(real, values, torch.zeros_like(values)).sum(-1)
    return total / real.sum(-1).clamp(min=1)


# -- monitoring --------------------------------------------------------------------------------
def _buckets(edges: Sequence[int]) -> list[tuple[int, int]]:
    edges = [int(e) for e in edges]
    if len(edges) < 2 or any(b <= a for a, b in zip(edges, edges[1:])) or edges[0] < 0:
        raise ValueError(f"bucket edges must be >= 0 and strictly increasing (at least two), got {edges}")
    return list(zip(edges, edges[1:]))


def acceptance_by_length(seq_mask: Tensor, lengths: Tensor, edges: Sequence[int] = DEFAULT_EDGES) -> dict[str, float]:
    """Acceptance rate per response-length bucket lo <= length < hi (TRM, arXiv 2512.23075, table D.1, remark D.1).

    ``seq_mask`` [B] keep weights, ``lengths`` [B] real response tokens. Empty buckets and all-padding
    rows (length 0) are left out; so are lengths >= the last edge.
    """
    out: dict[str, float] = {}
    for lo, hi in _buckets(edges):
        sel = (lengths >= max(lo, 1)) & (lengths < hi)
        if sel.any():
            out[metric_names.trm_accept_rate_bucket(lo, hi)] = float(seq_mask[sel].float().mean())
    return out


def tv_by_position(tv: Tensor, mask: Tensor, edges: Sequence[int] = DEFAULT_EDGES) -> dict[str, float]:
    """Mean token TV per position bucket, the Adaptive bound's Dbar (TRM, arXiv 2512.23075, eq. 13, 40).

    ``tv`` [B,T], ``mask`` [B,T]; position k (0-based column, the bound's t = k + 1). Dbar_k is the
    mean over the batch's non-empty sequences of TV at k, a sequence that already ended counting 0
    (EOS is absorbing: both policies agree after it); a bucket reports the mean of Dbar_k over its
    hi - lo positions, positions past the batch's width counting 0. Every bucket is reported, so
    ``bounds.dbar_from_position_buckets`` can tell covered positions from missing ones.
    """
    real = _real(mask)
    n_seq = real.any(-1).sum().clamp(min=1)
    dbar = torch.where(real, tv.double(), 0.0).sum(0) / n_seq  # [T]
    cum = torch.cat([dbar.new_zeros(1), dbar.cumsum(0)])
    width = dbar.shape[0]
    return {
        metric_names.trm_tv_position_bucket(lo, hi): float((cum[min(hi, width)] - cum[min(lo, width)]) / (hi - lo))
        for lo, hi in _buckets(edges)
    }


def log_ppl_gap(logp: Tensor, rollout_logp: Tensor, mask: Tensor) -> float:
    """Log absolute PPL gap ``mean_i |mean_t logp - mean_t rollout_logp|`` (TRM, arXiv 2512.23075, eq. 52).

    ``logp``, ``rollout_logp``, ``mask`` [B,T]; mean over non-empty sequences; the log-ratio is clamped
    as in ``sample_log_ratio`` so -inf log-probs give a large finite gap, not NaN.
    """
    real = _real(mask)
    rows = real.any(-1)
    if not rows.any():
        return 0.0
    gap = _seq_mean(sample_log_ratio(logp, rollout_logp), mask).abs()
    return float(gap[rows].mean())


def compute_trm_metrics(
    inp: PolicyInputs,
    seq_mask: Tensor,
    *,
    token_kl: Tensor | None = None,
    token_tv: Tensor | None = None,
    length_edges: Sequence[int] = DEFAULT_EDGES,
    position_edges: Sequence[int] = DEFAULT_EDGES,
) -> dict[str, float]:
    """The TRM metric set for one batch (names from ``runners.metric_names``).

    ``trm/max_kl`` and ``trm/mean_kl`` are the max and token-mean of the exact KL when ``token_kl``
    [B,T] is given, else of the sample estimators (max of k2, mean of k3, the quantities the
    sample-based criteria threshold). ``trm/tv/pos_*`` needs ``token_tv`` [B,T]. The masks pass the
    exact divergences whenever the batch stores sparse rollout distributions, whatever their
    criterion, so a metric means the same thing across the runs of one grid.
    """
    mask = inp.response_mask
    real = _real(mask)
    lengths = real.sum(-1)
    rows = lengths > 0
    metrics = {
        metric_names.TRM_ACCEPT_RATE: float(seq_mask[rows].float().mean()) if rows.any() else 1.0,
        metric_names.TRM_PPL_GAP: log_ppl_gap(inp.logp, inp.rollout_or_old_logp(), mask),
    }
    if token_kl is not None:
        max_src, mean_src = token_kl, token_kl
    else:
        log_ratio = sample_log_ratio(inp.logp, inp.rollout_or_old_logp())
        max_src, mean_src = k2_estimator(log_ratio), k3_estimator(log_ratio)
    n_tok = real.sum()
    metrics[metric_names.TRM_MAX_KL] = float(torch.where(real, max_src, float("-inf")).max()) if n_tok else 0.0
    metrics[metric_names.TRM_MEAN_KL] = float(torch.where(real, mean_src, 0.0).sum() / n_tok.clamp(min=1))
    metrics.update(acceptance_by_length(seq_mask, lengths, length_edges))
    if token_tv is not None:
        metrics.update(tv_by_position(token_tv, mask, position_edges))
    return metrics


def apply_sequence_mask(loss_mat: Tensor, seq_mask: Tensor) -> Tensor:
    """Multiply the per-token loss [B,T] by the keep weights [B] (TRM, arXiv 2512.23075, eq. 50).

    Aggregate the result with the unchanged response mask (``runners.algorithms.loss_agg``), so the
    denominator stays the whole batch and rejected sequences contribute exactly zero gradient.
    """
    if seq_mask.dim() != 1 or seq_mask.shape[0] != loss_mat.shape[0]:
        raise ValueError(f"seq_mask must be [B] = [{loss_mat.shape[0]}], got {tuple(seq_mask.shape)}")
    return loss_mat * seq_mask.detach().to(loss_mat.dtype).unsqueeze(-1)
