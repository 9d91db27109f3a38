"""TRM: trust-region masking of whole sequences (TRM, arXiv 2512.23075, sections 6, appendices B and D).

Design: a mask never touches the loss. ``MASKS[name](inp, **params)`` returns per-sequence keep
weights ``seq_mask`` [B] in {0, 1}, computed without gradient; the trainer multiplies the per-token
loss by them (``apply_sequence_mask``) and keeps ``inp.response_mask`` as the aggregation mask, so
the gradient stays normalised by the whole batch N (eq. 50) and rejected sequences add zero.

Criteria (TRM section 6 and appendix B; every threshold is inclusive, "keep iff stat <= threshold"):

- exact, from the stored sparse rollout distributions (``inp.old_topk_index/old_topk_logp``: the
  kept tokens' true log-probs) against ``inp.logits`` (or ``inp.topk_logp``, pi_theta's log-probs at
  the kept ids, from a backend that never holds the logits): ``D_KL(c_t) = sum_v pi_roll(v) (log pi_roll(v)
  - log pi_theta(v))`` (eq. 51) over the stored support plus one "rest" bin holding the mass of every
  other token (``tail_bin``, the default). That is the KL of the coarse-grained pair: by the data
  processing inequality it is at most the true KL, it equals it when the support is the whole
  vocabulary, and it is 0 for an unchanged policy whatever mass the support keeps (without the rest
  bin, eq. 51 over the support alone is neither a bound nor zero-preserving under renormalisation).
  ``trm_max`` (max_t), ``trm_avg`` (mean_t), ``trm_max_avg`` (both);
- sample-based, from ``log r_t = logp - rollout_logp`` of the sampled tokens (appendix B):
  ``trm_max_k2`` (max_t of k2 = 0.5 (log r)^2), ``trm_avg_k3`` (mean_t of k3 = r - 1 - log r),
  ``trm_max_avg_sample`` (both);
- length-neutral: ``ln_trm`` (eq. 76-77, position-weighted mean of |r_t - 1|) and ``ser`` (eq. 82,
  plain mean of |r_t - 1|).

Log-ratios are clamped to [-20, 20] as verl's rollout correction does (``SAFETY_BOUND``); a NaN
log-ratio (both log-probs -inf) counts as maximal divergence. Every mask also returns monitoring
metrics (``trm/accept_rate``, ``trm/max_kl``, ``trm/mean_kl``, ``trm/ppl_gap``, acceptance by response
length, mean token TV by position for the Adaptive bound: see ``compute_trm_metrics``). Every mask
accepts the keyword parameters ``monitor`` (False: no metrics), ``length_edges`` and
``position_edges`` (bucket edges, default ``DEFAULT_EDGES``); the exact masks also ``tail_bin``.

The error bounds live in ``bounds.py`` (torch-free) and are re-exported here as ``error_bounds``.
Run the tests with ``pytest tests/algorithms/test_trm.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from runners.algorithms.bounds import error_bounds
from runners.algorithms.trm_metrics import (
    DEFAULT_EDGES,
    SAFETY_BOUND,
    _real,
    _seq_max,
    _seq_mean,
    acceptance_by_length,
    apply_sequence_mask,
    compute_trm_metrics,
    k2_estimator,
    k3_estimator,
    log_ppl_gap,
    sample_log_ratio,
    tv_by_position,
)
from runners.algorithms.troll_sparse import chunked_logsumexp
from runners.algorithms.types import MaskOutput, PolicyInputs
from runners.checks import NON_NEGATIVE

# elements of one [rows, V] float32 slab in exact_token_kl (64 MiB)
_CHUNK_ELEMENTS = 1 << 24


# -- exact divergences ---------------------------------------------------------------------
def _sparse_token_stats(logits: Tensor, index: Tensor, topk_logp: Tensor, tail_bin: bool) -> tuple[Tensor, Tensor]:
    """Exact KL and TV [n] for rows ``logits [n,V]``, ``index/topk_logp [n,K]`` (one chunk)."""
    # normaliser in float64: a float32 log-softmax is off by up to ~1e-6 at V = 49,152, which moves the
    # rest mass 1 - sum q by as much (real-model rests are ~1e-5 to 1e-7) and made the estimate exceed
    # the dense KL by ~1e-4 on SmolLM2's distributions; ~2.5x a float32 log-softmax of the chunk
    lse = chunked_logsumexp(logits, dtype=torch.float64)
    logq = torch.nan_to_num(logits.gather(-1, index.long()).double() - lse[:, None], nan=float("-inf"))
    return _stats_from_logq(logq, topk_logp, tail_bin)


def _stats_from_logq(logq: Tensor, topk_logp: Tensor, tail_bin: bool) -> tuple[Tensor, Tensor]:
    """Exact KL and TV [...] from pi_theta's log-probs ``logq`` at the kept ids and the rollout's ``topk_logp``."""
    logq = logq.detach()
    valid = topk_logp > float("-inf")
    p = torch.where(valid, topk_logp.double().exp(), 0.0)
    q = torch.where(valid, logq.double().exp(), 0.0)
    # p > 0, not only `valid`: a log-prob that underflows exp() must not give 0 * inf
    kl_terms = torch.where(p > 0, p * (topk_logp.double() - logq.double()), 0.0)
    kl = kl_terms.sum(-1)
    p_rest = (1.0 - p.sum(-1)).clamp(min=0.0)
    q_rest = (1.0 - q.sum(-1)).clamp(min=0.0)
    if tail_bin:  # KL of the coarse-grained pair (kept ids + one "rest" bin): >= 0, <= the true KL
        rest = p_rest * (p_rest.clamp(min=1e-300).log() - q_rest.clamp(min=1e-12).log())
        kl = (kl + torch.where(p_rest > 0, rest, 0.0)).clamp(min=0.0)  # a KL: rounding must not make it < 0
    tv = 0.5 * ((p - q).abs().sum(-1) + (p_rest - q_rest).abs())
    return kl, tv.clamp(max=1.0)


def sparse_token_divergences(
    logits: Tensor,
    index: Tensor,
    topk_logp: Tensor,
    mask: Tensor | None = None,
    *,
    tail_bin: bool = True,
) -> tuple[Tensor, Tensor]:
    """Exact token KL(pi_roll || pi_theta) and TV [B,T] from a stored sparse rollout distribution.

    ``logits`` [B,T,V] of pi_theta; ``index``/``topk_logp`` [B,T,K] the kept ids and the rollout policy's log-probs
    (-inf marks padding slots, ignored). KL is TRM (arXiv 2512.23075) eq. 51 over the stored support; with
    ``tail_bin`` the missing mass adds one "rest" bin term (the KL of the coarse-grained pair, always
    >= 0; equal to eq. 51 when the support is the whole vocabulary). TV (eq. 8) always includes the
    rest bin, so it is exact on a full support and a lower bound otherwise. Positions where ``mask``
    is 0 are skipped and get 0. Computed in chunks of rows, without gradient, float64 sums.
    """
    if index.shape != topk_logp.shape or logits.shape[:-1] != index.shape[:-1]:
        raise ValueError(
            f"shape mismatch: logits {tuple(logits.shape)}, index {tuple(index.shape)}, "
            f"topk_logp {tuple(topk_logp.shape)} (expected [B,T,V], [B,T,K], [B,T,K])"
        )
    lead = index.shape[:-1]
    V, K = logits.shape[-1], index.shape[-1]
    with torch.no_grad():
        flat_logits = logits.detach().reshape(-1, V)
        flat_index = index.reshape(-1, K)
        flat_roll = topk_logp.detach().double().reshape(-1, K)
        n = flat_index.shape[0]
        kl = torch.zeros(n, dtype=torch.float64, device=index.device)
        tv = torch.zeros_like(kl)
        step = max(1, _CHUNK_ELEMENTS // max(V, 1))
        if mask is None or bool((mask > 0).all()):  # contiguous slices, no row copies
            for start in range(0, n, step):
                sl = slice(start, start + step)
                kl[sl], tv[sl] = _sparse_token_stats(flat_logits[sl], flat_index[sl], flat_roll[sl], tail_bin)
        else:  # skip padding positions
            rows = torch.nonzero(mask.reshape(-1) > 0).squeeze(-1)
            for start in range(0, rows.numel(), step):
                sel = rows[start : start + step]
                kl[sel], tv[sel] = _sparse_token_stats(flat_logits[sel], flat_index[sel], flat_roll[sel], tail_bin)
    return kl.reshape(lead), tv.reshape(lead)


def kept_token_divergences(
    logq: Tensor, topk_logp: Tensor, mask: Tensor | None = None, *, tail_bin: bool = True
) -> tuple[Tensor, Tensor]:
    """``sparse_token_divergences`` from pi_theta's log-probs at the kept ids, ``logq`` [B,T,K] (float64:
    ``chunked_head(..., gather=index, exact_sum=True)``), instead of its logits; no gradient."""
    if logq.shape != topk_logp.shape:
        raise ValueError(f"shape mismatch: logq {tuple(logq.shape)}, topk_logp {tuple(topk_logp.shape)}")
    with torch.no_grad():
        kl, tv = _stats_from_logq(logq.double(), topk_logp.detach().double(), tail_bin)
        if mask is not None:
            kl, tv = torch.where(mask > 0, kl, 0.0), torch.where(mask > 0, tv, 0.0)
    return kl, tv


def exact_token_kl(logits: Tensor, index: Tensor, topk_logp: Tensor, *, tail_bin: bool = True) -> Tensor:
    """Per-token exact KL(pi_roll || pi_theta) [B,T] over the stored support (TRM, arXiv 2512.23075, eq. 51).

    ``logits`` [B,T,V], ``index`` [B,T,K], ``topk_logp`` [B,T,K] (-inf = padding slot, ignored).
    """
    return sparse_token_divergences(logits, index, topk_logp, tail_bin=tail_bin)[0]


# -- masks -------------------------------------------------------------------------------------
_EXACT_FIELDS = ("logits", "old_topk_index", "old_topk_logp")


def _exact_divergences(inp: PolicyInputs, name: str, tail_bin: bool) -> tuple[Tensor, Tensor]:
    if inp.topk_logp is not None and inp.old_topk_logp is not None:  # a backend without the logits
        return kept_token_divergences(inp.topk_logp, inp.old_topk_logp, inp.response_mask, tail_bin=tail_bin)
    missing = [f for f in _EXACT_FIELDS if getattr(inp, f) is None]
    if missing:
        raise ValueError(
            f"mask {name!r} computes the exact KL and needs PolicyInputs.{', '.join(missing)} "
            "(store the rollout's sparse distributions), or use a sample-based mask "
            "('trm_max_k2', 'trm_avg_k3', 'trm_max_avg_sample')"
        )
    return sparse_token_divergences(
        inp.logits, inp.old_topk_index, inp.old_topk_logp, inp.response_mask, tail_bin=tail_bin
    )


def _check_threshold(name: str, value: float) -> float:
    """A keep threshold (inclusive: keep iff score <= threshold, so 0 keeps only divergence-free sequences)
    checked with the rule of its config field (``runners.checks.NON_NEGATIVE``, the mask schemas)."""
    value = float(value)
    if not NON_NEGATIVE.holds(value):
        raise ValueError(f"mask threshold {name} {NON_NEGATIVE.what}, got {value}")
    return value


def _finish(
    inp: PolicyInputs,
    keep: Tensor,
    *,
    token_kl: Tensor | None = None,
    token_tv: Tensor | None = None,
    monitor: bool = True,
    length_edges: Sequence[int] = DEFAULT_EDGES,
    position_edges: Sequence[int] = DEFAULT_EDGES,
) -> MaskOutput:
    seq_mask = keep.to(inp.logp.dtype).detach()
    if not monitor:
        return MaskOutput(seq_mask, {})
    stored = inp.old_topk_index is not None and inp.old_topk_logp is not None
    if token_kl is None and stored and (inp.logits is not None or inp.topk_logp is not None):
        # distributions stored: monitor the exact KL/TV even when the criterion is sample-based
        token_kl, token_tv = _exact_divergences(inp, "monitoring", True)
    with torch.no_grad():
        metrics = compute_trm_metrics(
            inp,
            seq_mask,
            token_kl=token_kl,
            token_tv=token_tv,
            length_edges=length_edges,
            position_edges=position_edges,
        )
    return MaskOutput(seq_mask, metrics)


def _exact_mask(inp, name, delta, delta_avg, tail_bin, monitor_kw) -> MaskOutput:
    kl, tv = _exact_divergences(inp, name, tail_bin)
    keep = torch.ones(kl.shape[0], dtype=torch.bool, device=kl.device)
    if delta is not None:
        keep &= _seq_max(kl, inp.response_mask) <= _check_threshold("delta", delta)
    if delta_avg is not None:
        keep &= _seq_mean(kl, inp.response_mask) <= _check_threshold("delta_avg", delta_avg)
    return _finish(inp, keep, token_kl=kl, token_tv=tv, **monitor_kw)


def no_mask(inp: PolicyInputs, **monitor_kw) -> MaskOutput:
    """Keep every sequence; still reports the monitoring metrics (a baseline's PPL gap and KL)."""
    keep = torch.ones(inp.logp.shape[0], dtype=torch.bool, device=inp.logp.device)
    return _finish(inp, keep, **monitor_kw)


def trm_max_mask(inp: PolicyInputs, *, delta: float = 0.05, tail_bin: bool = True, **monitor_kw) -> MaskOutput:
    """TRM-Max: keep iff ``max_t D_KL(c_t) <= delta`` (exact KL, TRM (arXiv 2512.23075) section 6.2)."""
    return _exact_mask(inp, "trm_max", delta, None, tail_bin, monitor_kw)


def trm_avg_mask(inp: PolicyInputs, *, delta_avg: float = 0.001, tail_bin: bool = True, **monitor_kw) -> MaskOutput:
    """TRM-Avg: keep iff ``mean_t D_KL(c_t) <= delta_avg`` (exact KL)."""
    return _exact_mask(inp, "trm_avg", None, delta_avg, tail_bin, monitor_kw)


def trm_max_avg_mask(
    inp: PolicyInputs, *, delta: float = 0.1, delta_avg: float = 0.002, tail_bin: bool = True, **monitor_kw
) -> MaskOutput:
    """TRM-Max&Avg: both criteria with looser thresholds (TRM, arXiv 2512.23075, section 7, figure 3)."""
    return _exact_mask(inp, "trm_max_avg", delta, delta_avg, tail_bin, monitor_kw)


def _sample_mask(inp, delta, delta_avg, monitor_kw) -> MaskOutput:
    log_ratio = sample_log_ratio(inp.logp, inp.rollout_or_old_logp())
    keep = torch.ones(log_ratio.shape[0], dtype=torch.bool, device=log_ratio.device)
    if delta is not None:
        keep &= _seq_max(k2_estimator(log_ratio), inp.response_mask) <= _check_threshold("delta", delta)
    if delta_avg is not None:
        keep &= _seq_mean(k3_estimator(log_ratio), inp.response_mask) <= _check_threshold("delta_avg", delta_avg)
    return _finish(inp, keep, **monitor_kw)


def trm_max_k2_mask(inp: PolicyInputs, *, delta: float = 0.05, **monitor_kw) -> MaskOutput:
    """Sample-based TRM-Max: keep iff ``max_t 0.5 (log r_t)^2 <= delta`` (TRM, arXiv 2512.23075, B.2)."""
    return _sample_mask(inp, delta, None, monitor_kw)


def trm_avg_k3_mask(inp: PolicyInputs, *, delta_avg: float = 0.001, **monitor_kw) -> MaskOutput:
    """Sample-based TRM-Avg: keep iff ``mean_t (r_t - 1 - log r_t) <= delta_avg`` (TRM, arXiv 2512.23075, B.1)."""
    return _sample_mask(inp, None, delta_avg, monitor_kw)


def trm_max_avg_sample_mask(
    inp: PolicyInputs, *, delta: float = 0.1, delta_avg: float = 0.002, **monitor_kw
) -> MaskOutput:
    """Sample-based TRM-Max&Avg: max k2 <= delta and mean k3 <= delta_avg."""
    return _sample_mask(inp, delta, delta_avg, monitor_kw)


def ln_trm_scores(log_ratio: Tensor, mask: Tensor, delta: float) -> Tensor:
    """Normalised error score ``W~ = sum_t |r_t - 1| w_t / Z(T)`` [B] (TRM, arXiv 2512.23075, eq. 76-77).

    ``log_ratio``, ``mask`` [B,T]; t counts real tokens 1..T of each row, ``w_t = min(1,
    sqrt((T - t) delta / 2))``, ``Z(T) = sum_t w_t`` (= ``bounds.ln_trm_normaliser``). Guard: Z(1) = 0
    (w_1 = 0 for a length-1 sequence), and the normalised weights of T = 2 put all mass on t = 1,
    so a length-1 row scores ``|r_1 - 1|``; an all-padding row scores 0.
    """
    real = _real(mask)
    t = real.cumsum(-1).double()
    T = real.sum(-1, keepdim=True).double()
    w = torch.where(real, ((T - t) * delta / 2.0).clamp(min=0).sqrt().clamp(max=1.0), 0.0)
    dev = torch.where(real, torch.expm1(log_ratio.double()).abs(), 0.0)
    Z = w.sum(-1)
    weighted = (dev * w).sum(-1) / Z.clamp(min=torch.finfo(torch.float64).tiny)
    return torch.where(Z > 0, weighted, _seq_mean(dev, mask))


def ln_trm_mask(inp: PolicyInputs, *, delta: float = 1e-4, delta_w: float = 0.05, **monitor_kw) -> MaskOutput:
    """LN-TRM: keep iff the normalised error score ``W~ <= delta_w`` (TRM, arXiv 2512.23075, appendix D.3).

    The paper's text lost its delta_W value. ``W~`` is a weighted mean of |r_t - 1|, the same
    quantity SER averages uniformly (twice the per-token TV in expectation), so the default sits in
    SER's recommended 0.03..0.10 range.
    """
    scores = ln_trm_scores(sample_log_ratio(inp.logp, inp.rollout_or_old_logp()), inp.response_mask, float(delta))
    return _finish(inp, scores <= _check_threshold("delta_w", delta_w), **monitor_kw)


def ser_mask(inp: PolicyInputs, *, delta_ser: float = 0.05, **monitor_kw) -> MaskOutput:
    """SER: keep iff ``mean_t |r_t - 1| <= delta_ser`` (TRM, arXiv 2512.23075, eq. 82; recommended 0.03..0.10)."""
    log_ratio = sample_log_ratio(inp.logp, inp.rollout_or_old_logp())
    score = _seq_mean(torch.expm1(log_ratio).abs(), inp.response_mask)
    return _finish(inp, score <= _check_threshold("delta_ser", delta_ser), **monitor_kw)


__all__ = [
    "DEFAULT_EDGES",
    "SAFETY_BOUND",
    "acceptance_by_length",
    "apply_sequence_mask",
    "compute_trm_metrics",
    "error_bounds",
    "exact_token_kl",
    "k2_estimator",
    "k3_estimator",
    "kept_token_divergences",
    "ln_trm_mask",
    "ln_trm_scores",
    "log_ppl_gap",
    "no_mask",
    "sample_log_ratio",
    "ser_mask",
    "sparse_token_divergences",
    "tv_by_position",
    "trm_avg_k3_mask",
    "trm_avg_mask",
    "trm_max_avg_mask",
    "trm_max_avg_sample_mask",
    "trm_max_k2_mask",
    "trm_max_mask",
]
