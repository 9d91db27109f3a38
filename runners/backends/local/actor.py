"""The built-in trainer's actor: the old-log-prob pass and the policy update through ``PolicyLoss``.

``old_pass`` is a no-grad forward over the batch giving log pi_old, the token entropy and, when the
method needs it (TROLL, exact-KL TRM: ``Method.requires("sparse_old")``), the old distribution's
sparse top-K form (``old_entries`` per chunk of rows), as one ``OldPass``. Where that forward would
repeat the update's first one (``OldFromUpdate``: on-policy, one epoch of one mini-batch)
``update_actor`` stores the same entries from each micro-batch's own logits, detached, before its
loss reads them, and the pass is skipped (TRL skips it in the same case); from a ``Head`` the loss's
own ``chunked_head`` pass gives them (TROLL's loss gathers at that pass's own top-K store; the exact-KL
TRM masks' loss sums in float64, so for those a no-grad pass over the detached hidden states comes
first). ``update_actor`` runs the
epochs and mini-batches; every micro-batch goes through ``micro_batch_loss``, which builds
``PolicyInputs`` from the batch (the ``RolloutBatch`` on the trainer's device) and the ``OldPass``
and calls the shared ``runners.algorithms.policy_loss.PolicyLoss`` (the function the verl plugins
call too). Given a ``Head`` (large vocabularies) instead of logits, both passes go through
``chunked_head``: the log-probs, entropies and, for TROLL and the exact-KL TRM masks, the current
log-probs at the old top-K ids (``PolicyInputs.topk_logp``), so no [rows,T,V] tensor exists.
Sample-based masks compare with ``rollout_logp``, the sampler's own log-probs of the drawn tokens.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from runners import metric_names as names
from runners.algorithms.numerics import entropy_from_logits, token_logprobs
from runners.algorithms.policy_loss import PolicyLoss, PolicyLossOutput
from runners.algorithms.types import PolicyInputs
from runners.backends.local.batching import micro_batches, micro_rows, mini_batches
from runners.backends.local.heads import (
    OldPass,
    exact_kl_mask,
    head_entries,
    head_inputs,
    own_entries,
    sampler_entries,
    sparse_store,
    store_params,
)
from runners.backends.local.policy import Head
from runners.backends.local.rollout import RolloutBatch

# (batch, rows) -> temperature-scaled response logits [rows, T, V]
LogitsFn = Callable[..., Tensor]


@dataclass
class UpdateSettings:
    """What ``update_actor`` needs from the trainer config."""

    ppo_epochs: int
    mini_batch_share: float  # mini_batch_prompts / prompts_per_step
    micro_batch_size: int
    grad_clip: float
    logprob_precision: str


def pi_old_entropy(logits: Tensor) -> Tensor:
    """``entropy_from_logits`` without its guards for ``-inf`` logits, for no-grad use: the same arithmetic
    (``-sum exp(logp) logp``, ``logp = x - logsumexp(x)``) in 3 passes over [rows,T,V] instead of ~10;
    rows it cannot handle (a NaN result: ``-inf`` or non-finite logits) fall back to the guarded version."""
    x = logits.float()
    logp = x - torch.logsumexp(x, dim=-1, keepdim=True)
    entropy = -(logp.exp() * logp).sum(-1)
    if bool(torch.isnan(entropy).any()):
        return entropy_from_logits(logits)
    return entropy


def old_entries(
    logits: Tensor | Head,
    responses: Tensor,
    *,
    method,
    precision: str,
    diagnostics: bool = False,
    rollout_logits: Tensor | Head | None = None,
    logp: Tensor | None = None,
) -> OldPass:
    """The old pass's entries for one chunk of rows from pi_old's logits [rows,T,V] (call without grad).

    ``old_logp`` (``logp`` given: already computed from these logits) and ``entropy`` [rows,T]; ``pi_old_topk_index/logp``
    (``diagnostics``) and, when the method needs them, ``old_topk_index/logp``: the sampling policy's
    top-K, from ``rollout_logits`` when it is a separate copy, else from ``logits``. With ``diagnostics``
    and a separate sampling copy, also ``sampler_topk_index/logp`` (the same store, for every method: the
    post-update KL from the sampler). Given ``Head``s instead of logits, the same entries come from
    ``chunked_head`` (within 1e-5 of the dense ones).
    """
    if isinstance(logits, Head):
        return head_entries(
            logits, responses, method=method, precision=precision, diagnostics=diagnostics, rollout=rollout_logits
        )
    out = OldPass(
        old_logp=token_logprobs(logits, responses, precision=precision) if logp is None else logp,
        entropy=pi_old_entropy(logits),
    )
    needs_sparse = method.requires("sparse_old")
    own = sparse_store(logits, responses, method.sparse) if (needs_sparse or diagnostics) else None
    if diagnostics:
        out.pi_old_topk_index, out.pi_old_topk_logp = own
    if needs_sparse or (diagnostics and rollout_logits is not None):
        sampler = own if rollout_logits is None else sparse_store(rollout_logits, responses, method.sparse)
        sampler_entries(out, sampler, needs_sparse=needs_sparse, separate=rollout_logits is not None and diagnostics)
    return out


def old_pass(
    forward: LogitsFn,
    batch: RolloutBatch,
    *,
    method,
    micro_batch_size: int,
    precision: str,
    rollout_forward: LogitsFn | None = None,
    diagnostics: bool = False,
) -> OldPass:
    """log pi_old [B,T], entropy [B,T] and the sparse distributions (``old_entries``); chunked over rows.

    ``old_topk_index/logp`` (when the method needs them) are the sampling policy's: from
    ``rollout_forward`` when the rollout policy is a separate copy (stale or lower precision), else
    from the same forward as log pi_old. ``diagnostics`` also stores pi_old's own top-K
    (``pi_old_topk_*``) for the post-update KL, and with a separate sampling copy its top-K
    (``sampler_topk_*``, one more forward of that copy for methods that do not need it anyway).
    """
    parts = []
    total = batch.input_ids.shape[0]
    chunk = micro_rows(total, micro_batch_size)
    with torch.no_grad():
        for s in range(0, total, chunk):
            rows = slice(s, s + chunk)
            sampler = rollout_forward is not None and (method.requires("sparse_old") or diagnostics)
            entries = old_entries(
                forward(batch, rows),
                batch.responses[rows],
                method=method,
                precision=precision,
                diagnostics=diagnostics,
                rollout_logits=rollout_forward(batch, rows) if sampler else None,
            )
            parts.append(entries)
    return OldPass.cat(parts)


@dataclass
class OldFromUpdate:
    """The update fills the old pass's entries (``old_entries``) from its own forward, detached.

    Only where pi_old is provably the policy of that forward: the trained model sampled the batch
    (no stale or lower-precision copy) and the update is one epoch of one mini-batch, so every row's
    first forward comes before any optimiser step. The trainer decides (``LocalTrainer._old_from_update``).
    """

    method: object  # runners.algorithms.method.Method
    diagnostics: bool  # also pi_old's own top-K (post-update KL)


def _fill_old(
    fill: OldFromUpdate,
    loss_fn: PolicyLoss,
    old: OldPass,
    logits: Tensor | Head,
    batch: RolloutBatch,
    rows: Tensor,
    settings,
) -> dict:
    """Store micro-batch ``rows``' old-pass entries from its own logits; returns what the loss reuses of
    that pass (``micro_batch_loss``'s keyword arguments): its differentiable log-probs (one log-softmax
    serves both). From a ``Head``: the loss's own ``chunked_head`` pass, whose detached results are the
    entries (``current``); a loss that gathers at the old top-K ids (TROLL) gathers at that pass's own
    store (``gather_store``). The exact-KL TRM masks sum in float64 in the loss's pass and not in the old
    pass: for them a no-grad pass over the detached hidden states comes first."""
    responses, total = batch.responses[rows], batch.responses.shape[0]
    precision = settings.logprob_precision
    sparse_old = fill.method.requires("sparse_old")
    if isinstance(logits, Head) and not exact_kl_mask(fill.method):
        store = store_params(fill.method, logits.weight.shape[0]) if fill.diagnostics or sparse_old else None
        current, out = head_inputs(loss_fn, logits, responses, None, precision, store=store, gather_store=sparse_old)
        entries = own_entries(out, precision=precision, diagnostics=fill.diagnostics)
        if sparse_old:  # pi_old sampled the batch: its store is the sampler's
            sampler_entries(entries, (out.topk_index.long(), out.topk_logp), needs_sparse=True, separate=False)
        old.store(rows, entries, total)
        return {"current": current}
    if isinstance(logits, Head):
        detached = Head(logits.hidden.detach(), logits.weight.detach(), logits.bias, logits.temperature)
        with torch.no_grad():
            entries = old_entries(
                detached,
                responses,
                method=fill.method,
                precision=precision,
                diagnostics=fill.diagnostics,
            )
        old.store(rows, entries, total)
        return {}
    logp = token_logprobs(logits, responses, precision=precision)
    with torch.no_grad():
        entries = old_entries(
            logits.detach(),
            responses,
            method=fill.method,
            precision=precision,
            diagnostics=fill.diagnostics,
            logp=logp.detach(),
        )
    old.store(rows, entries, total)
    return {"logp": logp}


def micro_batch_loss(
    loss_fn: PolicyLoss,
    logits: Tensor | Head,
    batch: RolloutBatch,
    old: OldPass,
    advantages: Tensor,
    mask: Tensor,
    rows: Tensor,
    *,
    num_tokens: Tensor,
    num_seqs: Tensor,
    precision: str = "fp32",
    h_ini: float | None = None,
    is_weights: Tensor | None = None,
    logp: Tensor | None = None,
    current: dict | None = None,
) -> PolicyLossOutput:
    """The policy loss of micro-batch ``rows`` from its current ``logits`` [rows,T,V] (differentiable), or
    from a ``Head`` through ``chunked_head``.

    ``batch``/``old``/``advantages``/``mask`` hold the whole batch ([B,...]); ``mask`` is the policy
    mask. ``num_tokens``/``num_seqs`` count the mini-batch. ``logp``: the log-probs already computed
    from ``logits`` (differentiable), else computed here; ``current``: a ``Head``'s ``head_inputs``
    fields already computed (``_fill_old``).
    """
    old_index = old.old_topk_index[rows] if old.old_topk_index is not None else None
    if current is None and isinstance(logits, Head):
        current, _ = head_inputs(loss_fn, logits, batch.responses[rows], old_index, precision)
    if current is None:
        if logp is None:
            logp = token_logprobs(logits, batch.responses[rows], precision=precision)
        entropy = entropy_from_logits(logits) if loss_fn.needs_entropy else None
        current = {"logp": logp, "entropy": entropy, "logits": logits}
    inp = PolicyInputs(
        old_logp=old.old_logp[rows],
        advantages=advantages[rows],
        response_mask=mask[rows],
        rollout_logp=batch.rollout_logp[rows],
        responses=batch.responses[rows],
        group_index=batch.group_index[rows],
        old_topk_index=old_index,
        old_topk_logp=old.old_topk_logp[rows] if old.old_topk_logp is not None else None,
        **current,
    )
    ref = old.ref_logp[rows] if old.ref_logp is not None else None
    weights = is_weights[rows] if is_weights is not None else None
    return loss_fn(inp, num_tokens=num_tokens, num_seqs=num_seqs, ref_logp=ref, h_ini=h_ini, is_weights=weights)


def update_actor(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    forward: LogitsFn,
    loss_fn: PolicyLoss,
    batch: RolloutBatch,
    old: OldPass,
    advantages: Tensor,
    mask: Tensor,
    *,
    settings: UpdateSettings,
    shuffle: torch.Generator,
    h_ini: float | None = None,
    is_weights: Tensor | None = None,
    fill_old: OldFromUpdate | None = None,
) -> tuple[dict[str, float], list[tuple[Tensor, Tensor]]]:
    """Epochs x mini-batches of optimiser steps; returns the metrics and (keep weights, rows) per micro-batch.

    With ``fill_old`` (one epoch of one mini-batch only) ``old`` starts without the old pass's entries
    and each micro-batch stores them from its own logits before its loss reads them.
    """
    if fill_old is not None and (settings.ppo_epochs != 1 or settings.mini_batch_share < 1):
        raise ValueError("fill_old needs one epoch of one mini-batch: later forwards no longer see pi_old")
    model.train()
    sums: dict[str, float] = defaultdict(float)
    weights: dict[str, float] = defaultdict(float)
    seq_masks, grad_norms, losses = [], [], []
    clip = settings.grad_clip if settings.grad_clip > 0 else float("inf")
    for _epoch in range(settings.ppo_epochs):
        for rows in mini_batches(batch.group_index, share=settings.mini_batch_share, generator=shuffle):
            num_tokens = mask[rows].sum().clamp(min=1)
            num_seqs = (mask[rows].sum(-1) > 0).sum().clamp(min=1)
            optimizer.zero_grad(set_to_none=True)
            step_loss = 0.0
            for micro in micro_batches(rows, batch.group_index, settings.micro_batch_size):
                logits = forward(batch, micro)
                shared = {} if fill_old is None else _fill_old(fill_old, loss_fn, old, logits, batch, micro, settings)
                out = micro_batch_loss(
                    loss_fn,
                    logits,
                    batch,
                    old,
                    advantages,
                    mask,
                    micro,
                    num_tokens=num_tokens,
                    num_seqs=num_seqs,
                    precision=settings.logprob_precision,
                    h_ini=h_ini,
                    is_weights=is_weights,
                    **shared,
                )
                out.loss.backward()
                step_loss += float(out.loss.detach())
                tokens = float(mask[micro].sum())
                for key, value in out.metrics.items():
                    sums[key] += value * tokens
                    weights[key] += tokens
                seq_masks.append((out.seq_mask.cpu(), micro.cpu()))
            grad_norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
            losses.append(step_loss)
            optimizer.step()
    metrics = {k: sums[k] / max(weights[k], 1e-12) for k in sums}
    metrics[names.PG_LOSS] = float(np.sum(losses)) / max(len(grad_norms), 1)
    metrics[names.GRAD_NORM] = float(np.mean(grad_norms)) if grad_norms else 0.0
    model.eval()
    return metrics, seq_masks


__all__ = [
    "OldFromUpdate",
    "OldPass",
    "UpdateSettings",
    "micro_batch_loss",
    "old_entries",
    "old_pass",
    "update_actor",
]
