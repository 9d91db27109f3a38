"""After the update: how far the policy moved on the step's batch, per token and on GTPO's conflict tokens.

One no-grad forward of the updated model over the batch gives, against pi_old (the old-log-prob pass):

- ``actor/post_update_kl`` (mean) and ``actor/post_update_kl_max`` (max over response tokens):
  KL(pi_new || pi_old) per token, the divergence TROLL's trust region bounds (TROLL, arXiv 2510.03817,
  eq. 4), on pi_old's top-K plus one rest bin: exact when the kept tokens cover the vocabulary, a lower
  bound otherwise (coarse-graining never increases a KL). Every method logs it, so TROLL's region can be
  compared with what clipping does; ``actor/post_update_kl_frac_above_<eps>``: the share of tokens above eps;
- ``actor/post_update_kl_sampler(_max)`` and ``actor/post_update_kl_sampler_frac_above_<eps>``: the same
  against the sampling policy, where it is a separate copy (stale rollouts, a lower-precision sampler): the
  distribution TROLL's projection is centred on (the old pass's ``sampler_topk_*``);
- ``gtpo/conflict_prob_delta``: the mean change of log pi of the sampled tokens on conflict spans
  (GTPO, arXiv 2508.03772, section 5.1: the same token at the same forward or backward position of a
  positive and a negative response of a group), for every method with prompt groups, so GTPO's
  protection of those tokens can be compared with GRPO's update of them.

Switch off with ``trainer.post_update_diagnostics=false`` (one forward pass per iteration).
"""

from __future__ import annotations

import torch
from torch import Tensor

from runners import metric_names as names
from runners.algorithms.diagnostics import coarse_reverse_kl, conflict_tokens, kept_reverse_kl, kl_exceedance
from runners.algorithms.numerics import round_logprobs, token_logprobs
from runners.backends.local.heads import OldPass
from runners.backends.local.policy import Head
from runners.backends.local.rollout import RolloutBatch

_KL_NAMES = {
    "pi_old": (names.POST_UPDATE_KL, names.POST_UPDATE_KL_MAX),
    "sampler": (names.POST_UPDATE_KL_SAMPLER, names.POST_UPDATE_KL_SAMPLER_MAX),
}


def _stores(old: OldPass) -> dict[str, tuple[Tensor, Tensor]]:
    """The top-K stores the post-update KLs are measured against: (index, logp) of pi_old's own and, from a
    separate sampling copy, the sampler's, where the old pass kept them."""
    stores = {
        "pi_old": (old.pi_old_topk_index, old.pi_old_topk_logp),
        "sampler": (old.sampler_topk_index, old.sampler_topk_logp),
    }
    return {name: store for name, store in stores.items() if store[0] is not None}


def _head_kls(head: Head, responses: Tensor, rows: slice, stores: dict, kls: dict, precision: str) -> Tensor:
    """One chunk's log-probs [rows,T] from a ``Head`` through ``chunked_head``; appends its KLs to ``kls``
    from the log-probs at every store's ids (one pass, float64 sums for the rest bin)."""
    from runners.algorithms.chunked_head import chunked_head

    index = [topk_index[rows].long() for topk_index, _ in stores.values()]
    gather = torch.cat(index, -1) if index else None
    out = chunked_head(
        head.hidden, head.weight, responses, bias=head.bias, temperature=head.temperature, gather=gather, exact_sum=True
    )
    start = 0
    for (store, (_, topk_logp)), ids in zip(stores.items(), index):
        logq = out.gather_logp[..., start : start + ids.shape[-1]]
        start += ids.shape[-1]
        kls[store].append(kept_reverse_kl(logq.reshape(-1, ids.shape[-1]), topk_logp[rows].reshape(-1, ids.shape[-1])))
    return round_logprobs(out.logp, precision)


def post_update_metrics(
    forward, batch: RolloutBatch, old: OldPass, advantages: Tensor, *, chunk: int, precision: str
) -> dict:
    """The module's metrics from one no-grad forward of the updated model (``forward(batch, rows)``: logits,
    or a ``Head`` for ``chunked_head``)."""
    mask = batch.response_mask
    stores = _stores(old)
    kls: dict[str, list[Tensor]] = {s: [] for s in stores}
    logps = []
    with torch.no_grad():
        for s in range(0, mask.shape[0], chunk):
            rows = slice(s, s + chunk)
            logits = forward(batch, rows)
            if isinstance(logits, Head):
                logps.append(_head_kls(logits, batch.responses[rows], rows, stores, kls, precision))
                continue
            logps.append(token_logprobs(logits, batch.responses[rows], precision=precision))
            flat = logits.reshape(-1, logits.shape[-1])
            for store, (topk_index, topk_logp) in stores.items():
                index = topk_index[rows].reshape(flat.shape[0], -1)
                kls[store].append(coarse_reverse_kl(flat, index, topk_logp[rows].reshape(index.shape)))
    real = mask.reshape(-1) > 0
    out: dict[str, float] = {}
    for store, (mean_name, max_name) in _KL_NAMES.items():
        if kls.get(store) and bool(real.any()):
            kl = torch.cat(kls[store])[real]
            out[mean_name] = float(kl.mean())
            out[max_name] = float(kl.max())
            out.update(kl_exceedance(kl, sampler=store == "sampler"))
    groups = batch.group_index
    if groups is not None and groups.unique().numel() < mask.shape[0]:
        conflicts = conflict_tokens(batch.responses, mask, groups, advantages, mask=mask)
        if bool(conflicts.any()):
            delta = torch.cat(logps) - old.old_logp
            out[names.GTPO_CONFLICT_PROB_DELTA] = float(delta[conflicts].double().mean())
    return out


__all__ = ["coarse_reverse_kl", "conflict_tokens", "post_update_metrics"]
