"""Policy objectives (PPO arXiv 1707.06347, DAPO 2503.14476, GSPO 2507.18071, GPG 2504.02546, BAPO) and the
critic's value loss (T-PPO, arXiv 2506.15050, section 3).

Contract: ``fn(inp: PolicyInputs, **params) -> ObjectiveOutput(loss_mat [B,T], metrics)``. The loss
is ``-objective`` per token; the caller reduces it with ``runners.algorithms.loss_agg`` and the
response mask, so one objective works with every aggregation mode and with TRM sequence masks.

Design decisions:

- Ratios come from ``logp - old_logp`` computed in float32 whatever the input dtype (bf16 log-probs
  are upcast first, Entropy-preserving RL (arXiv 2603.11682) section 4), and the log-ratio is clamped to [-20, 20] like verl, so a
  huge log-ratio cannot overflow ``exp``. The loss matrix is float32.
- Clip semantics follow verl 0.9.1 (``compute_policy_loss_vanilla``, ``_gspo``, ``_gpg``), which the
  tests compare on random tensors, losses and gradients: dual clip applies to A < 0 only;
  ``pg_clipfrac`` counts tokens where the clipped term wins; GSPO uses verl's stop-gradient token form.
- One difference from verl: dual clip is off unless ``clip_ratio_c`` is given (verl always applies
  it with c = 3); ``clip_ratio_c=3.0`` reproduces verl.
- BAPO (adaptive bounds) reuses the same clipped loss; its sources and the two readings of its
  bound rule are documented at its section below.

Run the tests: ``pytest tests/algorithms/test_objectives.py``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from runners import metric_names
from runners.algorithms.loss_agg import masked_mean
from runners.algorithms.types import ObjectiveOutput, PolicyInputs
from runners.checks import check_arguments

LOG_RATIO_CLAMP = 20.0  # verl clamps log(pi/pi_old) to [-20, 20] before exp
GSPO_LOG_RATIO_MAX = 10.0  # verl clamps GSPO's log sequence ratio from above at 10


def log_ratio(inp: PolicyInputs) -> Tensor:
    """[B,T] float32 ``logp - old_logp`` clamped to [-20, 20] (gradient flows to ``inp.logp``)."""
    if inp.logp.shape != inp.old_logp.shape:
        raise ValueError(f"logp {tuple(inp.logp.shape)} and old_logp {tuple(inp.old_logp.shape)} differ in shape")
    diff = inp.logp.to(torch.float32) - inp.old_logp.detach().to(torch.float32)
    return diff.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _mask(inp: PolicyInputs) -> Tensor:
    return inp.response_mask.to(torch.float32)


def _item(x: Tensor) -> float:
    return float(x.detach().item())


def clipped_surrogate_loss(
    ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    lower: float,
    upper: float,
    clip_ratio_c: float | None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped loss ``-min(r A, clip(r, lower, upper) A)`` [B,T] with optional dual clip.

    ``lower``/``upper`` are ratio bounds (1 - eps_low, 1 + eps_high). Dual clip (Ye et al. 2020,
    verl): for A < 0 the loss is further capped at ``-c A``.
    """
    loss1 = -advantages * ratio
    loss2 = -advantages * ratio.clamp(lower, upper)
    clipped = torch.maximum(loss1, loss2)
    metrics = {metric_names.PG_CLIPFRAC: _item(masked_mean(torch.gt(loss2, loss1).float(), mask))}
    if clip_ratio_c is None:
        metrics[metric_names.PG_CLIPFRAC_LOWER] = 0.0
        return clipped, metrics
    loss3 = -advantages * clip_ratio_c
    dual = torch.minimum(loss3, clipped)
    negative = advantages < 0
    lower_hits = torch.gt(clipped, loss3) & negative
    metrics[metric_names.PG_CLIPFRAC_LOWER] = _item(masked_mean(lower_hits.float(), mask))
    return torch.where(negative, dual, clipped), metrics


def check_objective_arguments(name: str, **values) -> None:
    """Refuse ``values`` with the checks of the config schema of objective ``name`` (their one home)."""
    from runners.algorithms import OBJECTIVES  # the registry line names the schema

    check_arguments(f"objective {name!r}:", OBJECTIVES.schema(name), **values)


def clip_objective(
    inp: PolicyInputs,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float | None = None,
) -> ObjectiveOutput:
    """PPO clip ``min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)`` (PPO, arXiv 1707.06347); loss [B,T].

    Symmetric PPO: eps_low = eps_high = 0.2. DAPO: 0.2 / 0.28. T-PPO: 0.2 / 0.28 (T-PPO, arXiv 2506.15050, s3).
    ``clip_ratio_c`` > 1 enables dual clip as in verl. Metrics: ``actor/pg_clipfrac``,
    ``actor/pg_clipfrac_lower``, ``actor/ppo_kl`` (masked mean of ``old_logp - logp``).
    """
    check_objective_arguments(
        "clip", clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high, clip_ratio_c=clip_ratio_c
    )
    mask = _mask(inp)
    lr = log_ratio(inp)
    loss, metrics = clipped_surrogate_loss(
        lr.exp(), inp.advantages.to(torch.float32), mask, 1 - clip_ratio_low, 1 + clip_ratio_high, clip_ratio_c
    )
    metrics[metric_names.PPO_KL] = _item(masked_mean(-lr, mask))
    return ObjectiveOutput(loss_mat=loss, metrics=metrics)


def token_is_objective(inp: PolicyInputs) -> ObjectiveOutput:
    """Token-level importance sampling without clipping: objective ``r A``, loss ``-r A`` [B,T]."""
    lr = log_ratio(inp)
    loss = -inp.advantages.to(torch.float32) * lr.exp()
    return ObjectiveOutput(loss_mat=loss, metrics={metric_names.PPO_KL: _item(masked_mean(-lr, _mask(inp)))})


def gpg_objective(inp: PolicyInputs) -> ObjectiveOutput:
    """GPG: objective ``logp A`` (no ratio, no clip), loss ``-logp A`` [B,T] (verl's ``gpg`` loss)."""
    loss = -inp.logp.to(torch.float32) * inp.advantages.to(torch.float32)
    return ObjectiveOutput(loss_mat=loss, metrics={})


def gspo_objective(
    inp: PolicyInputs, *, clip_ratio_low: float = 3e-4, clip_ratio_high: float = 4e-4
) -> ObjectiveOutput:
    """GSPO: sequence ratio ``s_i = exp(mean_t (logp - old_logp))`` clipped to [1 - eps_low, 1 + eps_high].

    Token form of verl's ``compute_policy_loss_gspo``: ``log s_{i,t} = sg[log s_i] + logp_t - sg[logp_t]``
    (value s_i on every token, gradient of token t through its own log-prob), clamped at 10 from above.
    The log-ratio is not clamped to [-20, 20] here, as in verl. Metrics as :func:`clip_objective`.
    """
    check_objective_arguments("gspo", clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high)
    mask = _mask(inp)
    logp = inp.logp.to(torch.float32)
    diff = logp - inp.old_logp.detach().to(torch.float32)
    seq_log_ratio = (diff * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    token_log_ratio = logp - logp.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = token_log_ratio.clamp(max=GSPO_LOG_RATIO_MAX).exp()
    loss, metrics = clipped_surrogate_loss(
        ratio, inp.advantages.to(torch.float32), mask, 1 - clip_ratio_low, 1 + clip_ratio_high, None
    )
    metrics[metric_names.PPO_KL] = _item(masked_mean(-diff, mask))
    return ObjectiveOutput(loss_mat=loss, metrics=metrics)


def entropy_bonus_term(entropy: Tensor, coef: float) -> Tensor:
    """Per-token loss term ``-coef * H`` [B,T] of an entropy bonus (objective + coef * H)."""
    return -coef * entropy.to(torch.float32)


def value_loss(
    values: Tensor,
    values_old: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.5,
    clip_high: float = 0.6,
) -> ObjectiveOutput:
    """Clipped value loss ``0.5 max((V - R)^2, (clip(V, V_old - xi_low, V_old + xi_high) - R)^2)`` [B,T].

    T-PPO's asymmetric form (T-PPO, arXiv 2506.15050, eqs. 4-5, xi_low = 0.5, xi_high = 0.6); ``clip_low == clip_high``
    is PPO's clipped value loss (verl's ``compute_value_loss`` with ``cliprange_value``). Metrics:
    ``critic/vf_loss`` (token mean over ``mask``), ``critic/vf_clipfrac``.
    """
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"value clip ranges must be >= 0, got clip_low={clip_low!r} clip_high={clip_high!r}")
    v = values.to(torch.float32)
    v_old = values_old.detach().to(torch.float32)
    ret = returns.detach().to(torch.float32)
    m = mask.to(torch.float32)
    v_clipped = torch.maximum(torch.minimum(v, v_old + clip_high), v_old - clip_low)
    loss1 = (v - ret) ** 2
    loss2 = (v_clipped - ret) ** 2
    loss = 0.5 * torch.maximum(loss1, loss2)
    metrics = {
        metric_names.VF_LOSS: _item(masked_mean(loss, m)),
        metric_names.VF_CLIPFRAC: _item(masked_mean(torch.gt(loss2, loss1).float(), m)),
    }
    return ObjectiveOutput(loss_mat=loss, metrics=metrics)


# -- BAPO ----------------------------------------------------------------------------------------
# BAPO (Xi et al. 2025, "BAPO: Stabilizing Off-Policy Reinforcement Learning for LLMs via Balanced
# Policy Optimization with Adaptive Clipping", arXiv 2510.18927). Sources read: the abstract and the
# authors' README and verl recipe (github.com/WooooDyy/BAPO, recipe/bapo/policy_loss.py and
# config/bapo_trainer.yaml); the full paper text was not available here. Per batch, the ratio bounds
# [c_low, c_high] start at [a-, a+] and are raised in steps until positive-advantage tokens make up
# at least a share rho_0 of the loss, or the bounds reach [b-, b+]. README defaults "as used in the
# paper": rho_0 = 0.5, c_low in [0.6, 0.9], c_high in [1.2, 3.0]; step 0.05 is the recipe's.
# Two readings of "share of the loss" (``rule``):
#   "paper" (default): the share among tokens that carry gradient (A > 0 with r <= c_high, A < 0
#     with r >= c_low), each weighted by |r A|; raising c_high admits more positive tokens and raising
#     c_low drops low-ratio negative tokens, both raise the share (the paper's stated mechanism:
#     "incorporating more low-probability positive tokens and filtering excessive low-probability
#     negative tokens"); both bounds move one step per iteration.
#   "recipe": the authors' verl code: the share of the clipped surrogate values of all tokens
#     (A >= 0: min(r, c_high) A; A < 0: max(r, c_low) |A|), raising c_low to its maximum first, then
#     c_high; a target ratio pos/neg = rho_0 / (1 - rho_0).
BAPO_CLIP_LOW = "bapo/clip_low"
BAPO_CLIP_HIGH = "bapo/clip_high"
BAPO_POS_SHARE = "bapo/pos_share"
BAPO_RULES = ("paper", "recipe")


def bapo_positive_share(
    ratio: Tensor, advantages: Tensor, mask: Tensor, lower: float, upper: float, rule: str
) -> float:
    """Share of positive-advantage tokens in the loss under ratio bounds [lower, upper] (see above).

    ``ratio``, ``advantages``, ``mask``: [B,T], no gradient needed. Returns 1.0 when nothing
    contributes (no adjustment is needed then).
    """
    pos = (advantages > 0) & (mask > 0)
    neg = (advantages < 0) & (mask > 0)
    if rule == "paper":
        weight = ratio * advantages.abs()
        pos_sum = (weight * (pos & (ratio <= upper))).sum()
        neg_sum = (weight * (neg & (ratio >= lower))).sum()
    else:
        pos_sum = (ratio.clamp(max=upper) * advantages * pos).sum()
        neg_sum = (ratio.clamp(min=lower) * -advantages * neg).sum()
    total = float((pos_sum + neg_sum).item())
    return 1.0 if total <= 0 else float(pos_sum.item()) / total


def choose_bapo_bounds(
    ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    rho: float,
    low_start: float,
    low_max: float,
    high_start: float,
    high_max: float,
    low_step: float,
    high_step: float,
    rule: str,
) -> tuple[float, float, float]:
    """Search the ratio bounds of one batch; returns ``(c_low, c_high, positive share)``."""

    def share(lo: float, hi: float) -> float:
        return bapo_positive_share(ratio, advantages, mask, lo, hi, rule)

    def stepped(start: float, step: float, k: int, cap: float) -> float:
        return min(start + k * step, cap)  # k * step: no drift from repeated additions

    k_low = k_high = 0
    lower, upper = low_start, high_start
    current = share(lower, upper)
    if rule == "paper":
        while current < rho and (lower < low_max or upper < high_max):
            k_low, k_high = k_low + 1, k_high + 1
            lower = stepped(low_start, low_step, k_low, low_max)
            upper = stepped(high_start, high_step, k_high, high_max)
            current = share(lower, upper)
        return lower, upper, current
    while current < rho and lower < low_max:
        k_low += 1
        lower = stepped(low_start, low_step, k_low, low_max)
        current = share(lower, upper)
    while current < rho and upper < high_max:
        k_high += 1
        upper = stepped(high_start, high_step, k_high, high_max)
        current = share(lower, upper)
    return lower, upper, current


def bapo_objective(
    inp: PolicyInputs,
    *,
    rho: float = 0.5,
    ratio_low_start: float = 0.6,
    ratio_low_max: float = 0.9,
    ratio_high_start: float = 1.2,
    ratio_high_max: float = 3.0,
    ratio_low_step: float = 0.05,
    ratio_high_step: float = 0.05,
    rule: str = "paper",
    clip_ratio_c: float | None = None,
) -> ObjectiveOutput:
    """BAPO: PPO clip with per-batch bounds [c_low, c_high] (explicit ratio bounds, not epsilons).

    Bounds are searched on ``inp``'s tokens (pass the whole mini-batch, or accept per-micro-batch
    bounds); the loss is :func:`clipped_surrogate_loss` with them, [B,T]. Metrics: the clip metrics plus
    ``bapo/clip_low``, ``bapo/clip_high`` and ``bapo/pos_share`` (share reached with those bounds).
    """
    check_objective_arguments(
        "bapo",
        rho=rho,
        ratio_low_start=ratio_low_start,
        ratio_low_max=ratio_low_max,
        ratio_high_start=ratio_high_start,
        ratio_high_max=ratio_high_max,
        ratio_low_step=ratio_low_step,
        ratio_high_step=ratio_high_step,
        rule=rule,
        clip_ratio_c=clip_ratio_c,
    )
    mask = _mask(inp)
    lr = log_ratio(inp)
    ratio = lr.exp()
    advantages = inp.advantages.to(torch.float32)
    lower, upper, share = choose_bapo_bounds(
        ratio.detach(),
        advantages,
        mask,
        rho=rho,
        low_start=ratio_low_start,
        low_max=ratio_low_max,
        high_start=ratio_high_start,
        high_max=ratio_high_max,
        low_step=ratio_low_step,
        high_step=ratio_high_step,
        rule=rule,
    )
    loss, metrics = clipped_surrogate_loss(ratio, advantages, mask, lower, upper, clip_ratio_c)
    metrics[metric_names.PPO_KL] = _item(masked_mean(-lr, mask))
    metrics.update({BAPO_CLIP_LOW: lower, BAPO_CLIP_HIGH: upper, BAPO_POS_SHARE: share})
    return ObjectiveOutput(loss_mat=loss, metrics=metrics)


__all__ = [
    "BAPO_CLIP_HIGH",
    "BAPO_CLIP_LOW",
    "BAPO_POS_SHARE",
    "bapo_objective",
    "bapo_positive_share",
    "check_objective_arguments",
    "choose_bapo_bounds",
    "clip_objective",
    "clipped_surrogate_loss",
    "entropy_bonus_term",
    "gpg_objective",
    "gspo_objective",
    "log_ratio",
    "token_is_objective",
    "value_loss",
]
