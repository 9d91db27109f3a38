"""trustbench policy losses in verl's registry (``register_policy_loss``): one per library objective.

Design: every ``trustbench_<objective>`` loss (``LOSS_MODES``: clip, token_is, gspo, gpg, bapo,
gtpo, troll, troll_seq) performs the built-in trainer's micro-batch step
(``LocalTrainer._update_actor``) on verl's tensors, with the same ``runners.algorithms`` calls:

    A'     = controller.transform_advantages(A, logp.detach(), mask)        # REPO-R / REPO-D
    keep   = MASKS[mask](inp, **mask_params).seq_mask                       # TRM, LN-TRM, SER (no grad)
    out    = OBJECTIVES[objective](inp, **objective_params, **controller.objective_overrides())  # ADAPO
    L[b,t] = out.loss_mat + controller.loss_term(entropy)                   # adaptive entropy bonus
    loss   = LOSS_AGGS[loss_agg_mode](L * keep[:, None] * is_weights, mask, num_tokens, num_seqs, norm_len)

so masks and entropy controllers combine with any objective ("GSPO with TROLL", "GRPO with TRM-Max
and REPO-R" are one config each). The aggregation uses verl's global-batch counts
(``config.global_batch_info``: tokens and sequences of the mini-batch over all data-parallel ranks,
divided by the data-parallel size, as verl's ``agg_loss``), and the response mask stays the
denominator under a sequence mask (trm.txt eq. 50). verl's rollout importance weights, when given,
multiply the per-token loss as in verl's own losses.

Inputs beyond verl's signature (sampled ids, prompt groups, current entropy and logits, the sparse
old distribution, the controller state) come as ``inputs=TrustbenchInputs(...)``; inside verl's
``ppo_loss`` they are supplied by ``plugins_ppo_loss.trustbench_ppo_loss`` through
``using_inputs`` (a context variable: verl's ``ppo_loss`` calls the loss with a fixed signature).

Where verl's loop differs from the built-in trainer's (not the loss function's doing):
- verl's KL-to-reference loss (``use_kl_loss``) is added by verl's ``ppo_loss`` after this loss,
  so a TRM mask does not mask it (the built-in trainer adds k3 before masking);
- verl forms mini/micro-batches by sample (and balances sequences across data-parallel ranks), not
  by whole prompt groups, so GTPO sees the members of a group that share its micro-batch.

    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    loss, metrics = get_policy_loss_fn("trustbench_troll")(old_logp, logp, adv, mask, "token-mean",
                                                         actor_config, None, inputs=TrustbenchInputs(...))

Tests: ``pytest tests/verl/test_plugins_losses.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from verl.trainer.ppo.core_algos import register_policy_loss

from runners.algorithms import ENTROPY_CONTROLLERS, LOSS_AGGS, MASKS, OBJECTIVES
from runners.algorithms.estimators import group_inverse
from runners.algorithms.types import PolicyInputs
from runners.backends.verl import LOSS_MODES
from runners.backends.verl.plugins_config import LossSettings, loss_settings

# non-tensor batch entry: {"entropy_control_state": {...}, "h_ini": float | None} from the trainer
RUNTIME_KEY = "trustbench_runtime"


@dataclass
class TrustbenchInputs:
    """Per-micro-batch inputs of a trustbench loss beyond verl's policy-loss signature ([B,T] = verl's)."""

    # [B,T] sampled token ids (GTPO conflicts, TROLL's dense mode)
    responses: Tensor | None = None
    # [B] prompt group of each response: verl's uid strings, or ids (GTPO)
    group_index: Any = None
    # [B,T] current token entropy, differentiable (GTPO, adaptive entropy bonus)
    entropy: Tensor | None = None
    # [B,T,V] current temperature-scaled logits, differentiable (TROLL, exact-KL TRM)
    logits: Tensor | None = None
    # [B,T,K+1] sparse old distribution: vocabulary ids and log-probs (-inf marks unused slots)
    old_topk_index: Tensor | None = None
    old_topk_logp: Tensor | None = None
    # [B,T] the rollout engine's log-probs (sample-based masks with mask_use_rollout_log_probs)
    rollout_log_probs: Tensor | None = None
    # per-iteration values pushed by the trainer: entropy_control_state, h_ini
    runtime: dict = field(default_factory=dict)


_CURRENT: ContextVar[TrustbenchInputs | None] = ContextVar("trustbench_inputs", default=None)


@contextlib.contextmanager
def using_inputs(inputs: TrustbenchInputs) -> Iterator[None]:
    """Make ``inputs`` the extra inputs of trustbench losses called (by verl) inside the block."""
    token = _CURRENT.set(inputs)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def build_controller(settings: LossSettings, runtime: dict):
    """The library's entropy controller with the state the trainer pushed for this iteration."""
    controller = ENTROPY_CONTROLLERS.get(settings.entropy_control)(**settings.entropy_control_kw)
    state = runtime.get("entropy_control_state")
    if state:
        controller.load_state_dict(dict(state))
    return controller


def _global_counts(config: Any) -> tuple[float | None, float | None, float | None]:
    """(num_tokens, num_seqs, norm_len) of this rank from verl's ``global_batch_info`` (None: local
    counts / the padded width, as verl's ``agg_loss`` without global info)."""
    info = dict(getattr(config, "global_batch_info", None) or {})
    dp = info.get("dp_size") or 1
    tokens = info.get("batch_num_tokens")
    seqs = info.get("global_batch_size")
    norm = info.get("loss_scale_factor")  # verl's ppo_loss copies actor.loss_scale_factor here
    return (
        None if tokens is None else float(tokens) / dp,
        None if seqs is None else float(seqs) / dp,
        None if norm is None else float(norm),
    )


def _group_ids(group_index: Any, batch: int, device) -> Tensor | None:
    if group_index is None:
        return None
    return group_inverse(group_index, batch, device)


def compute_trustbench_policy_loss(
    loss_mode: str,
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Tensor | None = None,
    *,
    inputs: TrustbenchInputs | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The loss of ``loss_mode`` (a key of ``LOSS_MODES``) and its metrics; tensors [B,T] as verl's."""
    if loss_agg_mode not in LOSS_AGGS:
        raise ValueError(
            f"actor.loss_agg_mode={loss_agg_mode!r} is not supported by trustbench losses; "
            f"valid: {', '.join(LOSS_AGGS.names())}"
        )
    inputs = inputs or _CURRENT.get() or TrustbenchInputs()
    settings = loss_settings(getattr(config, "policy_loss", None), loss_mode)
    runtime = dict(inputs.runtime or {})
    controller = build_controller(settings, runtime)
    mask = response_mask.to(log_prob.dtype)
    adv = controller.transform_advantages(advantages, log_prob.detach(), mask)
    inp = PolicyInputs(
        logp=log_prob,
        logp_old=old_log_prob,
        advantages=adv,
        response_mask=mask,
        logp_rollout=inputs.rollout_log_probs if settings.mask_use_rollout_log_probs else None,
        responses=inputs.responses,
        group_index=_group_ids(inputs.group_index, log_prob.shape[0], log_prob.device),
        entropy=inputs.entropy,
        logits=inputs.logits,
        old_topk_index=inputs.old_topk_index,
        old_topk_logp=inputs.old_topk_logp,
    )
    objective_kw = {**settings.objective_kw, **controller.objective_overrides()}
    if settings.objective == "gtpo":
        objective_kw["h_ini"] = runtime.get("h_ini")
    with torch.no_grad():
        masked = MASKS.get(settings.mask)(inp, **settings.mask_kw)
    out = OBJECTIVES.get(settings.objective)(inp, **objective_kw)
    loss_mat = out.loss_mat
    if settings.entropy_control == "bonus":
        if inputs.entropy is None:
            raise ValueError(
                "entropy_control=bonus needs the current entropy: set actor_rollout_ref.actor.calculate_entropy=true"
            )
        loss_mat = loss_mat + controller.loss_term(inputs.entropy)
    loss_mat = loss_mat * masked.seq_mask.to(loss_mat.dtype)[:, None]
    if rollout_is_weights is not None:
        loss_mat = loss_mat * rollout_is_weights
    num_tokens, num_seqs, norm_len = _global_counts(config)
    loss = LOSS_AGGS.get(loss_agg_mode)(loss_mat, mask, num_tokens=num_tokens, num_seqs=num_seqs, norm_len=norm_len)
    metrics = {key: float(value) for key, value in {**out.metrics, **masked.metrics}.items()}
    return loss, metrics


def _make_loss(loss_mode: str):
    def policy_loss(
        old_log_prob: Tensor,
        log_prob: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: Tensor | None = None,
        *,
        inputs: TrustbenchInputs | None = None,
    ) -> tuple[Tensor, dict[str, float]]:
        return compute_trustbench_policy_loss(
            loss_mode,
            old_log_prob,
            log_prob,
            advantages,
            response_mask,
            loss_agg_mode,
            config,
            rollout_is_weights,
            inputs=inputs,
        )

    objective, fixed = LOSS_MODES[loss_mode]
    policy_loss.__name__ = policy_loss.__qualname__ = f"compute_policy_loss_{loss_mode}"
    policy_loss.__doc__ = (
        f"verl policy loss {loss_mode!r}: runners.algorithms objective {objective!r}"
        + (f" with {fixed}" if fixed else "")
        + ", plus the configured mask and entropy control (see runners.backends.verl.plugins_losses)."
    )
    return policy_loss


POLICY_LOSSES = {mode: register_policy_loss(mode)(_make_loss(mode)) for mode in LOSS_MODES}

__all__ = [
    "POLICY_LOSSES",
    "RUNTIME_KEY",
    "TrustbenchInputs",
    "build_controller",
    "compute_trustbench_policy_loss",
    "using_inputs",
]
