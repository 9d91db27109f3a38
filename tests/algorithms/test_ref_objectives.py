"""Non-TROLL policy objectives and the loss aggregation modes against references written from the papers.

What is compared with what:

- ``OBJECTIVES[name]`` (clip with the PPO / DAPO clip-higher / dual-clip presets of conf/objective,
  token_is, gpg, gspo, cispo, bapo with both bound rules), reduced by ``LOSS_AGGS[mode]`` for every
  aggregation mode: the per-token loss, the aggregated loss and its gradient w.r.t. the current
  log-probs, plus the clip metrics, against the ``ref_*`` functions below.
- ``LOSS_AGGS[mode]``: value and gradient w.r.t. the loss matrix against a loop over sequences and
  tokens (variable lengths, holes inside responses, an empty row, global counts, Dr.GRPO's norm).

The references are plain float64 loops over sequences and tokens, written from each paper's formula
(cited in each docstring); they use nothing from ``runners.algorithms``. Each one returns the per-token
loss and its analytic derivative w.r.t. the token's own log-prob; the aggregated gradient is that
derivative times the aggregation weight of the token (every objective here, GSPO's stop-gradient token
form included, makes token t's loss depend on the gradient path of log pi_t only).
``test_reference_derivatives_match_finite_differences`` checks those derivatives against central finite
differences of the references' own values (GSPO: of its sequence-level objective), so the references do
not rest on hand differentiation alone.

Every case asserts that the method acts: clipping active on both sides with both signs of the advantage
(and unclipped tokens outside the range where the ``min`` keeps the unclipped term), the dual clip binding,
GSPO sequences above, below and inside the range, CISPO weights clipped, BAPO's bound search moving off
its start values (stopping inside the range, and running into its maxima).

Tolerances: the objectives compute ratios in float32 by design (``runners.algorithms.objectives``). The
inputs are float32-representable, so the remaining error is float32 rounding of ``exp`` and of sums of at
most ~60 terms (relative ~1e-7 each): rtol 1e-5, atol 1e-6. Every case keeps each ratio at least 1e-4 away
from each clip boundary (GSPO: each sequence ratio 5e-5), so float32 rounding cannot flip a branch.

Run: ``pytest tests/algorithms/test_ref_objectives.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from runners import metric_names
from runners.algorithms import LOSS_AGGS, OBJECTIVES
from runners.algorithms.types import PolicyInputs

CONF = Path(__file__).resolve().parents[2] / "conf" / "objective"
MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
RTOL, ATOL = 1e-5, 1e-6
MARGIN = 1e-4  # smallest allowed |r - bound| (ratio units)
GSPO_MARGIN = 5e-5  # smallest allowed |s_i - bound| for GSPO's sequence ratio


# -- references ----------------------------------------------------------------------------------------
def _real(mask: np.ndarray):
    """(i, t) of every real token, row by row."""
    rows, cols = mask.shape
    for i in range(rows):
        for t in range(cols):
            if mask[i, t] > 0:
                yield i, t


def ref_ppo_clip(logp, old_logp, adv, mask, *, lower, upper, dual_c=None):
    """PPO clipped surrogate per token with explicit ratio bounds ``[lower, upper]``, optional dual clip.

    Objective (PPO, arXiv 1707.06347, eq. 7): ``min(r A, clip(r, lower, upper) A)``, ``r = pi / pi_old``;
    ``lower = 1 - eps_low``, ``upper = 1 + eps_high`` (DAPO clip-higher, arXiv 2503.14476, sec. 3.1, when
    eps_high > eps_low). Dual clip (Ye et al., arXiv 1912.09729, dual-clip PPO): for A < 0 the objective is
    ``max(min(r A, clip(r) A), c A)``. Loss = -objective.

    Returns ``(loss, dloss, clipped, dual)`` [B,T]: per-token loss, its derivative w.r.t. the token's log-prob
    (``d(r A)/d log pi = r A`` where the unclipped term is taken, 0 where a constant bound is), the tokens
    where the clipped term is the smaller one (verl's ``pg_clipfrac``), the tokens where the dual bound binds.
    """
    loss = np.zeros(mask.shape)
    dloss = np.zeros(mask.shape)
    clipped = np.zeros(mask.shape, dtype=bool)
    dual = np.zeros(mask.shape, dtype=bool)
    for i, t in _real(mask):
        a = float(adv[i, t])
        r = math.exp(float(logp[i, t]) - float(old_logp[i, t]))
        r_clip = min(max(r, lower), upper)
        if r_clip * a < r * a:  # the clipped term is the minimum: a constant bound times A
            objective, derivative = r_clip * a, 0.0
            clipped[i, t] = True
        else:
            objective, derivative = r * a, r * a
        if dual_c is not None and a < 0 and objective < dual_c * a:
            objective, derivative = dual_c * a, 0.0
            dual[i, t] = True
        loss[i, t], dloss[i, t] = -objective, -derivative
    return loss, dloss, clipped, dual


def ref_clip(logp, old_logp, adv, mask, *, clip_ratio_low, clip_ratio_high, clip_ratio_c=None):
    """:func:`ref_ppo_clip` with PPO's / DAPO's epsilons: bounds ``1 - eps_low`` and ``1 + eps_high``."""
    return ref_ppo_clip(
        logp, old_logp, adv, mask, lower=1.0 - clip_ratio_low, upper=1.0 + clip_ratio_high, dual_c=clip_ratio_c
    )


def ref_token_is(logp, old_logp, adv, mask):
    """Unclipped importance-sampled surrogate ``r A`` (PPO, arXiv 1707.06347, eq. 6, L^CPI); loss -r A.

    Returns ``(loss, dloss)`` [B,T]; ``d(-r A)/d log pi = -r A``.
    """
    loss = np.zeros(mask.shape)
    dloss = np.zeros(mask.shape)
    for i, t in _real(mask):
        r = math.exp(float(logp[i, t]) - float(old_logp[i, t]))
        loss[i, t] = dloss[i, t] = -r * float(adv[i, t])
    return loss, dloss


def ref_gpg_loss(logp, adv, mask):
    """GPG's policy-gradient surrogate ``log pi A`` without ratio or clip (GPG, arXiv 2504.02546, sec. 3).

    Returns ``(loss, dloss)`` [B,T]: ``-log pi A`` and ``-A``.
    """
    loss = np.zeros(mask.shape)
    dloss = np.zeros(mask.shape)
    for i, t in _real(mask):
        loss[i, t] = -float(logp[i, t]) * float(adv[i, t])
        dloss[i, t] = -float(adv[i, t])
    return loss, dloss


def ref_gspo_sequence_ratios(logp, old_logp, mask):
    """GSPO's sequence ratio ``s_i = (pi(y_i) / pi_old(y_i))^(1/|y_i|) = exp(mean_t log r_t)`` (GSPO,
    arXiv 2507.18071, sec. 4.1), [B]."""
    ratios = []
    for i in range(mask.shape[0]):
        total, count = 0.0, 0
        for t in range(mask.shape[1]):
            if mask[i, t] > 0:
                total += float(logp[i, t]) - float(old_logp[i, t])
                count += 1
        ratios.append(math.exp(total / max(count, 1)))
    return np.array(ratios)


def ref_gspo(logp, old_logp, adv, mask, *, clip_ratio_low, clip_ratio_high):
    """GSPO-token (GSPO, arXiv 2507.18071, sec. 4.3): ``s_{i,t} = sg[s_i] pi(y_t) / sg[pi(y_t)]``, objective
    ``min(s_{i,t} A_{i,t}, clip(s_{i,t}, 1 - eps_low, 1 + eps_high) A_{i,t})``.

    The value of ``s_{i,t}`` is ``s_i`` on every token; its derivative w.r.t. token t's own log-prob is
    ``s_i`` (the stop-gradients remove every other path). Returns ``(loss, dloss, clipped)`` [B,T].
    """
    s = ref_gspo_sequence_ratios(logp, old_logp, mask)
    lower, upper = 1.0 - clip_ratio_low, 1.0 + clip_ratio_high
    loss = np.zeros(mask.shape)
    dloss = np.zeros(mask.shape)
    clipped = np.zeros(mask.shape, dtype=bool)
    for i, t in _real(mask):
        a = float(adv[i, t])
        s_clip = min(max(s[i], lower), upper)
        if s_clip * a < s[i] * a:
            loss[i, t] = -s_clip * a
            clipped[i, t] = True
        else:
            loss[i, t] = dloss[i, t] = -s[i] * a
    return loss, dloss, clipped


def ref_gspo_sequence_loss(logp, old_logp, seq_adv, mask, *, clip_ratio_low, clip_ratio_high):
    """GSPO's sequence-level loss ``-(1/G) sum_i min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)``
    (GSPO, arXiv 2507.18071, sec. 4.1), a scalar; ``seq_adv`` [B]. With ``A_{i,t} = A_i`` its gradient equals
    the token form's under seq-mean-token-mean aggregation (the paper's sec. 4.3 remark)."""
    s = ref_gspo_sequence_ratios(logp, old_logp, mask)
    lower, upper = 1.0 - clip_ratio_low, 1.0 + clip_ratio_high
    total = 0.0
    for i in range(mask.shape[0]):
        a = float(seq_adv[i])
        total += min(s[i] * a, min(max(s[i], lower), upper) * a)
    return -total / mask.shape[0]


def ref_cispo(logp, old_logp, adv, mask, *, clip_ratio_low, clip_ratio_high):
    """CISPO (MiniMax-M1, arXiv 2506.13585, sec. 3.1): REINFORCE with a clipped, detached IS weight,
    objective ``sg(clip(r, 1 - eps_low, 1 + eps_high)) A log pi``.

    Returns ``(loss, dloss, clipped)`` [B,T]: ``-w A log pi``, ``-w A`` (the weight is a constant), and the
    tokens whose weight was clipped.
    """
    loss = np.zeros(mask.shape)
    dloss = np.zeros(mask.shape)
    clipped = np.zeros(mask.shape, dtype=bool)
    lower, upper = 1.0 - clip_ratio_low, 1.0 + clip_ratio_high
    for i, t in _real(mask):
        r = math.exp(float(logp[i, t]) - float(old_logp[i, t]))
        w = min(max(r, lower), upper)
        clipped[i, t] = w != r
        a = float(adv[i, t])
        loss[i, t] = -w * a * float(logp[i, t])
        dloss[i, t] = -w * a
    return loss, dloss, clipped


def ref_bapo_share_paper(ratio, adv, mask, c_low, c_high):
    """BAPO's positive contribution ``rho`` (BAPO, arXiv 2510.18927): among the tokens that keep a gradient
    under bounds [c_low, c_high] (A > 0 with r <= c_high, A < 0 with r >= c_low), the share of ``|r A|`` from
    positive-advantage tokens (1.0 when none). The paper's mechanism as its abstract and the authors' README
    state it (raising c_high admits low-probability positive tokens, raising c_low filters low-probability
    negative ones); the paper's full text was not available, so this is the library's "paper" reading."""
    pos = neg = 0.0
    for i, t in _real(mask):
        r, a = float(ratio[i, t]), float(adv[i, t])
        if a > 0 and r <= c_high:
            pos += r * a
        elif a < 0 and r >= c_low:
            neg += -r * a
    return 1.0 if pos + neg <= 0 else pos / (pos + neg)


def ref_bapo_bounds_paper(ratio, adv, mask, *, rho, a_low, b_low, a_high, b_high, step_low, step_high):
    """BAPO's adaptive bounds (arXiv 2510.18927; README of github.com/WooooDyy/BAPO): start at
    ``[a-, a+]`` and raise both bounds by one step at a time while ``rho < rho_0`` and a bound is below its
    maximum ``b-`` / ``b+``. Returns ``(c_low, c_high, rho, trace of rho)``."""
    c_low, c_high = a_low, a_high
    share = ref_bapo_share_paper(ratio, adv, mask, c_low, c_high)
    trace = [share]
    while share < rho and (c_low < b_low or c_high < b_high):
        c_low = min(c_low + step_low, b_low)
        c_high = min(c_high + step_high, b_high)
        share = ref_bapo_share_paper(ratio, adv, mask, c_low, c_high)
        trace.append(share)
    return c_low, c_high, share, trace


def ref_bapo_bounds_recipe(ratio, adv, mask, *, rho, a_low, b_low, a_high, b_high, step_low, step_high):
    """The BAPO authors' verl recipe (github.com/WooooDyy/BAPO, recipe/bapo/policy_loss.py): contributions
    ``pos = sum_{A >= 0} min(r, c_high) A``, ``neg = sum_{A < 0} max(r, c_low) |A|``, target
    ``pos / neg >= rho_0 / (1 - rho_0)``; raise c_low step by step to its maximum first, then c_high.
    Returns ``(c_low, c_high, share pos / (pos + neg), trace of the share)``."""
    target = rho / (1.0 - rho)

    def contributions(c_lo, c_hi):
        pos = neg = 0.0
        for i, t in _real(mask):
            r, a = float(ratio[i, t]), float(adv[i, t])
            if a >= 0:
                pos += min(r, c_hi) * a
            else:
                neg += -max(r, c_lo) * a
        return pos, neg

    def met(pos, neg):
        return neg <= 0 or pos / neg >= target

    c_low, c_high = a_low, a_high
    pos, neg = contributions(c_low, c_high)
    trace = [pos / (pos + neg)]
    while not met(pos, neg) and c_low < b_low:
        c_low = min(c_low + step_low, b_low)
        pos, neg = contributions(c_low, c_high)
        trace.append(pos / (pos + neg))
    while not met(pos, neg) and c_high < b_high:
        c_high = min(c_high + step_high, b_high)
        pos, neg = contributions(c_low, c_high)
        trace.append(pos / (pos + neg))
    return c_low, c_high, pos / (pos + neg), trace


def ref_bapo(
    logp,
    old_logp,
    adv,
    mask,
    *,
    rule="paper",
    rho=0.5,
    ratio_low_start=0.6,
    ratio_low_max=0.9,
    ratio_high_start=1.2,
    ratio_high_max=3.0,
    ratio_low_step=0.05,
    ratio_high_step=0.05,
    clip_ratio_c=None,
):
    """BAPO: the bounds of :func:`ref_bapo_bounds_paper` / :func:`ref_bapo_bounds_recipe`, then the PPO
    clipped loss with them as explicit ratio bounds (:func:`ref_ppo_clip`).

    Returns ``(loss, dloss, clipped, dual, (c_low, c_high, share, trace))``.
    """
    ratio = np.exp(np.asarray(logp, dtype=np.float64) - np.asarray(old_logp, dtype=np.float64))
    search = ref_bapo_bounds_paper if rule == "paper" else ref_bapo_bounds_recipe
    bounds = search(
        ratio,
        adv,
        mask,
        rho=rho,
        a_low=ratio_low_start,
        b_low=ratio_low_max,
        a_high=ratio_high_start,
        b_high=ratio_high_max,
        step_low=ratio_low_step,
        step_high=ratio_high_step,
    )
    loss, dloss, clipped, dual = ref_ppo_clip(
        logp, old_logp, adv, mask, lower=bounds[0], upper=bounds[1], dual_c=clip_ratio_c
    )
    return loss, dloss, clipped, dual, bounds


def ref_aggregate(loss, mask, mode, *, norm_len=None, num_tokens=None, num_seqs=None):
    """Loss aggregation as a loop, the conventions of verl 0.9.1's ``agg_loss``:

    - token-mean: sum over the batch's tokens / their number (DAPO's token-level loss, arXiv 2503.14476, sec. 3.3);
    - seq-mean-token-mean: per-sequence token mean, then the mean over sequences (GRPO, arXiv 2402.03300, eq. 3);
    - seq-mean-token-sum: per-sequence token sum, then the mean over sequences;
    - seq-mean-token-sum-norm: that divided by a constant length (default T) (Dr. GRPO, arXiv 2503.20783, sec. 3).

    Sequences without real tokens are left out of the sequence count; ``num_tokens`` / ``num_seqs``
    replace the counts (global counts of a mini-batch).
    """
    if mode == "token-mean":
        total, count = 0.0, 0
        for i, t in _real(mask):
            total += float(loss[i, t])
            count += 1
        return total / (num_tokens if num_tokens is not None else count)
    per_seq = []
    for i in range(mask.shape[0]):
        total, count = 0.0, 0
        for t in range(mask.shape[1]):
            if mask[i, t] > 0:
                total += float(loss[i, t])
                count += 1
        if count:
            per_seq.append(total / count if mode == "seq-mean-token-mean" else total)
    value = sum(per_seq) / (num_seqs if num_seqs is not None else len(per_seq))
    if mode == "seq-mean-token-sum-norm":
        value /= norm_len if norm_len is not None else mask.shape[1]
    return value


def ref_agg_weights(mask, mode, *, norm_len=None, num_tokens=None, num_seqs=None):
    """``d aggregate / d loss[i, t]`` of :func:`ref_aggregate` [B,T] (every mode is linear in the loss)."""
    lengths = [int(sum(1 for t in range(mask.shape[1]) if mask[i, t] > 0)) for i in range(mask.shape[0])]
    n_tok = num_tokens if num_tokens is not None else sum(lengths)
    n_seq = num_seqs if num_seqs is not None else sum(1 for n in lengths if n > 0)
    norm = norm_len if norm_len is not None else mask.shape[1]
    weights = np.zeros(mask.shape)
    for i, t in _real(mask):
        weights[i, t] = {
            "token-mean": 1.0 / n_tok,
            "seq-mean-token-mean": 1.0 / (n_seq * lengths[i]),
            "seq-mean-token-sum": 1.0 / n_seq,
            "seq-mean-token-sum-norm": 1.0 / (n_seq * norm),
        }[mode]
    return weights


# -- batches --------------------------------------------------------------------------------------------
@dataclass
class Batch:
    """float64 arrays whose values are float32-representable: logp, old_logp, adv, mask [B,T]."""

    logp: np.ndarray
    old_logp: np.ndarray
    adv: np.ndarray
    mask: np.ndarray

    def tensors(self):
        """``(logp leaf with grad, old_logp, adv, mask)`` as float64 tensors."""
        logp = torch.tensor(self.logp, dtype=torch.float64, requires_grad=True)
        return logp, *(torch.tensor(x, dtype=torch.float64) for x in (self.old_logp, self.adv, self.mask))


def _f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).astype(np.float64)


LENGTHS = (9, 5, 1, 3, 9, 6, 2, 7, 4, 8)


def token_batch(seed: int, *, spread: float = 1.6) -> Batch:
    """10 responses of lengths 1..9 (T = 9), log-ratios uniform in [-spread, spread] (ratios 0.2..5),
    advantages of one sign per response (alternating) with per-token magnitudes, one zero advantage."""
    rng = np.random.default_rng(seed)
    batch, length = len(LENGTHS), max(LENGTHS)
    mask = (np.arange(length)[None, :] < np.array(LENGTHS)[:, None]).astype(np.float64)
    old_logp = -rng.uniform(2.0, 6.0, (batch, length))
    logp = old_logp + rng.uniform(-spread, spread, (batch, length))
    sign = np.where(np.arange(batch) % 2 == 0, 1.0, -1.0)
    adv = sign[:, None] * rng.uniform(0.2, 2.0, (batch, length))
    adv[3, 1] = 0.0
    return Batch(_f32(logp), _f32(old_logp), _f32(adv), mask)


def gspo_batch(seed: int, clip_ratio_low: float, clip_ratio_high: float, *, token_adv: bool = False) -> Batch:
    """Sequences whose mean log-ratio sits far above, just above, inside, just below and far below GSPO's
    range, with both signs of the advantage on each side (A constant per sequence unless ``token_adv``)."""
    rng = np.random.default_rng(seed)
    hi, lo = math.log1p(clip_ratio_high), math.log1p(-clip_ratio_low)
    # (mean log-ratio, advantage sign) per row: clipped above (A > 0), clipped below (A < 0), outside but
    # unclipped (A > 0 below the range, A < 0 above it), inside; the 3rd row has one token
    rows = [
        (3 * hi, 1.0),
        (3 * lo, -1.0),
        (1.3 * hi, 1.0),
        (2 * lo, 1.0),
        (0.3 * hi, 1.0),
        (2 * hi, -1.0),
        (0.5 * lo, -1.0),
        (1.4 * lo, -1.0),
        (0.6 * hi, -1.0),
        (4 * hi, 1.0),
    ]
    batch, length = len(LENGTHS), max(LENGTHS)
    mask = (np.arange(length)[None, :] < np.array(LENGTHS)[:, None]).astype(np.float64)
    old_logp = -rng.uniform(1.0, 4.0, (batch, length))
    delta = np.zeros((batch, length))
    for i, (target, _) in enumerate(rows):
        noise = rng.normal(0.0, 0.05, LENGTHS[i])
        delta[i, : LENGTHS[i]] = target + noise - noise.mean()
    sign = np.array([s for _, s in rows])
    magnitude = rng.uniform(0.2, 2.0, (batch, length)) if token_adv else rng.uniform(0.2, 2.0, (batch, 1))
    adv = sign[:, None] * np.broadcast_to(magnitude, (batch, length))
    return Batch(_f32(old_logp + delta), _f32(old_logp), _f32(adv), mask)


def bapo_batch(seed: int) -> Batch:
    """Negative-advantage tokens dominate at the start bounds [0.6, 1.2]: many low-ratio negative tokens
    (filtered out as c_low rises) and high-ratio positive tokens (admitted as c_high rises). Ratios sit
    between the 0.05 grid points of the bound search, so no ratio is within 0.01 of a visited bound."""
    rng = np.random.default_rng(seed)
    batch, length = len(LENGTHS), max(LENGTHS)
    mask = (np.arange(length)[None, :] < np.array(LENGTHS)[:, None]).astype(np.float64)
    sign = np.where(np.arange(batch) % 2 == 0, 1.0, -1.0)
    # positive rows: ratios on 1.0 .. 2.2, negative rows: ratios on 0.4 .. 1.2, off the 0.05 grid
    grid_pos = rng.integers(20, 44, (batch, length)) * 0.05
    grid_neg = rng.integers(8, 24, (batch, length)) * 0.05
    grid = np.where(sign[:, None] > 0, grid_pos, grid_neg) + rng.uniform(0.01, 0.04, (batch, length))
    old_logp = -rng.uniform(1.0, 4.0, (batch, length))
    adv = sign[:, None] * rng.uniform(0.5, 1.5, (batch, length)) * np.where(sign[:, None] > 0, 0.8, 1.0)
    return Batch(_f32(old_logp + np.log(grid)), _f32(old_logp), _f32(adv), mask)


# -- helpers ---------------------------------------------------------------------------------------------
def preset(name: str) -> tuple[str, dict]:
    """(objective name, parameters) of the conf/objective preset ``name``."""
    node = yaml.safe_load((CONF / f"{name}.yaml").read_text())
    node.pop("defaults", None)
    return node.pop("name"), node


def run_objective(objective: str, params: dict, batch: Batch, mode: str, *, norm_len=None):
    """The library objective reduced by the library aggregation; ``(output, loss, d loss / d logp)``."""
    logp, old_logp, adv, mask = batch.tensors()
    out = OBJECTIVES.get(objective)(PolicyInputs(logp, old_logp, adv, mask), **params)
    loss = LOSS_AGGS.get(mode)(out.loss_mat, mask, norm_len=norm_len)
    loss.backward()
    return out, float(loss.detach()), logp.grad.numpy()


def assert_matches(ref_loss, ref_dloss, batch: Batch, out, loss, grad, mode, *, norm_len=None):
    """Per-token loss on real tokens, aggregated loss and gradient equal the reference's."""
    mask = batch.mask > 0
    np.testing.assert_allclose(out.loss_mat.detach().double().numpy()[mask], ref_loss[mask], rtol=RTOL, atol=ATOL)
    assert loss == pytest.approx(ref_aggregate(ref_loss, batch.mask, mode, norm_len=norm_len), rel=RTOL, abs=ATOL)
    weights = ref_agg_weights(batch.mask, mode, norm_len=norm_len)
    np.testing.assert_allclose(grad, weights * ref_dloss, rtol=RTOL, atol=ATOL)
    assert np.abs(grad).sum() > 0


def ratio_margin(batch: Batch, bounds) -> float:
    """Smallest |r - b| over real tokens and the given ratio bounds."""
    r = np.exp(batch.logp - batch.old_logp)[batch.mask > 0]
    return min(float(np.abs(r - b).min()) for b in bounds)


# -- clip: PPO, DAPO clip-higher, dual clip -----------------------------------------------------------
CLIP_PRESETS = {
    "clip": preset("clip"),
    "dapo_clip": preset("dapo_clip"),
    "dual_clip": preset("dual_clip"),
    "asymmetric_dual": ("clip", {"clip_ratio_low": 0.1, "clip_ratio_high": 0.35, "clip_ratio_c": 1.8}),
}


def test_presets_are_the_documented_methods():
    """The presets compared below are PPO (0.2 / 0.2), DAPO clip-higher (0.2 / 0.28), dual clip c = 3."""
    assert CLIP_PRESETS["clip"][1] == {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2}
    assert CLIP_PRESETS["dapo_clip"][1] == {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}
    assert CLIP_PRESETS["dual_clip"][1] == {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0}
    assert preset("cispo") == ("cispo", {"clip_ratio_low": 1.0, "clip_ratio_high": 0.28})
    assert preset("gspo") == ("gspo", {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4})


def _clip_case_acts(batch: Batch, params: dict) -> None:
    lower, upper = 1 - params["clip_ratio_low"], 1 + params["clip_ratio_high"]
    c = params.get("clip_ratio_c")
    r = np.exp(batch.logp - batch.old_logp)
    real = batch.mask > 0
    pos, neg = real & (batch.adv > 0), real & (batch.adv < 0)
    assert (pos & (r > upper)).any() and (neg & (r < lower)).any()  # clipped on both sides
    assert (pos & (r < lower)).any() and (neg & (r > upper)).any()  # outside, but the min keeps r A
    assert (real & (r > lower) & (r < upper)).any()
    if c is not None:
        assert (neg & (r > c)).any() and (neg & (r > upper) & (r < c)).any()  # dual clip binds, and not always
    assert ratio_margin(batch, [lower, upper] + ([c] if c else [])) > MARGIN


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(CLIP_PRESETS))
def test_clip_matches_reference(case, mode):
    """PPO / DAPO / dual clip: per-token loss, aggregated loss, gradient w.r.t. logp, clip metrics."""
    objective, params = CLIP_PRESETS[case]
    batch = token_batch(0)
    _clip_case_acts(batch, params)
    out, loss, grad = run_objective(objective, params, batch, mode, norm_len=7.0)
    ref_loss, ref_dloss, clipped, dual = ref_clip(batch.logp, batch.old_logp, batch.adv, batch.mask, **params)
    assert_matches(ref_loss, ref_dloss, batch, out, loss, grad, mode, norm_len=7.0)
    real = batch.mask > 0
    assert 0 < clipped[real].mean() < 1
    assert out.metrics[metric_names.PG_CLIPFRAC] == pytest.approx(clipped[real].mean(), abs=1e-7)
    assert out.metrics[metric_names.PG_CLIPFRAC_LOWER] == pytest.approx(dual[real].mean(), abs=1e-7)
    assert (dual[real].mean() > 0) == ("clip_ratio_c" in params)


def test_token_is_matches_reference():
    batch = token_batch(1)
    for mode in MODES:
        out, loss, grad = run_objective("token_is", {}, batch, mode)
        ref_loss, ref_dloss = ref_token_is(batch.logp, batch.old_logp, batch.adv, batch.mask)
        assert_matches(ref_loss, ref_dloss, batch, out, loss, grad, mode)
    r = np.exp(batch.logp - batch.old_logp)[batch.mask > 0]
    assert r.min() < 0.5 and r.max() > 2.0  # far outside any clip range: nothing is clipped


def test_gpg_matches_reference():
    batch = token_batch(2)
    for mode in MODES:
        out, loss, grad = run_objective("gpg", {}, batch, mode)
        ref_loss, ref_dloss = ref_gpg_loss(batch.logp, batch.adv, batch.mask)
        assert_matches(ref_loss, ref_dloss, batch, out, loss, grad, mode)


# -- GSPO ------------------------------------------------------------------------------------------------
GSPO_CASES = {"preset": preset("gspo")[1], "wide": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}}


def _gspo_case_acts(batch: Batch, params: dict) -> None:
    s = ref_gspo_sequence_ratios(batch.logp, batch.old_logp, batch.mask)
    lower, upper = 1 - params["clip_ratio_low"], 1 + params["clip_ratio_high"]
    sign = np.sign(batch.adv[:, 0])
    assert ((sign > 0) & (s > upper)).any() and ((sign < 0) & (s < lower)).any()
    assert ((sign > 0) & (s < lower)).any() and ((sign < 0) & (s > upper)).any()
    assert ((s > lower) & (s < upper)).any()
    assert min(abs(s - lower).min(), abs(s - upper).min()) > GSPO_MARGIN * (
        1 if params["clip_ratio_low"] < 0.01 else 10
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(GSPO_CASES))
@pytest.mark.parametrize("token_adv", [False, True])
def test_gspo_matches_reference(case, mode, token_adv):
    """GSPO-token: every token carries its sequence's ratio s_i, clipped as a whole sequence."""
    params = GSPO_CASES[case]
    batch = gspo_batch(3, **params, token_adv=token_adv)
    _gspo_case_acts(batch, params)
    out, loss, grad = run_objective("gspo", params, batch, mode, norm_len=6.0)
    ref_loss, ref_dloss, clipped = ref_gspo(batch.logp, batch.old_logp, batch.adv, batch.mask, **params)
    assert_matches(ref_loss, ref_dloss, batch, out, loss, grad, mode, norm_len=6.0)
    real = batch.mask > 0
    assert 0 < clipped[real].mean() < 1
    assert out.metrics[metric_names.PG_CLIPFRAC] == pytest.approx(clipped[real].mean(), abs=1e-7)


@pytest.mark.parametrize("case", sorted(GSPO_CASES))
def test_gspo_gradient_is_the_sequence_objectives(case):
    """With A constant per sequence and seq-mean-token-mean aggregation, GSPO-token's gradient is the
    gradient of GSPO's sequence-level objective (finite differences of the reference, float64)."""
    params = GSPO_CASES[case]
    batch = gspo_batch(4, **params)
    _gspo_case_acts(batch, params)
    _, loss, grad = run_objective("gspo", params, batch, "seq-mean-token-mean")
    seq_adv = batch.adv[:, 0]
    value = ref_gspo_sequence_loss(batch.logp, batch.old_logp, seq_adv, batch.mask, **params)
    assert loss == pytest.approx(value, rel=RTOL, abs=ATOL)
    step = 1e-7
    fd = np.zeros(batch.mask.shape)
    for i, t in _real(batch.mask):
        up, down = batch.logp.copy(), batch.logp.copy()
        up[i, t] += step
        down[i, t] -= step
        fd[i, t] = (
            ref_gspo_sequence_loss(up, batch.old_logp, seq_adv, batch.mask, **params)
            - ref_gspo_sequence_loss(down, batch.old_logp, seq_adv, batch.mask, **params)
        ) / (2 * step)
    np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-7)
    assert (np.abs(fd[batch.mask > 0]) > 0).any() and (fd[batch.mask > 0] == 0).any()


# -- CISPO ----------------------------------------------------------------------------------------------
CISPO_CASES = {"preset": preset("cispo")[1], "two_sided": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(CISPO_CASES))
def test_cispo_matches_reference(case, mode):
    """CISPO: every token keeps the gradient -w A of log pi, with w the clipped, detached ratio."""
    params = CISPO_CASES[case]
    batch = token_batch(5)
    lower, upper = 1 - params["clip_ratio_low"], 1 + params["clip_ratio_high"]
    r = np.exp(batch.logp - batch.old_logp)
    real = batch.mask > 0
    assert ratio_margin(batch, [lower, upper]) > MARGIN
    assert (real & (r > upper) & (batch.adv > 0)).any() and (real & (r > upper) & (batch.adv < 0)).any()
    if lower > 0:
        assert (real & (r < lower)).any()
    out, loss, grad = run_objective("cispo", params, batch, mode, norm_len=7.0)
    ref_loss, ref_dloss, clipped = ref_cispo(batch.logp, batch.old_logp, batch.adv, batch.mask, **params)
    assert_matches(ref_loss, ref_dloss, batch, out, loss, grad, mode, norm_len=7.0)
    assert 0 < clipped[real].mean() < 1
    assert out.metrics[metric_names.PG_CLIPFRAC] == pytest.approx(clipped[real].mean(), abs=1e-7)
    assert (np.abs(grad[real & clipped]) > 0).all()  # clipped tokens keep their gradient (unlike PPO)


# -- BAPO -----------------------------------------------------------------------------------------------
# (rule, parameters, where the search ends: "capped" = on both maxima below rho_0, "high" = c_high below
# its maximum, "both" = both bounds below their maxima)
BAPO_CASES = {
    "paper_interior": ("paper", {"rho": 0.5}, "high"),
    "paper_early": ("paper", {"rho": 0.25}, "both"),
    "paper_capped": ("paper", {"rho": 0.5, "ratio_low_max": 0.7, "ratio_high_max": 1.3}, "capped"),
    "recipe_interior": ("recipe", {"rho": 0.5}, "high"),
    "recipe_capped": ("recipe", {"rho": 0.5, "ratio_low_max": 0.85, "ratio_high_max": 1.3}, "capped"),
    "paper_dual": ("paper", {"rho": 0.45, "clip_ratio_c": 1.1}, "high"),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(BAPO_CASES))
def test_bapo_matches_reference(case, mode):
    """BAPO: the bound search (both rules) moves off [0.6, 1.2] and the clipped loss uses its bounds."""
    rule, params, end = BAPO_CASES[case]
    params = {"rule": rule, **params}
    batch = bapo_batch(6)
    out, loss, grad = run_objective("bapo", params, batch, mode, norm_len=7.0)
    ref_loss, ref_dloss, clipped, dual, (c_low, c_high, share, trace) = ref_bapo(
        batch.logp, batch.old_logp, batch.adv, batch.mask, **params
    )
    assert_matches(ref_loss, ref_dloss, batch, out, loss, grad, mode, norm_len=7.0)
    assert out.metrics["bapo/clip_low"] == pytest.approx(c_low, abs=1e-9)
    assert out.metrics["bapo/clip_high"] == pytest.approx(c_high, abs=1e-9)
    assert out.metrics["bapo/pos_share"] == pytest.approx(share, abs=1e-6)
    # the search acts: it starts below rho_0, moves, and ends where the case says
    rho = params["rho"]
    assert trace[0] < rho and len(trace) >= 3
    assert min(abs(s - rho) for s in trace) > 1e-4  # float32 shares cannot take another branch
    low_max, high_max = params.get("ratio_low_max", 0.9), params.get("ratio_high_max", 3.0)
    if end == "capped":
        assert share < rho and c_low == pytest.approx(low_max) and c_high == pytest.approx(high_max)
    else:
        assert share >= rho and c_high < high_max - 1e-9
        assert (c_low < low_max - 1e-9) == (end == "both")
    if rule == "recipe" and end != "capped":
        assert c_low == pytest.approx(low_max) and c_high > 1.2  # c_low first, then c_high
    real = batch.mask > 0
    assert 0 < clipped[real].mean() < 1
    assert ratio_margin(batch, [c_low, c_high, 1.1]) > MARGIN
    assert (dual[real].any()) == ("clip_ratio_c" in params)


def test_bapo_rules_differ_on_this_batch():
    """The two readings of the bound rule pick different bounds here (so each test above pins its own)."""
    batch = bapo_batch(6)
    paper = ref_bapo(batch.logp, batch.old_logp, batch.adv, batch.mask, rule="paper")[4]
    recipe = ref_bapo(batch.logp, batch.old_logp, batch.adv, batch.mask, rule="recipe")[4]
    assert (paper[0], paper[1]) != pytest.approx((recipe[0], recipe[1]))


# -- the references' derivatives -------------------------------------------------------------------------
def test_reference_derivatives_match_finite_differences():
    """Each reference's analytic d loss / d logp equals central differences of its own value (float64);
    each token's loss depends on its own log-prob only, so one perturbation of all tokens suffices."""
    batch = token_batch(0)
    step = 1e-6
    up, down = batch.logp + step, batch.logp - step
    refs = {
        "clip": lambda lp: ref_clip(lp, batch.old_logp, batch.adv, batch.mask, **CLIP_PRESETS["dapo_clip"][1]),
        "dual": lambda lp: ref_clip(lp, batch.old_logp, batch.adv, batch.mask, **CLIP_PRESETS["dual_clip"][1]),
        "token_is": lambda lp: ref_token_is(lp, batch.old_logp, batch.adv, batch.mask),
        "gpg": lambda lp: ref_gpg_loss(lp, batch.adv, batch.mask),
        "bapo": lambda lp: ref_ppo_clip(lp, batch.old_logp, batch.adv, batch.mask, lower=0.75, upper=1.65, dual_c=2.5),
    }
    for name, ref in refs.items():
        fd = (ref(up)[0] - ref(down)[0]) / (2 * step)
        np.testing.assert_allclose(ref(batch.logp)[1], fd, rtol=1e-6, atol=1e-8, err_msg=name)


# -- loss aggregation ------------------------------------------------------------------------------------
def _agg_case(seed: int):
    """Loss matrix and mask: variable lengths, holes inside responses, one empty row, T = 11."""
    rng = np.random.default_rng(seed)
    lengths = np.array([11, 3, 0, 7, 1, 9, 5, 11, 2])
    mask = (np.arange(11)[None, :] < lengths[:, None]).astype(np.float64)
    mask[0, 4] = mask[3, 2] = mask[5, 1] = mask[5, 6] = 0.0  # observation tokens inside responses
    return rng.normal(size=mask.shape), mask


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "counts", [{}, {"num_tokens": 80.0, "num_seqs": 12.0}, {"norm_len": 16.0}], ids=["local", "global", "norm"]
)
def test_aggregation_matches_loop(mode, counts):
    """Each mode's value and gradient w.r.t. the loss matrix equal the loop reference."""
    loss_np, mask_np = _agg_case(7)
    loss = torch.tensor(loss_np, requires_grad=True)
    mask = torch.tensor(mask_np)
    value = LOSS_AGGS.get(mode)(loss, mask, **counts)
    value.backward()
    assert float(value.detach()) == pytest.approx(ref_aggregate(loss_np, mask_np, mode, **counts), rel=1e-12, abs=1e-14)
    np.testing.assert_allclose(loss.grad.numpy(), ref_agg_weights(mask_np, mode, **counts), rtol=1e-12, atol=0)


def test_aggregation_reference_weights_are_its_derivative():
    """``ref_agg_weights`` is the derivative of ``ref_aggregate`` (both linear), and the modes differ here."""
    loss, mask = _agg_case(8)
    values = {}
    for mode in MODES:
        weights = ref_agg_weights(mask, mode)
        assert ref_aggregate(loss, mask, mode) == pytest.approx(float((weights * loss).sum()), rel=1e-12)
        values[mode] = ref_aggregate(loss, mask, mode)
    assert len({round(v, 9) for v in values.values()}) == len(MODES)
