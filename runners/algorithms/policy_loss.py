"""The policy loss of one (micro-)batch: the only place the per-token loss is assembled.

Both backends call ``PolicyLoss``: the built-in trainer once per micro-batch
(``runners.backends.local.actor``), verl through the ``trustbench_*`` policy losses
(``runners.backends.verl.plugins.losses``). For a ``Method`` and its entropy controller::

    A'     = controller.transform_advantages(A, logp.detach(), mask)     # REPO-R / REPO-D
    keep   = MASKS[mask](inp', **mask_kw).seq_mask                       # [B], no gradient
    L[b,t] = OBJECTIVES[objective](inp', **objective_kw, **controller.objective_overrides()).loss_mat
             + controller.loss_term(entropy)                             # adaptive entropy bonus
             + kl_coef * k3(logp, ref_logp)                              # KL to a reference policy
    loss   = LOSS_AGGS[loss_agg](L * keep[:, None] * is_weights, mask, num_tokens, num_seqs, norm_len)

Semantics every backend shares:

- A sequence mask rejects whole sequences by multiplying their loss by 0; the response mask stays
  the aggregation mask, so the denominator is the whole (mini-)batch (TRM, arXiv 2512.23075,
  eq. 50) and a rejected sequence contributes exactly zero gradient, its KL term included.
- Reference log-probs of the sample-based masks (k2 / k3 TRM, LN-TRM, SER) are the rollout policy's:
  ``PolicyInputs.rollout_logp``, the log-probs the sampler returned with the tokens (the TRM paper's
  pi_roll). The exact-KL masks and TROLL read the sampling policy's sparse distribution
  (``old_topk_index`` / ``old_topk_logp``), which both backends compute in their old-log-prob pass
  with the training engine; ``rollout_logp`` None falls back to ``old_logp`` (the two are the same
  policy on-policy, and differ under a stale or lower-precision rollout).
- The KL-to-reference term is k3 = exp(ref - logp) - (ref - logp) - 1 with the log-ratio clamped to
  [-20, 20] and k3 to [-10, 10], verl's ``low_var_kl``.
- ``num_tokens`` / ``num_seqs`` are the counts of the whole mini-batch (over all data-parallel ranks
  divided by their number, as verl's ``agg_loss``), so micro-batches add up to the mini-batch loss;
  None uses the micro-batch's own counts.

Metrics: the objective's and the mask's (``troll/*``, ``trm/*``, ``gtpo/*``, ``actor/pg_clipfrac``),
as floats. Tests: ``pytest tests/verl/test_cross_backend.py`` (both backends, every preset) and
``tests/algorithms/test_sparse_divergences.py`` (the TROLL/TRM loss through ``PolicyLoss``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from runners.algorithms import ENTROPY_CONTROLLERS, LOSS_AGGS, MASKS, OBJECTIVES
from runners.algorithms.method import Method
from runners.algorithms.types import PolicyInputs

# verl's low_var_kl bounds: |log ratio| <= 20, |k3| <= 10
KL_LOG_RATIO_CLAMP = 20.0
KL_VALUE_CLAMP = 10.0


def reference_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(pi_theta || pi_ref) [B,T] (verl's ``low_var_kl``), differentiable in logp."""
    diff = (ref_logp.detach().float() - logp.float()).clamp(-KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
    return (diff.exp() - diff - 1.0).clamp(-KL_VALUE_CLAMP, KL_VALUE_CLAMP)


@dataclass
class PolicyLossOutput:
    """A (micro-)batch's loss (scalar, to minimise), its metrics and the sequence keep weights [B]."""

    loss: Tensor
    metrics: dict[str, float]
    seq_mask: Tensor


def build_controller(method: Method, state: dict | None = None):
    """The method's entropy controller, with ``state`` (a ``state_dict``) loaded when given."""
    controller = ENTROPY_CONTROLLERS.get(method.entropy_control)(**dict(method.entropy_control_kw))
    if state:
        controller.load_state_dict(dict(state))
    return controller


class PolicyLoss:
    """``PolicyLoss(method, controller)(inp, ...)`` -> ``PolicyLossOutput`` (module docstring)."""

    def __init__(self, method: Method, controller: Any = None) -> None:
        self.method = method
        self.controller = controller if controller is not None else build_controller(method)
        self.objective = OBJECTIVES.get(method.objective)
        self.mask = MASKS.get(method.mask)
        self.agg = LOSS_AGGS.get(method.loss_agg)
        self.needs_entropy = method.requires("grad_entropy")
        self.needs_h_ini = method.requires("h_ini")

    def __call__(
        self,
        inp: PolicyInputs,
        *,
        num_tokens: float | Tensor | None = None,
        num_seqs: float | Tensor | None = None,
        ref_logp: Tensor | None = None,
        is_weights: Tensor | None = None,
        h_ini: float | None = None,
        norm_len: float | None = None,
    ) -> PolicyLossOutput:
        """``num_tokens`` / ``num_seqs``: the mini-batch's counts; ``ref_logp`` [B,T]: a reference
        policy's log-probs (with ``method.kl_coef``); ``is_weights`` [B,T]: rollout importance
        weights; ``h_ini``: GTPO's initial entropy; ``norm_len`` overrides ``method.norm_len``."""
        method = self.method
        if self.needs_entropy and inp.entropy is None:
            raise ValueError(f"{', '.join(method.needing('grad_entropy'))} need the current entropy with gradient")
        mask = inp.response_mask
        inp = replace(inp, advantages=self.controller.transform_advantages(inp.advantages, inp.logp.detach(), mask))
        with torch.no_grad():
            masked = self.mask(inp, **method.mask_kw)
        objective_kw = {**method.objective_kw, **self.controller.objective_overrides()}
        if self.needs_h_ini:
            objective_kw["h_ini"] = h_ini
        out = self.objective(inp, **objective_kw)
        loss_mat = out.loss_mat
        if inp.entropy is not None:
            term = self.controller.loss_term(inp.entropy)
            if term is not None:
                loss_mat = loss_mat + term
        if ref_logp is not None and method.kl_coef:
            loss_mat = loss_mat + method.kl_coef * reference_kl(inp.logp, ref_logp)
        loss_mat = loss_mat * masked.seq_mask.detach().to(loss_mat.dtype)[:, None]
        if is_weights is not None:
            loss_mat = loss_mat * is_weights
        loss = self.agg(loss_mat, mask, num_tokens=num_tokens, num_seqs=num_seqs, norm_len=norm_len or method.norm_len)
        metrics = {key: float(value) for key, value in {**out.metrics, **masked.metrics}.items()}
        return PolicyLossOutput(loss=loss, metrics=metrics, seq_mask=masked.seq_mask.detach())


__all__ = ["PolicyLoss", "PolicyLossOutput", "build_controller", "reference_kl"]
