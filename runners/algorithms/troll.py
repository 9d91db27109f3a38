"""TROLL objective: trust-region projection instead of PPO clipping (TROLL, arXiv 2510.03817, eq. 5, Algorithm 1).

Design: per response token the current distribution is projected onto the KL ball of radius eps
around the old (rollout) distribution (``troll_solver.project``), and the projected policy gives
the importance ratio; a regression term pulls the raw policy toward its projection:

    loss[b,t] = -r_proj[b,t] * A[b,t] + alpha * KL(q_new || stopgrad(q_proj)),
    r_proj = exp(lp[y] - lo[y]).

Two ways to pass the old policy in ``PolicyInputs``:
- sparse (default, section 3.2): ``old_topk_index`` / ``old_topk_logp`` [B,T,K+1] from
  ``sparsify`` at rollout time. Both policies are compared on the old kept set S plus one tail
  atom for the V - |S| dropped tokens at p_default each (see ``troll_sparse``); q_new, q_proj and
  the ratio all live in that sparse space. The loss gathers the current logits at S only: no
  logsumexp over V and no fp32 copy of the batch's distributions (the kept-mass metric reads the
  logits ``chunk_size`` rows at a time without grad). A backend that never holds the logits
  (``chunked_head``) passes ``topk_logp`` instead: the current log-probs at S, with ``vocab_size``;
  on S they differ from the logits by the row's logsumexp, which the renormalisation on S cancels.
- dense (exact section 3.1 projection, for small vocabularies and reference checks):
  ``old_topk_index=None`` and ``old_topk_logp`` = full old log-probs [B,T,V]. The response rows'
  log_softmax is then materialised, as a PPO loss would. Old log-probs must be finite wherever
  the current policy has mass: a token with q_old = 0 < q_new gets q_proj = 0 and an infinite
  regression term (the sparse path avoids this with p_default).

The sampled token is located by ``inp.responses`` when given (required in dense mode); without
it the sparse layout of ``sparsify`` is assumed (sampled token in the last slot).
``sequence=True`` is the GSPO variant: the ratio of every token is the sequence's geometric mean
of r_proj in GSPO's stop-gradient form, sg(s_i) * exp(log r_t - sg(log r_t)). Advantages are an
input, so any estimator works. Only response-mask tokens are projected and get a loss (0 elsewhere).

    from runners.algorithms import OBJECTIVES
    out = OBJECTIVES.get("troll")(inp, eps=0.05)      # out.loss_mat [B,T], out.metrics

Tests: ``pytest tests/algorithms/test_troll.py``; speed: ``python tests/benchmarks/bench_troll.py``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from runners import metric_names
from runners.algorithms.objectives import check_objective_arguments
from runners.algorithms.troll_solver import categorical_kl, log_normalize, project, project_with_info, solve_dual
from runners.algorithms.troll_sparse import (
    chunked_logsumexp,
    dense_storage_bytes,
    reduce_on_kept_set,
    sparse_storage_bytes,
    sparsify,
    theorem_a2_bound,
)
from runners.algorithms.types import ObjectiveOutput, PolicyInputs

LOG_RATIO_CLAMP = 20.0  # |log r_proj| bound before exp, as verl (and objectives.py) clamp log-ratios

__all__ = [
    "dense_storage_bytes",
    "project",
    "project_with_info",
    "solve_dual",
    "sparse_storage_bytes",
    "sparsify",
    "theorem_a2_bound",
    "troll_objective",
]


def troll_objective(
    inp: PolicyInputs,
    *,
    eps: float = 0.05,
    alpha: float = 1.0,
    sequence: bool = False,
    p_default: float = 1e-12,
    chunk_size: int = 1024,
    log_kept_mass: bool = True,
    num_points: int = 8,
    max_steps: int = 20,
    tol: float = 1e-5,
    eta_min: float = 1e-7,
    eta_max: float = 1e2,
    polish_steps: int = 0,
) -> ObjectiveOutput:
    """Per-token TROLL loss [B,T] (TROLL, arXiv 2510.03817, eq. 5) and the ``troll/*`` metrics.

    Uses ``inp.logits`` [B,T,V] (differentiable; or, sparse only, ``inp.topk_logp`` [B,T,K+1] with
    ``inp.vocab_size``), ``inp.old_topk_index``/``inp.old_topk_logp``
    (sparse [B,T,K+1], or index None and full log-probs [B,T,V]), ``inp.advantages`` and
    ``inp.response_mask`` [B,T], ``inp.responses`` [B,T] if given. Solver options as in
    ``troll_solver.solve_dual``.
    """
    check_objective_arguments(
        "troll",
        eps=eps,
        alpha=alpha,
        p_default=p_default,
        chunk_size=chunk_size,
        num_points=num_points,
        max_steps=max_steps,
        tol=tol,
        eta_min=eta_min,
        eta_max=eta_max,
    )
    logits, index, old, vocab, checks = _check_inputs(inp)
    batch, length = inp.response_mask.shape
    flat = logits.reshape(-1, vocab) if logits is not None else None
    rows = inp.response_mask.reshape(-1).nonzero().squeeze(-1)
    dense = index is None
    old_r = old.reshape(-1, old.shape[-1]).index_select(0, rows)
    pos = _sampled_slot(inp, rows, None if dense else index.reshape(-1, index.shape[-1]), old_r, checks)
    _raise_failed(checks)  # one host synchronisation for every check on the values
    if dense:
        # x - logsumexp(x), not log_softmax: ATen's CPU float32 log_softmax drifts with V (1.4e-4 at 151,936)
        logq = log_normalize(flat.index_select(0, rows).to(torch.promote_types(flat.dtype, torch.float32)))
        logo = log_normalize(old_r.to(torch.promote_types(old_r.dtype, torch.float32))).to(logq.dtype)
        kept = torch.full_like(rows, vocab)
        kept_logits = None
    else:
        if flat is not None:
            kept_logits = flat.gather(-1, index.reshape(-1, index.shape[-1]).long()).index_select(0, rows)
        else:  # log-probs at S: logits shifted by the row's logsumexp, which reduce_on_kept_set cancels
            kept_logits = inp.topk_logp.reshape(-1, index.shape[-1]).index_select(0, rows)
        logq, logo, kept = reduce_on_kept_set(kept_logits, old_r, vocab, p_default=p_default)
        kept_logits = torch.where(old_r > -math.inf, kept_logits.detach(), -math.inf)
    solver = dict(num_points=num_points, max_steps=max_steps, tol=tol, eta_min=eta_min, eta_max=eta_max)
    lp, info = project_with_info(logq, logo, eps, polish_steps=polish_steps, **solver)

    # loss dtype: float32, or float64 for checks
    dtype = torch.promote_types((logits if logits is not None else inp.logp).dtype, torch.float32)
    log_ratio = (lp.gather(-1, pos) - logo.gather(-1, pos)).squeeze(-1).to(dtype)  # [R]
    log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # -inf where q_proj(y) = 0
    # regression term on the projected rows only (0 elsewhere, with no gradient), without a host sync
    reg = torch.where(info.projected, categorical_kl(logq, lp.detach()).to(dtype), torch.zeros_like(log_ratio))
    log_ratio_bt = _scatter_rows(log_ratio, rows, batch * length).view(batch, length)
    if sequence:
        mask = inp.response_mask.to(log_ratio_bt.dtype)
        seq = (log_ratio_bt * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        log_ratio_bt = seq.detach().unsqueeze(-1) + log_ratio_bt - log_ratio_bt.detach()
    reg_bt = _scatter_rows(reg, rows, batch * length).view(batch, length)
    mask = inp.response_mask.bool()
    loss = -torch.exp(log_ratio_bt) * inp.advantages.to(dtype) + alpha * reg_bt
    loss = torch.where(mask, loss, torch.zeros_like(loss))

    metrics = _metrics(info, kept, rows, flat, kept_logits, log_kept_mass, chunk_size)
    return ObjectiveOutput(loss_mat=loss, metrics=metrics)


def _check_inputs(inp: PolicyInputs) -> tuple[Tensor | None, Tensor | None, Tensor, int, list]:
    """Validate TROLL's fields of ``inp``; returns (logits [B,T,V] or None where ``topk_logp`` stands in,
    index or None, old log-probs, V, checks).

    Shapes are checked here; checks on tensor values are returned as ``checks``, a list of (0-dim
    bool tensor, True when the input is wrong; message), for ``_raise_failed``."""
    if inp.old_topk_logp is None:
        raise ValueError(
            "troll objective needs PolicyInputs.old_topk_logp: sparse [B,T,K+1] with old_topk_index, "
            "or full old log-probs [B,T,V] with old_topk_index=None"
        )
    if inp.logits is None:
        return _check_kept_inputs(inp)
    logits, index, old = inp.logits, inp.old_topk_index, inp.old_topk_logp
    if logits.dim() != 3 or logits.shape[:2] != inp.response_mask.shape:
        raise ValueError(
            f"troll: logits {tuple(logits.shape)} must be [B,T,V] with [B,T] = response_mask "
            f"{tuple(inp.response_mask.shape)}"
        )
    if old.shape[:2] != logits.shape[:2]:
        raise ValueError(f"troll: old_topk_logp {tuple(old.shape)} does not match logits {tuple(logits.shape)}")
    if index is None and old.shape != logits.shape:
        raise ValueError(
            f"troll: old_topk_index is None (dense mode) but old_topk_logp {tuple(old.shape)} is not the full "
            f"vocabulary {tuple(logits.shape)}"
        )
    if index is not None:
        if index.shape != old.shape:
            raise ValueError(
                f"troll: old_topk_index {tuple(index.shape)} and old_topk_logp {tuple(old.shape)} differ in shape"
            )
        out_of_range = ((index < 0) | (index >= logits.shape[-1])).any()
        checks = [(out_of_range, f"troll: old_topk_index values must be in [0, V={logits.shape[-1]})")]
        return logits, index, old, logits.shape[-1], checks
    return logits, index, old, logits.shape[-1], []


def _check_kept_inputs(inp: PolicyInputs) -> tuple[None, Tensor, Tensor, int, list]:
    """``_check_inputs`` where the current policy comes as log-probs at the old kept set (``topk_logp``)."""
    index, old, current = inp.old_topk_index, inp.old_topk_logp, inp.topk_logp
    if current is None or index is None or inp.vocab_size is None:
        raise ValueError(
            "troll objective needs PolicyInputs.logits [B,T,V] (the current logits), or, with a sparse "
            "old_topk_index, topk_logp [B,T,K+1] (the current log-probs at old_topk_index) and vocab_size"
        )
    if not index.shape == old.shape == current.shape or index.shape[:2] != inp.response_mask.shape:
        raise ValueError(
            f"troll: old_topk_index {tuple(index.shape)}, old_topk_logp {tuple(old.shape)} and topk_logp "
            f"{tuple(current.shape)} must all be [B,T,K+1] with [B,T] = response_mask {tuple(inp.response_mask.shape)}"
        )
    return None, index, old, int(inp.vocab_size), []


def _sampled_slot(inp: PolicyInputs, rows: Tensor, index: Tensor | None, old_r: Tensor, checks: list) -> Tensor:
    """Slot [R,1] of the sampled token in each response row's (sparse or dense) distribution.

    Checks on the values are appended to ``checks`` (see ``_check_inputs``)."""
    if index is None:
        if inp.responses is None:
            raise ValueError("troll dense mode (old_topk_index=None) needs PolicyInputs.responses [B,T]")
        return inp.responses.reshape(-1).index_select(0, rows).long().unsqueeze(-1)
    kept = old_r > -math.inf
    checks.append((~kept.any(-1).all(), "troll: old_topk_logp has a response position without any kept (finite) entry"))
    if inp.responses is None:  # sparsify's layout: sampled token in the last slot
        checks.append((
            ~kept[:, -1].all(),
            "troll: PolicyInputs.responses is None and the last old_topk slot is empty at a response "
            "position; pass responses or use sparsify's layout (sampled token last)",
        ))  # fmt: skip
        return torch.full((rows.numel(), 1), old_r.shape[-1] - 1, dtype=torch.long, device=rows.device)
    y = inp.responses.reshape(-1).index_select(0, rows).long()
    match = (index.index_select(0, rows).long() == y.unsqueeze(-1)) & kept
    checks.append((
        ~match.any(-1).all(),
        "troll: a sampled token (PolicyInputs.responses) is missing from old_topk_index's kept set",
    ))  # fmt: skip
    return match.int().argmax(-1, keepdim=True)


def _raise_failed(checks: list) -> None:
    """Raise ``ValueError`` with the message of the first failed check (one host read for all)."""
    if checks and any(torch.stack([flag for flag, _ in checks]).tolist()):
        raise ValueError(next(message for flag, message in checks if bool(flag)))


def _scatter_rows(values: Tensor, rows: Tensor, n: int) -> Tensor:
    """[R] values at flat positions ``rows`` of a zero [n] vector (differentiable in values)."""
    return torch.zeros(n, dtype=values.dtype, device=values.device).index_copy(0, rows, values)


def _metrics(info, kept: Tensor, rows: Tensor, flat: Tensor, kept_logits, log_kept_mass: bool, chunk: int):
    """troll/* metrics (runners/metric_names.py) averaged over response tokens (one host read for all)."""
    per_token = {
        metric_names.TROLL_PROJECTED_FRAC: info.projected,
        metric_names.TROLL_KEPT_TOKENS: kept,
        metric_names.TROLL_KL_BEFORE: info.kl_before,
        metric_names.TROLL_KL_AFTER: info.kl_after,
    }
    if log_kept_mass and kept_logits is not None:  # current policy's mass on the old kept set: exp(lse_S - lse_V)
        with torch.no_grad():  # without logits (flat None) the kept entries are log-probs: lse_V = 0
            lse_v = chunked_logsumexp(flat, rows, chunk_size=chunk) if flat is not None else 0.0
            lse_s = torch.logsumexp(kept_logits.float(), -1)
        per_token[metric_names.TROLL_KEPT_MASS] = (lse_s - lse_v).exp()
    if rows.numel():
        values = torch.stack([x.detach().double().mean() for x in per_token.values()]).tolist()
    else:
        values = [0.0] * len(per_token)
    metrics = dict(zip(per_token, values))
    if log_kept_mass and kept_logits is None:  # dense mode keeps the whole vocabulary
        metrics[metric_names.TROLL_KEPT_MASS] = 1.0 if rows.numel() else 0.0
    return {metric_names.TROLL_DUAL_STEPS: float(info.steps), **metrics}
