"""The built-in trainer's passes for large vocabularies: from a ``Head`` (hidden states and the output
layer) through ``runners.algorithms.chunked_head``, so no [rows,T,V] tensor exists, and the old pass's
results (``OldPass``) with their sparse top-K stores.

- ``OldPass``: what the old-log-prob pass (``actor.old_pass``) gives, and the reference log-probs;
- ``head_entries``: the old pass's entries (``actor.old_entries``) chunk by chunk;
- ``head_inputs``: the update's ``PolicyInputs`` fields: log-probs, entropies and the current log-probs
  at the old top-K ids (``topk_logp``: TROLL's kept set, the exact-KL TRM masks' support), with float64
  sums where a mask reads the sparse KL's rest bin;
- ``response_logprobs``: the reference model's log-probs, chunked over rows.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

from runners.algorithms import MASKS
from runners.algorithms.numerics import round_logprobs, token_logprobs
from runners.algorithms.policy_loss import PolicyLoss
from runners.backends.local.batching import micro_rows
from runners.backends.local.policy import Head
from runners.backends.local.rollout import RolloutBatch


@dataclass
class OldPass:
    """The old-log-prob pass over a batch ([B,T], top-K stores [B,T,K+1]); None where not computed.

    ``old_logp`` and ``entropy``: pi_old's log-probs of the sampled tokens and token entropy. The sampling
    policy's top-K (``old_topk_*``) where the method needs it (``Method.requires("sparse_old")``); with
    diagnostics pi_old's own (``pi_old_topk_*``) and, from a separate sampling copy, its store again
    (``sampler_topk_*``) for the post-update KLs. ``ref_logp``: the reference model's log-probs (KL term),
    which the trainer's reference pass assigns.
    """

    old_logp: Tensor | None = None
    entropy: Tensor | None = None
    old_topk_index: Tensor | None = None
    old_topk_logp: Tensor | None = None
    pi_old_topk_index: Tensor | None = None
    pi_old_topk_logp: Tensor | None = None
    sampler_topk_index: Tensor | None = None
    sampler_topk_logp: Tensor | None = None
    ref_logp: Tensor | None = None

    def computed(self) -> dict[str, Tensor]:
        """The fields that hold a tensor, by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def cat(cls, parts: list[OldPass]) -> OldPass:
        """One pass over the batch from the passes of its consecutive chunks of rows."""
        names = parts[0].computed() if parts else {}
        return cls(**{name: torch.cat([getattr(p, name) for p in parts]) for name in names})

    def store(self, rows: Tensor, part: OldPass, batch_rows: int) -> None:
        """Write the entries of ``part`` (the pass of ``rows``) into this pass's [B,...] tensors, allocating
        each on first use."""
        for name, value in part.computed().items():
            if getattr(self, name) is None:
                setattr(self, name, value.new_empty((batch_rows, *value.shape[1:])))
            getattr(self, name)[rows] = value


def sparse_store(logits: Tensor, responses: Tensor, sparse: dict) -> tuple[Tensor, Tensor]:
    """Top-K form [rows,T,K+1] of ``logits`` [rows,T,V]: the kept tokens' true log-probs (TRM adds a rest bin)."""
    from runners.algorithms.troll import sparsify

    flat = logits.reshape(-1, logits.shape[-1])
    idx, lp = sparsify(
        flat, responses.reshape(-1), **{**sparse, "k": min(sparse["k"], logits.shape[-1])}, renormalize=False
    )
    shape = (*logits.shape[:2], idx.shape[-1])
    return idx.reshape(shape).long(), lp.reshape(shape)


def head_entries(
    head: Head, responses: Tensor, *, method, precision: str, diagnostics: bool, rollout: Head | Tensor | None
) -> OldPass:
    """``old_entries`` from ``Head``s: the same entries, computed chunk by chunk from the hidden states."""
    from runners.algorithms.chunked_head import chunked_head

    needs_sparse = method.requires("sparse_old")
    sparse = store_params(method, head.weight.shape[0])

    def run(h: Head, store: bool):
        return chunked_head(
            h.hidden, h.weight, responses, bias=h.bias, temperature=h.temperature, sparse=sparse if store else None
        )

    own = run(head, needs_sparse or diagnostics)
    out = own_entries(own, precision=precision, diagnostics=diagnostics)
    if needs_sparse or (diagnostics and rollout is not None):
        if rollout is None or isinstance(rollout, Head):
            store = own if rollout is None else run(rollout, True)
            sampler = store.topk_index.long(), store.topk_logp
        else:  # a lower-precision sampling copy: its store from its own (rounded) logits
            sampler = sparse_store(rollout, responses, method.sparse)
        sampler_entries(out, sampler, needs_sparse=needs_sparse, separate=rollout is not None and diagnostics)
    return out


def store_params(method, vocab: int) -> dict:
    """``chunked_head``'s ``sparse`` argument for ``method``'s top-K store (K capped at the vocabulary)."""
    return {
        "k": min(method.sparse["k"], vocab),
        "delta": method.sparse["delta"],
        "p_default": method.sparse["p_default"],
    }


def own_entries(own, *, precision: str, diagnostics: bool) -> OldPass:
    """The old pass's entries of pi_old itself from a ``chunked_head`` result over its hidden states (no
    grad, or detached here): log-probs rounded to ``precision``, entropy and (``diagnostics``) the top-K store."""
    out = OldPass(old_logp=round_logprobs(own.logp.detach().float(), precision), entropy=own.entropy.detach().float())
    if diagnostics:
        out.pi_old_topk_index, out.pi_old_topk_logp = own.topk_index.long(), own.topk_logp
    return out


def sampler_entries(out: OldPass, sampler: tuple[Tensor, Tensor], *, needs_sparse: bool, separate: bool) -> None:
    """The sampling policy's top-K: ``old_topk_*`` for the method's loss; ``sampler_topk_*`` for the
    post-update KL from the sampler when it is a separate copy (``separate``, diagnostics on)."""
    if needs_sparse:
        out.old_topk_index, out.old_topk_logp = sampler
    if separate:
        out.sampler_topk_index, out.sampler_topk_logp = sampler


def head_inputs(
    loss_fn: PolicyLoss,
    head: Head,
    responses: Tensor,
    old_index: Tensor | None,
    precision: str,
    *,
    store: dict | None = None,
    gather_store: bool = False,
):
    """``PolicyInputs`` fields from ``chunked_head``: log-probs, entropies and the log-probs at the old top-K
    ids (float64 sums where an exact-KL mask reads them: its rest bin can hold ~1e-7); and the
    ``chunked_head`` result itself, with the top-K store where ``store`` (its ``sparse`` argument) is given:
    where pi_old is this forward's policy, the same pass gives the old pass's entries (``own_entries``),
    and with ``gather_store`` the log-probs at that store's ids stand for those at the old top-K ids."""
    from runners.algorithms.chunked_head import chunked_head

    exact = exact_kl_mask(loss_fn.method)
    out = chunked_head(
        head.hidden,
        head.weight,
        responses,
        bias=head.bias,
        temperature=head.temperature,
        sparse=store,
        gather=old_index,
        gather_store=gather_store,
        exact_sum=exact and (old_index is not None or gather_store),
    )
    fields = {
        "logp": round_logprobs(out.logp, precision),
        "entropy": out.entropy if loss_fn.needs_entropy else None,
        "topk_logp": out.gather_logp,
        "vocab_size": head.weight.shape[0],
        "logits": None,
    }
    return fields, out


def exact_kl_mask(method) -> bool:
    """Whether ``method``'s mask reads the sparse KL's rest bin (the exact-KL TRM masks): its log-probs at
    the old top-K ids need float64 sums (``chunked_head``'s ``exact_sum``)."""
    return "sparse_old" in MASKS.entry(method.mask).needs


def response_logprobs(forward, batch: RolloutBatch, *, chunked: bool, settings) -> Tensor:
    """log-probs [B,T] of the sampled tokens under ``forward(batch, rows)`` without grad (the reference
    model's pass): where ``chunked``, ``Head``s through ``chunked_head`` ``settings.micro_batch_size`` rows
    at a time; else one forward of all rows (logits [B,T,V]), as small vocabularies always did; rounded to
    ``settings.logprob_precision``."""
    precision = settings.logprob_precision
    if not chunked:
        with torch.no_grad():
            return token_logprobs(forward(batch, None), batch.responses, precision=precision)
    from runners.algorithms.chunked_head import chunked_head

    rows = batch.input_ids.shape[0]
    chunk = micro_rows(rows, settings.micro_batch_size)
    parts = []
    with torch.no_grad():
        for s in range(0, rows, chunk):
            head, responses = forward(batch, slice(s, s + chunk)), batch.responses[s : s + chunk]
            logp = chunked_head(head.hidden, head.weight, responses, bias=head.bias, temperature=head.temperature).logp
            parts.append(round_logprobs(logp.float(), precision))
    return torch.cat(parts)


__all__ = [
    "OldPass",
    "exact_kl_mask",
    "head_entries",
    "head_inputs",
    "own_entries",
    "response_logprobs",
    "sampler_entries",
    "sparse_store",
    "store_params",
]
