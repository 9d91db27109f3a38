"""GTPO: conflict-aware token weights, entropy filter and entropy term (GTPO, arXiv 2508.03772, sections 5, 11, 16).

Design: conflict detection is fully batched over every prompt group of the batch at once. Each
(group, aligned position, token id) triple of a response with a non-zero advantage becomes one int64
key; one ``torch.unique`` over the keys of the valid tokens gives, per key, whether a positive and a
negative response share it. No Python loop over groups or tokens; memory O(B*T) whatever the
vocabulary size (token ids are compacted first only if the keys could overflow). Backward conflicts
use the same routine on each response reversed on its OWN length (right padding), as the authors'
code does (GTPO, arXiv 2508.03772, Listing 2). The contiguous span from the start is a running minimum
(``cummin``) along positions. Measured on 2 shared CPU cores: 0.5 s for 512 x 1024 tokens.

The weights lambda and the filter delta are folded into the returned per-token loss matrix, which
reproduces eq. 7 exactly under ``seq-mean-token-mean`` aggregation (GTPO's natural mode, also given
as ``ObjectiveOutput.extra["loss_agg"]``). The ``extra`` tensors ``gtpo_lambda`` / ``gtpo_delta``
are informational: they are already applied.

Run the tests: ``pytest tests/algorithms/test_gtpo.py``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from runners.algorithms.loss_agg import masked_mean
from runners.algorithms.types import ObjectiveOutput, PolicyInputs
from runners.metric_names import GTPO_CONFLICT_FRAC, GTPO_FILTERED_FRAC

LN2 = math.log(2.0)
GTPO_LOSS_AGG = "seq-mean-token-mean"
COMBINE_MODES = ("or", "product")
ENTROPY_TERMS = ("penalty", "advantage_shift")


def _check_right_padded(valid: Tensor) -> Tensor:
    """Return lengths [B]; raise unless every row of ``valid`` [B,T] is a prefix of ones."""
    lengths = valid.sum(-1)
    prefix = torch.arange(valid.shape[-1], device=valid.device) < lengths[:, None]
    if not torch.equal(prefix, valid):
        bad = (prefix != valid).any(-1).nonzero()[0, 0].item()
        raise ValueError(
            f"response_mask must be right-padded (ones then zeros); row {bad} is not: {valid[bad].int().tolist()}"
        )
    return lengths


def _aligned_conflicts(ids: Tensor, valid: Tensor, group: Tensor, pos: Tensor, neg: Tensor) -> Tensor:
    """Raw conflicts [B,T] bool: token ids[i,p] also sits at position p in an opposite-sign response.

    ``ids``/``valid`` [B,T] already aligned (forward or reversed), ``group`` [B] compact group ids,
    ``pos``/``neg`` [B] bool advantage signs. Responses with neither sign are ignored.
    """
    batch, length = ids.shape
    active = valid & (pos | neg)[:, None]
    out = torch.zeros_like(valid)
    if not bool(active.any()):
        return out
    steps = torch.arange(length, device=ids.device).expand(batch, length)[active]
    groups = group[:, None].expand(batch, length)[active]
    token = ids[active].long()
    if int(token.min()) < 0 or (int(group.max()) + 1) * length * (int(token.max()) + 1) >= 2**62:
        _, token = torch.unique(token, return_inverse=True)  # compact the ids so keys fit in int64
    vocab = int(token.max()) + 1
    key = (groups * length + steps) * vocab + token
    uniq, inv = torch.unique(key, return_inverse=True)
    is_pos = pos[:, None].expand(batch, length)[active]
    has_pos = torch.zeros(uniq.numel(), dtype=torch.bool, device=ids.device)
    has_neg = torch.zeros_like(has_pos)
    has_pos[inv[is_pos]] = True
    has_neg[inv[~is_pos]] = True
    out[active] = has_pos[inv] & has_neg[inv]
    return out


def _leading_run(conflict: Tensor) -> Tensor:
    """First contiguous run of True from position 0 along the last dim ([B,T] bool)."""
    return conflict.to(torch.uint8).cummin(dim=-1).values.bool()


def conflict_spans(
    responses: Tensor, response_mask: Tensor, group_index: Tensor, advantages_seq: Tensor
) -> tuple[Tensor, Tensor]:
    """Forward and backward conflict spans (GTPO, arXiv 2508.03772, section 5.1, "Conflict tokens definitions").

    responses [B,T] int token ids, response_mask [B,T] right-padded, group_index [B] int (any
    values; equal value = same prompt group), advantages_seq [B] sequence advantage A_i.
    A token at position p is a forward conflict if the same id is at position p in some A>0 and
    some A<0 response of its group; backward likewise at offset r from each response's own end.
    A=0 responses are ignored (and get no span). Only the contiguous span from the start (forward)
    or from the end (backward) counts. Returns (forward [B,T] bool, backward [B,T] bool), False on
    padding.
    """
    if responses.dtype.is_floating_point:
        raise TypeError(f"responses must hold integer token ids, got dtype {responses.dtype}")
    if responses.shape != response_mask.shape or responses.dim() != 2:
        raise ValueError(
            f"responses {tuple(responses.shape)} and response_mask {tuple(response_mask.shape)} must be [B,T]"
        )
    if group_index.shape != responses.shape[:1] or advantages_seq.shape != responses.shape[:1]:
        raise ValueError(
            f"group_index {tuple(group_index.shape)} and advantages_seq {tuple(advantages_seq.shape)} "
            f"must be [B] with B={responses.shape[0]}"
        )
    valid = response_mask.bool()
    lengths = _check_right_padded(valid)
    pos, neg = advantages_seq > 0, advantages_seq < 0
    _, group = torch.unique(group_index, return_inverse=True)

    forward = _leading_run(_aligned_conflicts(responses, valid, group, pos, neg))

    # reverse each response on its own length: rev[i, r] = responses[i, len_i - 1 - r]
    steps = torch.arange(responses.shape[-1], device=responses.device)
    flip = (lengths[:, None] - 1 - steps).clamp(min=0)
    reversed_ids = responses.gather(1, flip)
    backward_rev = _leading_run(_aligned_conflicts(reversed_ids, valid, group, pos, neg))
    backward = backward_rev.gather(1, flip) & valid  # the same index map undoes the reversal
    return forward, backward


def _weights_from_spans(
    forward: Tensor,
    backward: Tensor,
    advantages_seq: Tensor,
    response_mask: Tensor,
    combine: str,
    conflict_weight: float,
) -> Tensor:
    """lambda [B,T] (GTPO, arXiv 2508.03772, eq. 5 / eq. 22), zero on padding."""
    if combine not in COMBINE_MODES:
        raise ValueError(f"unknown GTPO combine {combine!r}; valid: {', '.join(COMBINE_MODES)}")
    dtype = torch.get_default_dtype()
    one = torch.ones((), dtype=dtype, device=forward.device)
    # weight on a span: conflict_weight for A>0, 0 for A<0 (A=0 responses never have a span)
    on_span = torch.where(advantages_seq > 0, conflict_weight * one, torch.where(advantages_seq < 0, 0 * one, one))
    on_span = on_span[:, None]
    if combine == "or":  # paper: M = M_fw OR M_bw
        weights = torch.where(forward | backward, on_span, one)
    else:  # authors' code: mask_fwd * mask_bw (4 for A>0 in both spans)
        weights = torch.where(forward, on_span, one) * torch.where(backward, on_span, one)
    return weights * response_mask.to(dtype)


def gtpo_weights(
    responses: Tensor,
    response_mask: Tensor,
    group_index: Tensor,
    advantages_seq: Tensor,
    *,
    combine: str = "or",
    conflict_weight: float = 2.0,
) -> Tensor:
    """Token weights lambda [B,T] (GTPO, arXiv 2508.03772, eq. 5): 1 off-span; on a span 0 for A<0, 2 for A>0.

    ``combine="or"``: span = forward OR backward (paper). ``"product"``: forward weight times
    backward weight (authors' code, GTPO (arXiv 2508.03772) Listing 2), so a positive token in both spans gets 4.
    Padding gets 0. Inputs as in ``conflict_spans``.
    """
    forward, backward = conflict_spans(responses, response_mask, group_index, advantages_seq)
    return _weights_from_spans(forward, backward, advantages_seq, response_mask, combine, conflict_weight)


def entropy_filter(
    mean_token_entropy: Tensor, h_ini: float | None, *, threshold: float = LN2, ini_threshold: float = LN2
) -> Tensor:
    """Completion filter delta [B] in {0, 1} (GTPO, arXiv 2508.03772, eq. 6).

    mean_token_entropy [B] = <H>_i. If H_ini < ln 2 (``ini_threshold``) responses with
    <H>_i > ln 2 (``threshold``; the ablations of GTPO (arXiv 2508.03772) sections 12-13 vary it) get 0; otherwise
    every response keeps 1. ``h_ini=None`` (unknown) and H_ini = ln 2 (left open by eq. 6) keep all.
    """
    if h_ini is None or h_ini >= ini_threshold:
        return torch.ones_like(mean_token_entropy)
    return (mean_token_entropy <= threshold).to(mean_token_entropy.dtype)


def compute_initial_entropy(token_entropy: Tensor, response_mask: Tensor, *, per_response: bool = True) -> float:
    """H_ini from the initial model's per-token entropies [B,T] on the first training prompts.

    GTPO (arXiv 2508.03772) section 5.2 measures it "over a set of questions, prior to training" (here: the
    first 100 training prompts). Default: the mean over responses of <H>_i, the statistic eq. 6
    compares to the same ln 2; ``per_response=False`` gives the plain token mean.
    """
    mask = response_mask.to(token_entropy.dtype)
    if per_response:
        rows = mask.sum(-1) > 0
        return float(masked_mean(token_entropy, mask, dim=-1)[rows].mean())
    return float(masked_mean(token_entropy, mask))


def gtpo_objective(
    inp: PolicyInputs,
    *,
    gamma: float = 0.1,
    combine: str = "or",
    entropy_term: str = "penalty",
    h_ini: float | None = None,
    entropy_threshold: float = LN2,
    conflict_weight: float = 2.0,
) -> ObjectiveOutput:
    """GTPO per-token loss [B,T]; aggregate with ``seq-mean-token-mean``.

    ``entropy_term="penalty"`` (paper, GTPO (arXiv 2508.03772) eq. 7), with r = exp(logp - old_logp):
        J = (1/G) sum_i [ delta_i A_i / |o_i| sum_t lambda_it r_it - gamma <H>_i ]
    loss_mat[i,t] = -delta_i A_it lambda_it r_it + gamma H_it, with H the differentiable
    ``inp.entropy``; its seq-mean-token-mean is exactly -J (the penalty applies to every response,
    filtered or zero-advantage ones included, as eq. 7 is written).

    ``entropy_term="advantage_shift"`` (authors' code, GTPO (arXiv 2508.03772) section 16, Listing 3): A_i becomes
    delta_i (A_i - gamma sg(<H>_i)), and each response's token-mean loss is divided by its number of
    conflict tokens. Reading of "divides by the number of conflict tokens": n_conflict_i = number of
    valid positions of response i in its forward OR backward span (Listing 2, total_conflict),
    clamped to >= 1 (so a response without conflicts, or with A=0, is divided by 1); the division is
    on top of the 1/|o_i| token mean (gtpo_compute_loss: loss_disp / n_conflict). So
    loss_mat[i,t] = -delta_i (A_it - gamma sg(<H>_i)) lambda_it r_it / max(1, n_conflict_i).
    The authors then SUM the per-completion losses (their custom backward accumulates one gradient
    per completion, one prompt of G completions per step); the mean over the B responses here is
    that sum divided by B, a constant learning-rate scale.

    The conflict sign of response i is that of its masked-mean advantage; the loss uses the
    per-token advantages (equal to A_i for group estimators). The filter delta (eq. 6) uses
    <H>_i = token mean of ``inp.entropy`` (detached) and ``h_ini``; ``h_ini=None`` disables it.
    Needs ``inp.responses``, ``inp.group_index``; ``inp.entropy`` unless gamma == 0 and no filter.
    """
    if entropy_term not in ENTROPY_TERMS:
        raise ValueError(f"unknown GTPO entropy_term {entropy_term!r}; valid: {', '.join(ENTROPY_TERMS)}")
    if inp.responses is None or inp.group_index is None:
        raise ValueError("gtpo objective needs PolicyInputs.responses (token ids) and PolicyInputs.group_index")
    filtering = h_ini is not None and h_ini < LN2
    if inp.entropy is None and (gamma != 0 or filtering):
        raise ValueError(
            f"gtpo objective needs PolicyInputs.entropy for gamma={gamma} / h_ini={h_ini} "
            "(pass gamma=0 and h_ini=None to run without entropies)"
        )
    dtype = inp.logp.dtype
    mask = inp.response_mask.to(dtype)
    valid = inp.response_mask.bool()
    adv_seq = masked_mean(inp.advantages.detach(), mask, dim=-1)
    forward, backward = conflict_spans(inp.responses, inp.response_mask, inp.group_index, adv_seq)
    lam = _weights_from_spans(forward, backward, adv_seq, inp.response_mask, combine, conflict_weight).to(dtype)

    if inp.entropy is not None:
        h_seq = masked_mean(inp.entropy.detach(), mask, dim=-1)
        delta = entropy_filter(h_seq, h_ini, threshold=entropy_threshold).to(dtype)
    else:
        h_seq, delta = None, torch.ones(mask.shape[0], dtype=dtype, device=mask.device)

    ratio = torch.exp(inp.logp - inp.old_logp)
    in_span = (forward | backward) & valid
    if entropy_term == "penalty":
        loss = -(delta[:, None] * inp.advantages * lam * ratio)
        if gamma != 0:
            loss = loss + gamma * inp.entropy
    else:
        adv = inp.advantages if h_seq is None else inp.advantages - gamma * h_seq[:, None]
        gain = -(delta[:, None] * adv * lam * ratio)
        # the count in the loss's dtype: float32 advantages with bf16 log-probs must not round 257 to 256
        loss = gain / in_span.sum(-1).clamp(min=1).to(gain.dtype)[:, None]
    loss_mat = torch.where(valid, loss, torch.zeros((), dtype=dtype, device=loss.device))

    rows = valid.any(-1)
    metrics = {
        GTPO_CONFLICT_FRAC: float(in_span.sum()) / max(1, int(valid.sum())),
        GTPO_FILTERED_FRAC: float(((delta == 0) & rows).sum()) / max(1, int(rows.sum())),
    }
    extra = {"loss_agg": GTPO_LOSS_AGG, "gtpo_lambda": lam.detach(), "gtpo_delta": delta.detach()}
    return ObjectiveOutput(loss_mat=loss_mat, metrics=metrics, extra=extra)


__all__ = [
    "GTPO_LOSS_AGG",
    "LN2",
    "compute_initial_entropy",
    "conflict_spans",
    "entropy_filter",
    "gtpo_objective",
    "gtpo_weights",
]
