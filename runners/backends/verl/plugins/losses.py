"""trustbench policy losses in verl's registry (``register_policy_loss``): one per library objective.

Design: every ``trustbench_<objective>`` loss (``LOSS_MODES``: clip, token_is, gspo, gpg, bapo,
gtpo, troll, troll_seq) is ``runners.algorithms.policy_loss.PolicyLoss``, the function the built-in
trainer calls for each micro-batch, applied to verl's tensors: entropy control (REPO-R/D advantages,
ADAPO bounds, adaptive bonus), sequence mask (TRM, LN-TRM, SER: rejected sequences stay in the
denominator, TRM arXiv 2512.23075 eq. 50), objective, KL-to-reference term and aggregation are
assembled there and nowhere else. So masks and entropy controllers combine with any objective
("GSPO with TROLL", "GRPO with TRM-Max and REPO-R" are one config each).

verl-specific inputs: the aggregation uses verl's global-batch counts
(``config.global_batch_info``: tokens and sequences of the mini-batch over all data-parallel ranks,
divided by the data-parallel size, as verl's ``agg_loss``) and ``loss_scale_factor``; verl's rollout
importance weights, when given, multiply the per-token loss as in verl's own losses. Inputs beyond
verl's signature (sampled ids, prompt groups, current entropy and logits, the sparse old
distribution, the rollout engine's and the reference policy's log-probs, the controller state) come
as ``inputs=TrustbenchInputs(...)``; inside verl's ``ppo_loss`` they are supplied by
``plugins_ppo_loss.trustbench_ppo_loss`` through ``using_inputs`` (a context variable: verl's
``ppo_loss`` calls the loss with a fixed signature).

Where verl's loop differs from the built-in trainer's (not the loss function's doing): verl forms
mini/micro-batches by sample (and balances sequences across data-parallel ranks), not by whole
prompt groups, so GTPO sees the members of a group that share its micro-batch.

    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    loss, metrics = get_policy_loss_fn("trustbench_troll")(old_logp, logp, adv, mask, "token-mean",
                                                         actor_config, None, inputs=TrustbenchInputs(...))

Tests: ``pytest tests/verl/test_plugins_losses.py tests/verl/test_cross_backend.py``.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any

from torch import Tensor
from verl.trainer.ppo.core_algos import register_policy_loss

from runners.algorithms import LOSS_AGGS
from runners.algorithms.estimators import group_inverse
from runners.algorithms.policy_loss import PolicyLoss
from runners.algorithms.policy_loss import build_controller as build_method_controller
from runners.algorithms.types import PolicyInputs
from runners.backends.verl import LOSS_MODES
from runners.backends.verl.plugins.config import LossSettings, loss_fields, settings_from_fields

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
    # [B,T,V] current temperature-scaled logits, differentiable (a method that needs them without the
    # sparse old distribution)
    logits: Tensor | None = None
    # [B,T,K+1] current log-probs at old_topk_index, and V (TROLL, exact-KL TRM: ``sparse_old.response_topk_logp``)
    topk_logp: Tensor | None = None
    vocab_size: int | None = None
    # [B,T,K+1] sparse old distribution: vocabulary ids and log-probs (-inf marks unused slots)
    old_topk_index: Tensor | None = None
    old_topk_logp: Tensor | None = None
    # [B,T] the rollout engine's log-probs of the sampled tokens (sample-based masks)
    rollout_logp: Tensor | None = None
    # [B,T] the reference policy's log-probs (KL-to-reference term, policy_loss.kl_coef)
    ref_logp: Tensor | None = None
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
    """The method's entropy controller with the state the trainer pushed for this iteration."""
    return build_method_controller(settings.method, runtime.get("entropy_control_state"))


def _global_counts(config: Any) -> tuple[float | None, float | None, float | None]:
    """(num_tokens, num_seqs, norm_len) of this rank from verl's ``global_batch_info`` (None: local
    counts / the method's norm_len, as verl's ``agg_loss`` without global info)."""
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


@dataclass
class _Built:
    """A ``PolicyLoss`` and what it was built from (``policy_loss_for``)."""

    key: str  # repr of the node's loss_fields
    state: Any
    settings: LossSettings
    loss_fn: PolicyLoss


# loss_agg_mode -> the loss last built for it in this process
_BUILT: dict[str, _Built] = {}


def policy_loss_for(node: Any, loss_mode: str, loss_agg_mode: str, runtime: dict) -> tuple[LossSettings, PolicyLoss]:
    """The settings and ``PolicyLoss`` of a ``policy_loss`` config node, built once and reused for every
    micro-batch while the node's fields (``loss_fields``) and the entropy controller's state (pushed by
    the trainer once per iteration) are unchanged. Controllers change state only in ``update``, which
    the trainer calls between iterations, so reuse within one gives the losses a fresh build would."""
    fields = loss_fields(node, loss_mode)
    key = repr(fields)
    state = runtime.get("entropy_control_state")
    built = _BUILT.get(loss_agg_mode)
    if built is None or built.key != key or built.state != state:
        settings = settings_from_fields(fields)
        method = replace(settings.method, loss_agg=loss_agg_mode)
        built = _Built(key, copy.deepcopy(state), settings, PolicyLoss(method, build_controller(settings, runtime)))
        _BUILT[loss_agg_mode] = built
    return built.settings, built.loss_fn


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
    runtime = dict(inputs.runtime or {})
    settings, loss_fn = policy_loss_for(getattr(config, "policy_loss", None), loss_mode, loss_agg_mode, runtime)
    if settings.needs_grad_entropy and inputs.entropy is None:
        raise ValueError(
            f"{', '.join(settings.method.needing('grad_entropy'))} need the current entropy: set "
            "actor_rollout_ref.actor.calculate_entropy=true"
        )
    group = (
        None if inputs.group_index is None else group_inverse(inputs.group_index, log_prob.shape[0], log_prob.device)
    )
    inp = PolicyInputs(
        logp=log_prob,
        old_logp=old_log_prob,
        advantages=advantages,
        response_mask=response_mask.to(log_prob.dtype),
        rollout_logp=inputs.rollout_logp,
        responses=inputs.responses,
        group_index=group,
        entropy=inputs.entropy,
        logits=inputs.logits,
        topk_logp=inputs.topk_logp,
        vocab_size=inputs.vocab_size,
        old_topk_index=inputs.old_topk_index,
        old_topk_logp=inputs.old_topk_logp,
    )
    num_tokens, num_seqs, norm_len = _global_counts(config)
    out = loss_fn(
        inp,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        norm_len=norm_len,
        ref_logp=inputs.ref_logp,
        is_weights=rollout_is_weights,
        h_ini=runtime.get("h_ini"),
    )
    return out.loss, out.metrics


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
        + ", plus the configured mask and entropy control (see runners.backends.verl.plugins.losses)."
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
