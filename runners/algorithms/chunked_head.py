"""Sampled-token log-probs, entropies and TROLL's sparse store from hidden states, chunk by chunk.

The output layer's logits ``z = (h W^T + b) / temperature`` [N,V] are never held for all N rows at
once: rows of ``h`` are processed ``chunk_size`` at a time, in the manner of Cut Cross-Entropy
("Cut Your Losses in Large-Vocabulary Language Models", arXiv 2411.09009) and Liger
Kernel's fused linear cross-entropy. Per token it returns the log-prob of the sampled token, the
entropy of ``softmax(z)`` and, optionally, the top-K sparse store of
``runners.algorithms.troll_sparse.sparsify(z, tokens, renormalize=False)`` (same layout, values).

    out = chunked_head(h, lm_head.weight, responses, temperature=1.0, sparse={"k": 64})
    out.logp, out.entropy        # [N] float32, differentiable w.r.t. h, W (and b)
    out.topk_index, out.topk_logp  # [N,K+1] int32 / float32, no grad (None without ``sparse``)

Design decisions:

- Arithmetic: each chunk's logits come from one float32 matmul (float64 for float64 inputs; bf16 /
  fp16 inputs are upcast: ``W`` once per call, a [V,H] float32 copy that is freed after the call).
  With ``m`` the row maximum, ``t = z - m``, ``s = sum exp(t)`` (float32, pairwise summation):
  ``log p_y = t_y - log s`` (the composite ``x[y] - logsumexp(x)`` form of
  ``numerics.token_logprobs``, not ATen's float32 ``log_softmax``, which is off by 1.4e-4 at
  V = 151,936 on peaked rows) and ``H = log s - sum exp(t) t / s``, both differences taken in
  float64 from the float32 row sums: values relative to the row maximum, and nothing of size
  |logsumexp| is rounded to float32 before a difference is taken.
- Gradients are float32 GEMMs over the chunk: ``dL/dh`` sums V products per entry, so its error
  is that of any float32 matmul over V terms (a few 1e-6 of the largest entry at V = 151,936 on
  CPU; the dense path's ``logits.grad @ W`` has the same kind).
- Saved for backward: ``h``, ``W``, ``b``, the token ids and per row ``m``, ``log s`` and ``H``
  ([N] each); no logits. Backward recomputes each chunk's ``t`` bit for bit (same matmul, same
  chunking) and forms ``dL/dz = g_logp (onehot(y) - p) - g_H p (log p + H)``; then
  ``dL/dh = dL/dz W / T``, ``dL/dW = dL/dz^T h / T``, ``dL/db = sum_rows dL/dz / T``. Gradients
  reach the parameters through both outputs (entropy bonus, entropy controllers); an output that
  no loss reads costs nothing in backward.
- Working set: about two [chunk_size, V] buffers of the compute dtype, plus the [V,H] gradient of
  ``W`` (and its float32 copy for lower-precision ``W``). ``chunk_size=None`` picks
  ``default_chunk_size(V, device)``: on CPU ``2**23 // V`` rows (32 MiB per float32 buffer: 170 rows
  at V = 49,152, 55 at 151,936; the forward and backward at H = 576 over 2,785 and 1,024 tokens took
  0.93x and 0.84x the time of half as many rows, whose matmuls are too thin), elsewhere ``2**26 // V`` (441 rows: fewer kernel launches; on an
  H200 at N = 4,096, 256- and 1,024-row chunks took 0.50x and 0.45x the dense update's time).
- The sparse store (TROLL, arXiv 2510.03817, section 3.2, eq. 21): top-K by ``troll_sparse.large_topk``
  on the chunk's logits ``z`` (before the shift), log-probs in float64 as ``z - (m + log s)``
  (``log s`` of the float32 sum, relative error ~1e-7, where ``sparsify`` sums float64
  exponentials), cut after the token that brings the cumulative mass to ``1 - delta``, the sampled
  token in the last slot; as ``sparsify(..., renormalize=False)``: the kept tokens' true log-probs.
- ``bias`` may hold ``-inf`` (a masked vocabulary entry) as long as each row keeps a finite logit;
  such entries get probability 0, no NaN in values or gradients. Without a bias the logits are
  finite for finite ``h``, ``W``, and the NaN guards are skipped.
- Token ids are checked once per call (one host read), as ``sparsify`` does.

Tests: ``pytest tests/algorithms/test_chunked_head.py``; benchmark:
``python tests/benchmarks/bench_chunked_head.py``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from runners.algorithms.method import SPARSE_DEFAULTS
from runners.algorithms.troll_sparse import check_sparse_params, large_topk, store_from_topk
from runners.algorithms.workspace import Workspace

__all__ = ["HeadOutputs", "chunked_head", "default_chunk_size", "output_logits"]

# the built-in trainer's old pass goes through chunked_head from this vocabulary size on (Qwen's
# 151,936, SmolLM2's 49,152); below it a micro-batch's logits are small and the dense path stays
# (the embedded model's 28 tokens: the demo's numbers are those of the dense path)
MIN_VOCAB = 32768
_CHUNK_VALUES = {"cpu": 1 << 23}  # values per [chunk, V] buffer when chunk_size is None
_DEVICE_CHUNK_VALUES = 1 << 26  # any other device
VOCAB_BLOCK = 1024  # CPU: vocabulary columns per matmul of the output layer (``output_logits``)
_SPARSE_DEFAULTS = {
    "k": SPARSE_DEFAULTS["top_k"],
    "delta": SPARSE_DEFAULTS["tail_mass"],
    "p_default": SPARSE_DEFAULTS["p_default"],
}


class HeadOutputs(NamedTuple):
    """Per-token results of ``chunked_head`` (leading shape of ``tokens``)."""

    logp: Tensor  # log softmax(z)[y], float32 (float64 for float64 inputs)
    entropy: Tensor  # -sum p log p, same dtype
    topk_index: Tensor | None  # [..., K+1] int32, sparsify's layout
    topk_logp: Tensor | None  # [..., K+1] float32, true log-probs (-inf: unused slot)
    gather_logp: Tensor | None = None  # [..., G] float64 log softmax(z) at ``gather``'s ids, differentiable


def default_chunk_size(vocab: int, device: str | torch.device = "cpu") -> int:
    """Rows per chunk when ``chunk_size`` is None: one [rows, V] buffer holds about 2**23 values on
    CPU, 2**26 on other devices."""
    values = _CHUNK_VALUES.get(torch.device(device).type, _DEVICE_CHUNK_VALUES)
    return max(1, values // max(1, vocab))


def _sparse_params(sparse: Mapping | None, vocab: int) -> tuple[int, float, float] | None:
    if sparse is None:
        return None
    unknown = set(sparse) - set(_SPARSE_DEFAULTS)
    if unknown:
        raise ValueError(f"chunked_head sparse: unknown key(s) {sorted(unknown)}; valid: k, delta, p_default")
    p = {**_SPARSE_DEFAULTS, **sparse}
    k, delta, p_default = int(p["k"]), float(p["delta"]), float(p["p_default"])
    check_sparse_params(vocab, k, delta, p_default)
    return k, delta, p_default


def chunked_head(
    hidden: Tensor,
    weight: Tensor,
    tokens: Tensor,
    *,
    bias: Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    sparse: Mapping | None = None,
    gather: Tensor | None = None,
    gather_store: bool = False,
    exact_sum: bool = False,
) -> HeadOutputs:
    """Log-prob of ``tokens``, entropy and (``sparse``) the top-K store of ``softmax((h W^T + b) / T)``.

    Args:
        hidden: [..., H] last hidden states (float32, bf16, fp16 or float64).
        weight: [V, H] output matrix (``lm_head.weight``), same dtype family as ``hidden``.
        tokens: [...] long, the sampled token ids (padded positions need a valid id; mask them in
            the loss: a zero upstream gradient adds nothing).
        bias: optional [V] output bias.
        temperature: the sampling temperature (> 0); logits are divided by it, as verl does.
        chunk_size: rows of ``hidden`` per chunk (None: ``default_chunk_size(V, hidden.device)``).
        sparse: None, or a mapping with any of ``k`` (64), ``delta`` (1e-5), ``p_default`` (1e-12):
            also return ``sparsify(z, tokens, renormalize=False, **sparse)``'s index and log-probs.
        gather: optional [..., G] long vocabulary ids per position (e.g. the old policy's top-K store,
            TROLL's kept set or TRM's exact-KL support): also return ``log softmax(z)`` at those ids,
            in float64 (their masses are summed: TRM's rest bin ``1 - sum q`` can be ~1e-7).
        gather_store: gather at the ids of the top-K store this same pass returns (needs ``sparse``,
            not with ``gather``): what ``gather=`` that store's index would give, bit for bit, in one
            pass, where the store is pi_old's and the logits are the policy's own (on-policy, before
            any optimiser step: TROLL's fused update).
        exact_sum: accumulate ``s = sum exp(t)`` in float64 (about twice the forward's reductions):
            then ``log s``, and with it every log-prob, is that of the float32 logits to ~1e-12 rather
            than ~1e-7 (as a float64 logsumexp of them), as
            TRM's exact KL needs for rest masses of ~1e-7 (``trm._sparse_token_stats``).

    Returns:
        ``HeadOutputs``; ``logp``, ``entropy`` and ``gather_logp`` are differentiable w.r.t. hidden,
        weight and bias.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 or None, got {chunk_size!r}")
    if weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"hidden {tuple(hidden.shape)} must be [..., H] with weight [V, H], got {tuple(weight.shape)}")
    if hidden.shape[:-1] != tokens.shape:
        raise ValueError(f"tokens {tuple(tokens.shape)} must match hidden's leading shape {tuple(hidden.shape[:-1])}")
    vocab = weight.shape[0]
    if bias is not None and bias.shape != (vocab,):
        raise ValueError(f"bias must be [V={vocab}], got {tuple(bias.shape)}")
    params = _sparse_params(sparse, vocab)
    if gather_store and (params is None or gather is not None):
        raise ValueError("gather_store needs sparse (the store whose ids it gathers at) and no gather")
    ids = tokens.reshape(-1).long()
    if gather is not None and (gather.dim() != tokens.dim() + 1 or gather.shape[:-1] != tokens.shape):
        raise ValueError(f"gather {tuple(gather.shape)} must be [..., G] with [...] = tokens {tuple(tokens.shape)}")
    gids = gather.reshape(ids.shape[0], -1).long() if gather is not None else ids.new_zeros(ids.shape[0], 0)
    _check_ids(torch.cat([ids, gids.reshape(-1)]), vocab, "token ids" if gather is None else "token and gather ids")
    rows = chunk_size or default_chunk_size(vocab, hidden.device)
    flat = hidden.reshape(-1, hidden.shape[-1])
    logp, entropy, index, store, picked = _ChunkedHead.apply(
        flat, weight, bias, ids, gids, 1.0 / temperature, rows, params, exact_sum, gather_store
    )
    lead = tokens.shape
    picked = picked.reshape(*lead, picked.shape[-1]) if gather is not None or gather_store else None
    if params is None:
        return HeadOutputs(logp.reshape(lead), entropy.reshape(lead), None, None, picked)
    k1 = params[0] + 1
    index, store = index.reshape(*lead, k1), store.reshape(*lead, k1)
    return HeadOutputs(logp.reshape(lead), entropy.reshape(lead), index, store, picked)


def _check_ids(ids: Tensor, vocab: int, what: str) -> None:
    """Every id in [0, V): one host read for the whole call."""
    if ids.numel():
        low, high = torch.stack([ids.min(), ids.max()]).tolist()
        if low < 0 or high >= vocab:
            raise ValueError(f"{what} must be in [0, {vocab}), got range [{low}, {high}]")


def _compute_dtype(hidden: Tensor) -> torch.dtype:
    return torch.promote_types(hidden.dtype, torch.float32)


def _scaled(h: Tensor, cd: torch.dtype, inv_t: float) -> Tensor:
    """One chunk of hidden states in the compute dtype, times 1 / temperature."""
    h = h.to(cd)
    return h * inv_t if inv_t != 1.0 else h


def output_logits(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, *, workspace: Workspace | None = None
) -> Tensor:
    """``F.linear(x, weight, bias)`` for an output layer (``x`` [M,H], ``weight`` [V,H]): the same values,
    bit for bit; float32 on CPU is computed in blocks of ``VOCAB_BLOCK`` vocabulary columns, into the
    ``workspace``'s ``"logits"`` buffer where one is given (overwritten by the next such call).

    One float32 matmul over all V columns of a few dozen rows runs at 0.6-0.7 of the speed of the same
    work in 1,024-column blocks with torch's CPU BLAS (MKL; measured at V = 49,152 and 151,936, 16-256
    rows, 1 and 2 threads: ``tests/benchmarks/bench_output_layer.py``); each output entry is the same
    dot product over H either way (float64 is not: its BLAS orders the sum by the block shape). Elsewhere
    (a GPU: one kernel launch matters more; other dtypes) it is ``F.linear``."""
    vocab = weight.shape[0]
    exact = x.device.type == "cpu" and x.dim() == 2 and x.dtype == weight.dtype == torch.float32
    if not exact or vocab <= VOCAB_BLOCK:
        return torch.nn.functional.linear(x, weight, bias)
    shape = (x.shape[0], vocab)
    out = workspace.get("logits", shape, x) if workspace is not None else x.new_empty(shape)
    w_t = weight.t()
    for start in range(0, vocab, VOCAB_BLOCK):
        cols = slice(start, start + VOCAB_BLOCK)
        if bias is None:
            torch.mm(x, w_t[:, cols], out=out[:, cols])
        else:
            torch.addmm(bias[cols], x, w_t[:, cols], out=out[:, cols])
    return out


def _logits(hs: Tensor, weight: Tensor, b: Tensor | None, inv_t: float, workspace: Workspace) -> Tensor:
    """``z = hs W^T + b * inv_t`` for one chunk [C,V] (``hs`` already scaled by ``inv_t``); forward and
    backward both compute it here, so the backward's recomputation is the forward's bit for bit.
    Chunk after chunk, the logits and their exponentials go into the same two ``workspace`` buffers."""
    return output_logits(hs, weight, None if b is None else (b * inv_t if inv_t != 1.0 else b), workspace=workspace)


class _ChunkedHead(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, ids, gids, inv_t, rows, params, exact_sum, own_ids):
        cd = _compute_dtype(hidden)
        n = hidden.shape[0]
        dev = hidden.device
        w = weight.to(cd)
        b = bias.to(cd) if bias is not None else None
        maxima = torch.empty(n, 1, dtype=cd, device=dev)
        log_s = torch.empty(n, dtype=cd, device=dev)
        logp = torch.empty(n, dtype=cd, device=dev)
        entropy = torch.empty(n, dtype=cd, device=dev)
        k1 = params[0] + 1 if params is not None else 0
        if own_ids:  # the store's own ids, filled chunk by chunk
            gids = ids.new_zeros(n, k1)
        index = torch.zeros(n, k1, dtype=torch.int32, device=dev)
        store = torch.full((n, k1), -math.inf, dtype=torch.float32, device=dev)
        picked = torch.empty(n, gids.shape[1], dtype=torch.float64, device=dev)
        workspace = Workspace()
        with torch.no_grad():
            for start in range(0, n, rows):
                sl = slice(start, start + rows)
                z = _logits(_scaled(hidden[sl], cd, inv_t), w, b, inv_t, workspace)
                m = z.amax(-1, keepdim=True)
                z_y = z.gather(-1, ids[sl, None])
                z_g = z.gather(-1, gids[sl]) if gids.shape[1] and not own_ids else None
                z_0 = z[:, :1].clone() if own_ids else None  # a dropped slot of the store holds id 0
                top = large_topk(z, params[0]) if params is not None else None  # before the shift: exact z
                t = z.sub_(m)
                e = torch.exp(t, out=workspace.like("exp", t))
                s = e.sum(-1, dtype=torch.float64) if exact_sum else e.sum(-1)
                if b is not None:  # -inf logits: p log p := 0
                    t.clamp_(min=torch.finfo(cd).min)
                dot = e.mul_(t).sum(-1)
                s64 = s.double()
                ls64 = s64.log()  # float64 from here: no rounding at |log s| ~ log V
                logp[sl] = ((z_y - m).squeeze(-1).double() - ls64).to(cd)
                entropy[sl] = (ls64 - dot.double() / s64).to(cd)
                if z_g is not None:
                    picked[sl] = z_g.double() - m.double() - ls64[:, None]
                if top is not None:
                    lse = m.squeeze(-1).double() + ls64
                    idx, lp = store_from_topk(*top, z_y.squeeze(-1), lse, ids[sl], *params[1:])
                    index[sl], store[sl] = idx.to(torch.int32), lp.float()
                    if own_ids:  # z at the store's ids: a kept top-K slot's own logit, else id 0's; the token's
                        z_s = torch.cat([torch.where(idx[:, :-1] == top[1], top[0], z_0), z_y], dim=-1)
                        gids[sl] = idx
                        picked[sl] = z_s.double() - m.double() - ls64[:, None]
                maxima[sl], log_s[sl] = m, ls64.to(cd)
        ctx.save_for_backward(hidden, weight, bias, ids, gids, maxima, log_s, entropy)
        ctx.inv_t, ctx.rows = inv_t, rows
        ctx.mark_non_differentiable(index, store)
        ctx.set_materialize_grads(False)
        return logp, entropy, index, store, picked

    @staticmethod
    @once_differentiable
    def backward(ctx, g_logp, g_ent, _g_index, _g_store, g_pick):
        hidden, weight, bias, ids, gids, maxima, log_s, entropy = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        if g_pick is not None and not gids.shape[1]:
            g_pick = None
        none = (None,) * 7
        if g_logp is None and g_ent is None and g_pick is None or not (need_h or need_w or need_b):
            return None, None, None, *none
        cd = _compute_dtype(hidden)
        inv_t, rows = ctx.inv_t, ctx.rows
        w = weight.to(cd)
        b = bias.to(cd) if bias is not None else None
        grad_h = torch.empty(hidden.shape, dtype=cd, device=hidden.device) if need_h else None
        grad_w = torch.zeros_like(w) if need_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=cd, device=hidden.device) if need_b else None
        workspace = Workspace()
        for start in range(0, hidden.shape[0], rows):
            sl = slice(start, start + rows)
            hs = _scaled(hidden[sl], cd, inv_t)
            t = _logits(hs, w, b, inv_t, workspace).sub_(maxima[sl])  # bit for bit the forward's t
            t.sub_(log_s[sl, None])  # log p
            p = torch.exp(t, out=workspace.like("exp", t))
            g_l = g_logp[sl, None].to(cd) if g_logp is not None else None
            g_g = g_pick[sl].to(cd) if g_pick is not None else None
            # every log-prob output's upstream gradient also multiplies -p: their row sum
            g_sum = (
                g_l if g_g is None else (g_g.sum(-1, keepdim=True) if g_l is None else g_l + g_g.sum(-1, keepdim=True))
            )
            if g_ent is not None:  # -g_H p (log p + H) - g_sum p
                if b is not None:
                    t.masked_fill_(p == 0, 0.0)
                t.add_(entropy[sl, None]).mul_(g_ent[sl, None].to(cd))
                if g_sum is not None:
                    t.add_(g_sum)
                g = t.mul_(p).neg_()
            else:
                g = p.mul_(-g_sum)
            if g_l is not None:
                g.scatter_add_(1, ids[sl, None], g_l)
            if g_g is not None:  # repeated ids within a row add up, as gather's own backward does
                g.scatter_add_(1, gids[sl], g_g)
            if need_h:
                grad_h[sl] = (g @ w).mul_(inv_t)
            if need_w:
                grad_w.addmm_(g.t(), hs)
            if need_b:
                grad_b.add_(g.sum(0), alpha=inv_t)
        return (
            grad_h.to(hidden.dtype) if need_h else None,
            grad_w.to(weight.dtype) if need_w else None,
            grad_b.to(bias.dtype) if need_b else None,
            *none,
        )
