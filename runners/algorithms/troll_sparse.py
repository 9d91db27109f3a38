"""TROLL's sparse token distributions (TROLL, arXiv 2510.03817, section 3.2, appendix A.4 eq. 21, appendix E.4).

Design: the old (rollout) policy is stored per token as at most K+1 (vocabulary id, log-prob)
pairs: the top-K tokens, cut after the first that brings the cumulative mass to 1 - delta, plus
the sampled token (always the last slot; ``-inf`` marks unused slots, as in ``types.py``). The
V - |S| dropped tokens get the default probability p_d and the kept ones are rescaled by gamma
(eq. 21) so the stored log-probs sum to 1 - (V - |S|) p_d. ``sparsify`` works in chunks of rows
(top-K in the input dtype, logsumexp in fp32 blocks), so no fp32 copy of the batch's
distributions is made besides the caller's logits.

The projection then runs on a (K+2)-dimensional *reduced* distribution (``reduce_on_kept_set``):
the K+1 slots of the old kept set S plus one "tail" atom that stands for the V - |S| dropped
tokens. Both sparse distributions put exactly p_d on every dropped token (Definition A.1 with the
old policy's S for both, as Theorem A.2 assumes), so
- each tail token adds p_d log(p_d / p_d) = 0 to KL(q_new' || q_old'): the tail atom with mass
  m = (V - |S|) p_d in both distributions adds m log(m / m) = 0 as well;
- the projection (eq. 4) maps each tail token to p_d^(1/(eta+1)) p_d^(eta/(eta+1)) = p_d before
  normalisation, the same for all of them, so projecting with one atom of mass m and spreading
  its result evenly over the tail is exactly the projection of the V-dimensional sparse pair.
The new policy's sparse log-probs on S are gamma-renormalised like the old ones: they depend only
on the current logits at S (the full-vocabulary log-normaliser cancels), so the loss needs no
logsumexp over V and its gradient reaches only the logits at S. Mass the current policy moves
outside S is not seen by the projection (Theorem A.2 assumes the kept sets agree); the objective
logs the current policy's mass on S as ``troll/kept_mass`` to show how much that is.

    index, logp = sparsify(old_logits, responses)   # [B,T,V], [B,T] -> [B,T,K+1] x 2

Tests: ``pytest tests/algorithms/test_troll.py``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from runners.algorithms.troll_solver import log_normalize

__all__ = [
    "SparseBound",
    "check_sparse_params",
    "chunked_logsumexp",
    "dense_storage_bytes",
    "large_topk",
    "reduce_on_kept_set",
    "sparse_storage_bytes",
    "sparsify",
    "store_from_topk",
    "theorem_a2_bound",
]


def check_sparse_params(vocab: int, k: int, delta: float, p_default: float) -> None:
    """Raise ``ValueError`` naming the parameter when a sparse store's k, delta or p_default cannot work for V."""
    if not 1 <= k <= vocab:
        raise ValueError(f"troll sparsify k must be in [1, V={vocab}], got {k!r}")
    if not 0 <= delta < 1:
        raise ValueError(f"troll sparsify delta must be in [0, 1), got {delta!r}")
    if not 0 < p_default or vocab * p_default >= 1:
        raise ValueError(f"troll p_default must be > 0 with V * p_default < 1 (V={vocab}), got {p_default!r}")


# On CPU, logsumexp runs over blocks of about 2^23 values (32 MiB in fp32, the L3 size of the
# test machine) so the exp temporary stays in cache: 0.09 s instead of 0.23-0.29 s CPU time for
# 512 x 151936 fp32 logits on one thread. Smaller blocks (2^21) were as fast on one thread but
# 2-4x slower with two contended threads (more parallel regions).
_CPU_BLOCK_VALUES = 1 << 23


def chunked_logsumexp(
    x: Tensor, rows: Tensor | None = None, chunk_size: int = 1024, dtype: torch.dtype = torch.float32
) -> Tensor:
    """logsumexp over the last dim of x [N,V] (of ``rows`` [R] only if given) -> [N] or [R] in ``dtype``.

    No grad. Upcasts at most ``chunk_size`` rows (on CPU: one cache-sized block) at a time. On CPU
    it works on contiguous row slices (no gathered copy of x) and skips slices that hold none of
    ``rows``; a block is first summed without the max shift (one read of the block instead of two),
    and rows whose sum overflowed or fell below 1e-30 (max logit above ~88 or below ~-69, where the
    unshifted sum is inaccurate) are recomputed with the shift. On other devices ``rows`` are
    gathered ``chunk_size`` at a time and every block takes the shifted form, with no host
    synchronisation. ``dtype=torch.float64`` sums in float64: about 3x the time, but a float32
    result of a V = 49,152 row is off by up to ~1e-6 (its rounding at |lse| ~ 10 and the float32
    sum), an offset every log-prob taken from it shares.
    """
    if x.device.type != "cpu":
        return _device_logsumexp(x, rows, chunk_size, dtype)
    n, vocab = x.shape
    block_values = _CPU_BLOCK_VALUES * 4 // torch.empty((), dtype=dtype).element_size()
    step = max(1, min(chunk_size, block_values // max(1, vocab)))
    wanted = None
    if rows is not None:
        wanted = torch.zeros(n, dtype=torch.bool, device=x.device)
        wanted[rows] = True
    out = torch.zeros(n, dtype=dtype, device=x.device)
    with torch.no_grad():
        for start in range(0, n, step):
            stop = min(start + step, n)
            if wanted is not None and not bool(wanted[start:stop].any()):
                continue
            block = x[start:stop].to(dtype)
            total = block.exp().sum(-1)
            bad = ~((total > 1e-30) & (total < math.inf))
            out[start:stop] = total.log_()
            if not bool(bad.any()):
                continue
            out[start:stop][bad] = _shifted_logsumexp(block[bad])
    return out if rows is None else out[rows]


def _shifted_logsumexp(block: Tensor) -> Tensor:
    """max + log sum exp(x - max) over the last dim; rows that are all -inf give -inf."""
    top = block.amax(-1, keepdim=True)
    top = torch.where(top > -math.inf, top, torch.zeros_like(top))
    return (block - top).exp_().sum(-1).log_() + top.squeeze(-1)


def _device_logsumexp(x: Tensor, rows: Tensor | None, chunk_size: int, dtype: torch.dtype) -> Tensor:
    """``chunked_logsumexp`` on an accelerator: contiguous blocks of ``chunk_size`` rows (every row:
    no per-block test of ``rows``, no gathered copy), then the selected rows; no host sync."""
    n = x.shape[0]
    step = max(1, chunk_size)
    out = torch.empty(n, dtype=dtype, device=x.device)
    with torch.no_grad():
        for start in range(0, n, step):
            out[start : start + step] = _shifted_logsumexp(x[start : start + step].to(dtype))
    return out if rows is None else out[rows]


# Top-K over a large vocabulary in two stages: the maxima of groups of _TOPK_GROUP consecutive
# tokens, the K groups with the largest maxima (they hold every top-K token: a group that holds
# one of them has a maximum at least as large, so at most K groups reach the K-th value), then
# top-K among those K x _TOPK_GROUP candidates. Exact (ties aside, which torch.topk also orders
# arbitrarily); used where V >= _TOPK_TWO_STAGE_MIN_V. On an H200, [1024, 151936] float32 with
# K = 64: ~1.8 ms for one torch.topk.
_TOPK_GROUP = 128
_TOPK_TWO_STAGE_MIN_V = 16384


def large_topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """``torch.topk(x, k, dim=-1)`` (values in decreasing order, int64 indices) for x [N,V]."""
    n, vocab = x.shape
    groups, rest = divmod(vocab, _TOPK_GROUP)
    if vocab < _TOPK_TWO_STAGE_MIN_V or k > groups:
        return torch.topk(x, k, dim=-1)
    tiles = x[:, : groups * _TOPK_GROUP].reshape(n, groups, _TOPK_GROUP)
    best_groups = torch.topk(tiles.amax(-1), k, dim=-1).indices  # [N,K]
    cand = tiles.gather(1, best_groups.unsqueeze(-1).expand(n, k, _TOPK_GROUP)).reshape(n, -1)
    cand_index = (best_groups.unsqueeze(-1) * _TOPK_GROUP + torch.arange(_TOPK_GROUP, device=x.device)).reshape(n, -1)
    if rest:  # the last V mod _TOPK_GROUP tokens are always candidates
        cand = torch.cat([cand, x[:, groups * _TOPK_GROUP :]], dim=-1)
        tail = torch.arange(groups * _TOPK_GROUP, vocab, device=x.device).expand(n, rest)
        cand_index = torch.cat([cand_index, tail], dim=-1)
    values, where = torch.topk(cand, k, dim=-1)
    return values, cand_index.gather(-1, where)


def sparsify(
    logits: Tensor,
    sampled: Tensor,
    *,
    k: int = 64,
    delta: float = 1e-5,
    p_default: float = 1e-12,
    chunk_size: int = 1024,
    return_mass: bool = False,
    renormalize: bool = True,
) -> tuple[Tensor, Tensor] | tuple[Tensor, Tensor, Tensor]:
    """Sparse form of a token distribution (TROLL, arXiv 2510.03817, section 3.2, eq. 21).

    logits: [..., V] logits or log-probs (only differences matter); sampled: [...] token ids.
    Returns ``index`` [..., K+1] int32 and ``logp`` [..., K+1] float32: slots 0..K-1 hold the
    top-K tokens in decreasing probability, only as many as needed to reach cumulative mass
    1 - delta; slot K holds the sampled token (removed from the top slots if it was among them);
    unused slots have logp = -inf and index 0. Kept log-probs are log p(x) + log gamma with
    gamma = (1 - (V - |S|) p_default) / sum_S p. With ``return_mass`` also returns the kept mass
    sum_S p [...] (float32) before renormalisation. ``renormalize=False`` stores the kept tokens'
    true log-probs log p(x) instead (their sum is the kept mass): the form a trainer stores for the
    old / rollout policy, from which TROLL renormalises on S itself (``reduce_on_kept_set``) and TRM
    takes exact per-token divergences with the missing mass as one rest bin.
    """
    vocab = logits.shape[-1]
    check_sparse_params(vocab, k, delta, p_default)
    if sampled.shape != logits.shape[:-1]:
        raise ValueError(f"sampled {tuple(sampled.shape)} must match logits' leading shape {tuple(logits.shape[:-1])}")
    flat = logits.detach().reshape(-1, vocab)
    ids = sampled.reshape(-1).long()
    if ids.numel():
        low, high = torch.stack([ids.min(), ids.max()]).tolist()  # one host read
        if low < 0 or high >= vocab:
            raise ValueError(f"sampled token ids must be in [0, {vocab}), got range [{low}, {high}]")
    index = torch.zeros(flat.shape[0], k + 1, dtype=torch.int32, device=flat.device)
    logp = torch.full((flat.shape[0], k + 1), -math.inf, dtype=torch.float32, device=flat.device)
    mass = torch.empty(flat.shape[0], dtype=torch.float32, device=flat.device)
    with torch.no_grad():
        for start in range(0, flat.shape[0], chunk_size):
            rows = slice(start, start + chunk_size)
            index[rows], logp[rows], mass[rows] = _sparsify_chunk(
                flat[rows], ids[rows], k, delta, p_default, renormalize
            )
    out_shape = (*logits.shape[:-1], k + 1)
    if return_mass:
        return index.reshape(out_shape), logp.reshape(out_shape), mass.reshape(logits.shape[:-1])
    return index.reshape(out_shape), logp.reshape(out_shape)


def _sparsify_chunk(
    x: Tensor, ids: Tensor, k: int, delta: float, p_default: float, renormalize: bool = True
) -> tuple[Tensor, Tensor, Tensor]:
    """One chunk of ``sparsify``: x [C,V] (any float dtype), ids [C] -> index, logp [C,K+1], mass [C]."""
    vocab = x.shape[-1]
    # true log-probs are kept in float64: a float32 normaliser shifts every one by up to ~1e-6
    # (V = 49,152), which the missing mass 1 - sum p that TRM's rest bin reads would inherit; the
    # renormalised form cancels any shift (gamma divides by the same kept mass), so float32 does there
    dtype = torch.float32 if renormalize else torch.float64
    lse = chunked_logsumexp(x, chunk_size=x.shape[0] or 1, dtype=dtype).double()
    top_val, top_idx = large_topk(x, k)  # in the input dtype: no fp32 copy of the chunk
    idx, lp = store_from_topk(top_val, top_idx, x.gather(-1, ids.unsqueeze(-1)).squeeze(-1), lse, ids, delta, p_default)
    kept = lp > -math.inf
    mass = torch.logsumexp(lp, -1).exp()
    if renormalize:
        gamma = (1 - (vocab - kept.sum(-1)).double() * p_default) / mass
        lp = torch.where(kept, lp + gamma.log().unsqueeze(-1), -math.inf)
    idx = torch.where(kept, idx, torch.zeros_like(idx))
    return idx.to(torch.int32), lp.float(), mass.float()


def store_from_topk(
    top_val: Tensor, top_idx: Tensor, z_y: Tensor, lse: Tensor, ids: Tensor, delta: float, p_default: float
) -> tuple[Tensor, Tensor]:
    """The true-log-prob store [C,K+1] (index, float64 log-probs) from a chunk's top-K logits [C,K], the
    sampled tokens' logits ``z_y`` [C] and the float64 log-normaliser ``lse`` [C] (``sparsify``'s layout:
    the top tokens up to mass 1 - delta, the sampled token last; shared with ``chunked_head``)."""
    k = top_val.shape[-1]
    lse = lse.double().unsqueeze(-1)
    top_lp = top_val.double() - lse
    # keep the first n tokens with n = 1 + #{j < K-1 : cumsum_j < 1 - delta} (cut after reaching it)
    before = torch.cumsum(top_lp.exp(), -1) < 1 - delta
    n_keep = (1 + before[:, :-1].sum(-1)).clamp(max=k)
    keep = torch.arange(k, device=top_val.device) < n_keep.unsqueeze(-1)
    keep &= top_lp > -math.inf  # never keep zero-probability tokens
    keep &= top_idx != ids.unsqueeze(-1)  # the sampled token goes to the last slot instead
    y_lp = z_y.double().unsqueeze(-1) - lse
    # a sampled token with zero probability (logits of another policy) keeps the dropped-token mass p_d
    y_lp = torch.where(y_lp > -math.inf, y_lp, math.log(p_default))
    lp = torch.cat([torch.where(keep, top_lp, -math.inf), y_lp], dim=-1)
    idx = torch.cat([torch.where(keep, top_idx, torch.zeros_like(top_idx)), ids.unsqueeze(-1)], dim=-1)
    return idx, lp


class ReducedPair(NamedTuple):
    """New and old sparse distributions on the old kept set plus one tail atom ([N, K+2] each)."""

    logq: Tensor  # new policy, differentiable in the logits, float64
    logo: Tensor  # old policy, float64, constant
    kept: Tensor  # [N] number of kept slots |S|


def reduce_on_kept_set(
    logits_at_kept: Tensor, old_logp: Tensor, vocab: int, *, p_default: float = 1e-12
) -> ReducedPair:
    """Reduced (K+2)-dim pair for the projection (see the module docstring; eq. 21 for both).

    logits_at_kept: [N,K+1] current logits gathered at the old kept ids (differentiable; any float
    dtype); old_logp: [N,K+1] stored old log-probs (-inf = unused slot). Both are renormalised on S
    to total 1 - m, m = (V - |S|) p_default, and the tail atom log m is appended as the last entry.
    Rows where the new logits are -inf on all of S put all new mass on the tail atom. Rows without
    any kept slot must be removed by the caller.
    """
    check_sparse_params(vocab, 1, 0.0, p_default)
    valid = old_logp > -math.inf
    kept = valid.sum(-1)
    tail = ((vocab - kept).double() * p_default).unsqueeze(-1)  # [N,1]
    log_tail = torch.where(tail > 0, tail.log(), -math.inf)
    log_rest = torch.log1p(-tail)
    old = torch.where(valid, old_logp.double(), -math.inf)
    logo = torch.cat([log_rest + log_normalize(old), log_tail], dim=-1)
    new = torch.where(valid, logits_at_kept.double(), -math.inf)
    has_mass = (new > -math.inf).any(-1, keepdim=True)
    new_safe = torch.where(has_mass, new, torch.where(valid, 0.0, -math.inf))
    logq_kept = torch.where(has_mass, log_rest + log_normalize(new_safe), -math.inf)
    logq = torch.cat([logq_kept, torch.where(has_mass, log_tail, 0.0)], dim=-1)
    return ReducedPair(logq, logo, kept)


class SparseBound(NamedTuple):
    """Theorem A.2: KL(p || q) <= factor * KL(p' || q') + additive; ``bound`` at KL(p' || q') = eps."""

    factor: float
    additive: float
    bound: float


def theorem_a2_bound(V: int, K: int, delta: float, p_d: float, q_min: float, eps: float) -> SparseBound:
    """Theorem A.2 (TROLL, arXiv 2510.03817, appendix A.4): factor = (1 - delta) / (1 - (V - K) p_d) = 1 / gamma,
    additive = delta log(delta / q_min), bound = factor * eps + additive (natural log)."""
    factor = (1 - delta) / (1 - (V - K) * p_d)
    additive = delta * math.log(delta / q_min)
    return SparseBound(factor, additive, factor * eps + additive)


def dense_storage_bytes(tokens: int, responses: int, vocab: int, *, bytes_per_value: int = 4) -> int:
    """Bytes of dense old-policy distributions for one prompt (TROLL, arXiv 2510.03817, eq. 23: 256 x 8 x 151936 x 4 B)."""
    return tokens * responses * vocab * bytes_per_value


def sparse_storage_bytes(
    tokens: int, responses: int, kept_per_token: float, *, index_bytes: int = 4, value_bytes: int = 4
) -> float:
    """Bytes of sparse (id, log-prob) pairs for one prompt with ``kept_per_token`` slots per token.

    ``kept_per_token`` = K + 1 for the padded [.., K+1] layout of ``sparsify``, or the mean kept
    count for a packed layout (TROLL, arXiv 2510.03817, appendix E.4: 5-10 per token -> under 1 MiB per prompt).
    """
    return tokens * responses * kept_per_token * (index_bytes + value_bytes)
