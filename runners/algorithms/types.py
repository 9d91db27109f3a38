"""Data passed between the trainer and the algorithm library.

Shapes: B responses (a batch of prompt groups flattened, group members contiguous or identified by
``group_index``), T response positions (right-padded), K kept entries of a sparse distribution,
V vocabulary. All masks are float or bool with 1 on real response tokens.

Sparse distributions (TROLL section 3.2, TRM exact KL) are stored as a pair
``(index [B,T,K] int32/int64, logp [B,T,K] float)`` of vocabulary ids and log-probabilities, with
padding slots marked by ``logp = -inf`` (their index is arbitrary but valid, e.g. 0). The kept set
always contains the sampled token. Trainers store the kept tokens' true log-probs (their sum is the
kept mass; ``sparsify(renormalize=False)``): TROLL renormalises on the kept set itself and TRM counts
the missing mass as one rest bin, so both are correct at any kept mass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # keep this module importable without torch
    from torch import Tensor


@dataclass
class AdvantageInputs:
    """Inputs of an advantage estimator (``ESTIMATORS[name](inp, **params)``)."""

    # [B,T] reward per token; outcome rewards sit on the last real token (verl's token_level_rewards)
    token_rewards: Tensor
    # [B,T] 1 on real response tokens
    response_mask: Tensor
    # [B] long, responses with the same value belong to the same prompt group
    group_index: Tensor | None = None
    # [B,T] critic values V(s_t) (GAE, EGAE)
    values: Tensor | None = None
    # [B] bool, True where the response ended (EOS or max length) within this window (EGAE)
    finished: Tensor | None = None


@dataclass
class PolicyInputs:
    """Inputs of an objective or a sequence mask for one (micro-)batch."""

    # [B,T] log pi_theta(y_t | c_t), differentiable
    logp: Tensor
    # [B,T] log pi_old(y_t | c_t) of the policy the update is anchored to (no grad)
    old_logp: Tensor
    # [B,T] advantages
    advantages: Tensor
    # [B,T] 1 on real response tokens
    response_mask: Tensor
    # [B,T] log-probs of the sampled tokens under the rollout (sampling) policy, as the sampler
    # returned them: the reference of the sample-based TRM masks; None means old_logp
    rollout_logp: Tensor | None = None
    # [B,T] long, sampled token ids (GTPO conflict detection)
    responses: Tensor | None = None
    # [B] long, prompt group of each response (GTPO)
    group_index: Tensor | None = None
    # [B,T] per-token entropy of pi_theta (differentiable where used as a loss term)
    entropy: Tensor | None = None
    # [B,T,V] current logits (TROLL, exact-KL TRM); float32 recommended
    logits: Tensor | None = None
    # [B,T,K] sparse old/rollout distribution: vocabulary ids and log-probs (-inf marks padding)
    old_topk_index: Tensor | None = None
    old_topk_logp: Tensor | None = None
    # [B,T,K] log pi_theta at old_topk_index (differentiable, float64 recommended): stands in for
    # ``logits`` where a backend never holds them (``chunked_head``); TROLL also needs ``vocab_size``
    topk_logp: Tensor | None = None
    vocab_size: int | None = None

    def rollout_or_old_logp(self) -> Tensor:
        """``rollout_logp``, or ``old_logp`` where the batch has no rollout log-probs."""
        return self.rollout_logp if self.rollout_logp is not None else self.old_logp


@dataclass
class ObjectiveOutput:
    """Per-token loss (to minimise) and scalar metrics named by the metric schema."""

    # [B,T] per-token loss, zero or arbitrary outside the response mask
    loss_mat: Tensor
    # metric name -> float (detached), e.g. {"actor/pg_clipfrac": 0.1}
    metrics: dict[str, float] = field(default_factory=dict)
    # informational tensors (e.g. GTPO's lambda weights, already applied in loss_mat)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class MaskOutput:
    """Per-sequence keep weights (1 keep, 0 reject) and metrics."""

    # [B] float in {0, 1}
    seq_mask: Tensor
    metrics: dict[str, float] = field(default_factory=dict)
