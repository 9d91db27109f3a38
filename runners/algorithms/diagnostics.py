"""Post-update diagnostics shared by both backends: how far the policy moved on an iteration's batch.

- ``coarse_reverse_kl``: KL(pi_new || pi_old) per token on pi_old's stored top-K plus one rest bin, the
  divergence TROLL's trust region bounds (TROLL, arXiv 2510.03817, eq. 4): exact when the kept tokens
  cover the vocabulary, a lower bound otherwise (coarse-graining never increases a KL);
- ``kl_exceedance``: the share of tokens whose KL exceeds each of ``POST_UPDATE_KL_THRESHOLDS`` (a
  per-token trust region of that size left: TROLL bounds each token, not the mean);
- ``conflict_tokens``: the tokens on GTPO's conflict spans (GTPO, arXiv 2508.03772, section 5.1: the same
  token at the same forward or backward position of a positive and a negative response of a group).

The built-in trainer (``runners.backends.local.diagnostics``) and the verl trainer
(``runners.backends.verl.plugins.trainer_diagnostics``) log ``actor/post_update_kl(_max)``,
``actor/post_update_kl_frac_above_<eps>`` and ``gtpo/conflict_prob_delta`` with them.
Tests: ``pytest tests/algorithms/test_diagnostics.py tests/backends tests/verl``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def coarse_reverse_kl(new_logits: Tensor, index: Tensor, old_topk_logp: Tensor) -> Tensor:
    """KL(q || p) per row [n] of q = softmax(new_logits) [n,V] and p given on ``index`` [n,K] (-inf: unused slot),
    over the kept ids plus one rest bin; float64."""
    logq_all = torch.log_softmax(new_logits.double(), -1)
    return kept_reverse_kl(logq_all.gather(-1, index), old_topk_logp)


def kept_reverse_kl(logq_at_index: Tensor, old_topk_logp: Tensor) -> Tensor:
    """``coarse_reverse_kl`` from q's log-probs at the kept ids [n,K] (float64: ``chunked_head(...,
    gather=index, exact_sum=True)``, which never holds the [n,V] logits)."""
    valid = old_topk_logp > float("-inf")
    logq = torch.where(valid, logq_at_index.double(), float("-inf"))
    logp = old_topk_logp.double()
    q, p = torch.where(valid, logq.exp(), 0.0), torch.where(valid, logp.exp(), 0.0)
    on_kept = torch.where(q > 0, q * (logq - logp), 0.0).sum(-1)
    q_rest, p_rest = (1.0 - q.sum(-1)).clamp(min=0.0), (1.0 - p.sum(-1)).clamp(min=0.0)
    rest = torch.where(q_rest > 0, q_rest * (q_rest.clamp(min=1e-300).log() - p_rest.clamp(min=1e-300).log()), 0.0)
    return (on_kept + rest).clamp(min=0.0)


def kl_exceedance(kl: Tensor, *, sampler: bool = False) -> dict[str, float]:
    """{``actor/post_update_kl_frac_above_<eps>``: share of the tokens ``kl`` [n] (n > 0) above eps} for each
    eps of ``metric_names.POST_UPDATE_KL_THRESHOLDS`` (``sampler``: the ``..._sampler_frac_above_`` names)."""
    from runners import metric_names

    return {
        metric_names.post_update_kl_frac_above(eps, sampler=sampler): float((kl > eps).double().mean())
        for eps in metric_names.POST_UPDATE_KL_THRESHOLDS
    }


def conflict_tokens(
    responses: Tensor, response_mask: Tensor, group_index: Tensor, advantages: Tensor, *, mask: Tensor
) -> Tensor:
    """[B,T] bool: tokens of ``mask`` on a forward or backward conflict span of their group (GTPO's rule).

    The spans are found on ``responses`` [B,T] within ``response_mask`` [B,T], the groups by
    ``group_index`` [B], the sign of a response by its mean token advantage (``advantages`` [B,T] over
    ``mask``); ``mask`` [B,T] (the trained tokens) may be narrower than ``response_mask``."""
    from runners.algorithms.gtpo import conflict_spans
    from runners.algorithms.loss_agg import masked_mean

    seq_adv = masked_mean(advantages.detach(), mask.to(advantages.dtype), dim=-1)
    forward, backward = conflict_spans(responses, response_mask, group_index, seq_adv)
    return (forward | backward) & (mask > 0)


__all__ = ["coarse_reverse_kl", "conflict_tokens", "kept_reverse_kl", "kl_exceedance"]
