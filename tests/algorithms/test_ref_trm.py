"""TRM sequence masks (runners/algorithms/trm.py) through the trainer's loss path against references
written here from the paper (TRM, arXiv 2512.23075) and the formula sheet, in float64 loops.

Every registered TRM mask (``trm_max``, ``trm_avg``, ``trm_max_avg`` from the stored sparse rollout
distribution, ``trm_max_k2``, ``trm_avg_k3``, ``trm_max_avg_sample`` from the sampled tokens, ``ln_trm``,
``ser``) is run by ``runners.algorithms.policy_loss.PolicyLoss`` (the function both backends call per
micro-batch) with a Token-IS or PPO-clip objective, and compared with:

- the per-token divergence and the per-sequence score of the reference (``ref_*`` below: eq. 51
  over the stored support plus one rest bin; k2 / k3 of appendix B; W~ of eq. 76-77; SER of eq. 82);
- the accept/reject decision (every threshold inclusive, ``keep iff score <= threshold``);
- the masked loss of eq. 50 (rejected sequences add zero, the denominator stays the whole batch) and
  its gradient w.r.t. the current logits (exact masks) or log-probs (sample masks);
- the mask's monitoring metrics (acceptance rate overall and by length, max / mean KL, PPL gap).

The batches make each mask act: some sequences rejected and some kept, both signs of the log-ratio
and of the advantage, PPO clipping active on both sides, variable lengths with wild values on the
padding, V = 300 against a stored top-6 support (the rest bin carries a large share of the mass and
changes decisions), and for Max&Avg each criterion rejecting a sequence the other one keeps.
The reference functions (``ref_*``) and batch builders are reused by tests/verl/test_ref_trm_verl.py.

Run: ``pytest tests/algorithms/test_ref_trm.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pytest
import torch

from runners.algorithms import MASKS
from runners.algorithms.method import Method
from runners.algorithms.policy_loss import PolicyLoss
from runners.algorithms.trm import ln_trm_scores
from runners.algorithms.types import PolicyInputs

EXACT = ("trm_max", "trm_avg", "trm_max_avg")
SAMPLE = ("trm_max_k2", "trm_avg_k3", "trm_max_avg_sample", "ln_trm", "ser")
CLIP = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}
LENGTH_EDGES = (0, 3, 6, 9)
# thresholds inside the spread of the batches below (test_cases_act checks the spread and margins)
MASK_PARAMS = {
    "trm_max": {"delta": 0.1, "top_k": 6},
    "trm_avg": {"delta_avg": 0.045, "top_k": 6},
    "trm_max_avg": {"delta": 0.2, "delta_avg": 0.045, "top_k": 6},
    "trm_max_k2": {"delta": 0.08},
    "trm_avg_k3": {"delta_avg": 0.02},
    "trm_max_avg_sample": {"delta": 0.16, "delta_avg": 0.022},
    "ln_trm": {"delta": 1e-4, "delta_w": 0.155},
    "ser": {"delta_ser": 0.15},
}
# case id -> (mask, parameters): every mask, and LN-TRM with delta large enough that w_t reaches its cap 1
CASES = {name: (name, params) for name, params in MASK_PARAMS.items()}
CASES["ln_trm_capped"] = ("ln_trm", {"delta": 0.5, "delta_w": 0.155})
# the objective is evaluated in float32 by design (runners/algorithms/objectives.py): a log-prob of
# magnitude <= 12 rounds to <= 1e-6 absolute, so each ratio is off by <= 1e-6 relative and sums of
# such terms of both signs by a few 1e-7 of their scale (observed <= 7e-7 on these batches)
OBJ_RTOL, OBJ_ATOL = 5e-6, 1e-8
GRAD_ATOL = 2e-6  # times the largest reference gradient entry
# exact KL: float64 on both sides
KL_RTOL = 1e-9


# -- batches ------------------------------------------------------------------------------------
@dataclass
class Case:
    """A float64 batch (numpy, [B,T] / [B,T,V] / [B,T,K]); ``logits`` is None for a sample-based batch."""

    old_logp: np.ndarray  # log-prob of the sampled token under the policy the ratio is anchored to
    rollout_logp: np.ndarray  # ... under the rollout (sampling) policy: the sample masks' reference
    advantages: np.ndarray
    mask: np.ndarray
    logp: np.ndarray  # current log-prob of the sampled token
    logits: np.ndarray | None = None  # current logits [B,T,V]
    responses: np.ndarray | None = None  # sampled ids [B,T]
    topk_index: np.ndarray | None = None  # stored support [B,T,K+1] (last slot: the sampled id or padding)
    topk_logp: np.ndarray | None = None  # rollout log-probs on it (-inf: padding slot)

    @property
    def lengths(self) -> list[int]:
        return [int(n) for n in self.mask.sum(-1)]


def _log_softmax(x: np.ndarray) -> np.ndarray:
    top = x.max(-1, keepdims=True)
    return x - top - np.log(np.exp(x - top).sum(-1, keepdims=True))


def exact_case(seed: int = 0, *, V: int = 300, K: int = 6) -> Case:
    """Ten responses of lengths 1..8 over V = 300, the rollout's top-K support plus the sampled id.

    Sequences drift from the rollout policy in three patterns: calm (every token a little), spike
    (one token far, the rest calm: high max, low mean) and uniform (every token moderately: lower
    max, higher mean). Padding positions drift far, so reading them would change every decision.
    """
    rng = np.random.default_rng(seed)
    lengths = [8, 8, 8, 8, 7, 6, 5, 4, 1, 3]
    kinds = ["calm", "spike", "uniform", "spike", "uniform", "calm", "uniform", "spike", "calm", "uniform"]
    B, T = len(lengths), max(lengths)
    roll_logits = 2.5 * rng.standard_normal((B, T, V))
    drift = np.full((B, T), 3.0)  # padding
    for i, (n, kind) in enumerate(zip(lengths, kinds)):
        drift[i, :n] = {"calm": 0.05, "spike": 0.05, "uniform": 0.45}[kind]
        if kind == "spike":
            drift[i, rng.integers(0, n)] = 1.0
    logits = roll_logits + drift[..., None] * rng.standard_normal((B, T, V))
    roll_lp = _log_softmax(roll_logits)
    responses = np.zeros((B, T), dtype=np.int64)
    for i in range(B):
        for t in range(T):
            responses[i, t] = rng.choice(V, p=np.exp(roll_lp[i, t]) / np.exp(roll_lp[i, t]).sum())
    order = np.argsort(-roll_lp, axis=-1)[..., :K]
    index = np.zeros((B, T, K + 1), dtype=np.int64)
    index[..., :K] = order
    topk_logp = np.full((B, T, K + 1), -np.inf)
    topk_logp[..., :K] = np.take_along_axis(roll_lp, order, -1)
    outside = (order != responses[..., None]).all(-1)  # the sampled id joins the support
    index[..., K] = np.where(outside, responses, 0)
    topk_logp[..., K] = np.where(outside, np.take_along_axis(roll_lp, responses[..., None], -1)[..., 0], -np.inf)
    old_logp = np.take_along_axis(roll_lp, responses[..., None], -1)[..., 0]
    mask = (np.arange(T)[None, :] < np.array(lengths)[:, None]).astype(np.float64)
    sign = np.array([1, -1, -1, 1, 1, -1, 1, -1, 1, -1], dtype=np.float64)
    adv = sign[:, None] * (0.5 + rng.random((B, 1))) + 0.1 * rng.standard_normal((B, T))
    return Case(
        old_logp=old_logp,
        rollout_logp=old_logp,
        advantages=adv,
        mask=mask,
        logp=np.take_along_axis(_log_softmax(logits), responses[..., None], -1)[..., 0],
        logits=logits,
        responses=responses,
        topk_index=index,
        topk_logp=topk_logp,
    )


def sample_case(seed: int = 0) -> Case:
    """Twelve responses of lengths 1..8 with chosen log-ratios ``log r = logp - rollout_logp``.

    Patterns: calm, a positive or a negative spike early or on the last token (LN-TRM gives the
    last token weight 0), and uniform drift of either sign. The rollout log-probs differ from
    ``old_logp`` (a stale rollout), padding log-ratios are +-4.
    """
    rng = np.random.default_rng(seed)
    lengths = [8, 8, 8, 8, 8, 7, 6, 5, 4, 1, 3, 8]
    spikes = {1: (0, 0.55), 2: (0, -0.55), 3: (-1, 0.9), 4: (-1, -0.6), 7: (1, 0.35), 10: (0, -0.45)}
    uniform = {5: 0.2, 6: -0.25, 9: 0.17, 11: -0.16}
    B, T = len(lengths), max(lengths)
    log_ratio = 0.03 * rng.standard_normal((B, T))
    for i, (pos, value) in spikes.items():
        log_ratio[i, pos % lengths[i]] = value
    for i, scale in uniform.items():
        log_ratio[i, : lengths[i]] = scale * (1 + 0.3 * rng.standard_normal(lengths[i]))
    mask = (np.arange(T)[None, :] < np.array(lengths)[:, None]).astype(np.float64)
    log_ratio = np.where(mask > 0, log_ratio, 4.0 * np.sign(rng.standard_normal((B, T))))
    rollout_logp = -0.3 - 3.0 * rng.random((B, T))
    old_logp = rollout_logp + 0.05 * rng.standard_normal((B, T))
    sign = np.array([1, -1, 1, -1, 1, 1, -1, -1, 1, -1, 1, -1], dtype=np.float64)
    adv = sign[:, None] * (0.5 + rng.random((B, 1))) + 0.1 * rng.standard_normal((B, T))
    return Case(
        old_logp=old_logp,
        rollout_logp=rollout_logp,
        advantages=adv,
        mask=mask,
        logp=rollout_logp + log_ratio,
    )


def case_for(mask_name: str) -> Case:
    return exact_case() if mask_name in EXACT else sample_case()


# -- references ---------------------------------------------------------------------------------
def ref_exact_token_kl(logits: np.ndarray, index: np.ndarray, roll_logp: np.ndarray) -> float:
    """Exact KL(pi_roll || pi_theta) of one position from a stored sparse rollout distribution.

    TRM, arXiv 2512.23075, eq. 51: ``sum_v pi_roll(v) (log pi_roll(v) - log pi_theta(v))``. The paper
    sums over the whole vocabulary (full logits stored); the stored support S here holds the kept
    ids' true rollout log-probs, so the sum runs over S plus one rest bin for all other ids:
    ``+ p_rest log(p_rest / q_rest)``, ``p_rest = 1 - sum_S pi_roll`` (only S is stored),
    ``q_rest = sum_{v not in S} pi_theta(v)``, i.e. eq. 51 applied to both distributions
    coarse-grained to (S, rest): a lower bound of the full KL, equal to it when S is the vocabulary. ``logits`` [V] current,
    ``index`` / ``roll_logp`` [K] (``-inf`` marks an unused slot).
    """
    top = max(float(x) for x in logits)
    lse = top + math.log(sum(math.exp(float(x) - top) for x in logits))
    kept = {int(v) for v, lp in zip(index, roll_logp) if lp > -math.inf}
    kl, p_kept = 0.0, 0.0
    for v, lp in zip(index, roll_logp):
        if lp == -math.inf:
            continue
        kl += math.exp(lp) * (lp - (float(logits[int(v)]) - lse))
        p_kept += math.exp(lp)
    if len(kept) < len(logits):  # the rest bin: every id outside the support
        p_rest = 1.0 - p_kept
        q_rest = sum(math.exp(float(x) - lse) for v, x in enumerate(logits) if v not in kept)
        kl += p_rest * (math.log(p_rest) - math.log(q_rest))
    return kl


def ref_kept_divergences(logq, roll_logp, *, rest_bin: bool = True) -> tuple[float, float]:
    """(KL, TV) of one position from pi_theta's log-probs at the stored ids only (what a backend without
    the logits has): eq. 51 over the support plus the rest bin, whose pi_theta mass is 1 - sum_S pi_theta
    (``ref_exact_token_kl`` sums it over the ids outside S instead), and TV = (sum_S |p - q| + |p_rest -
    q_rest|) / 2 (eq. 8) of the same coarse-grained pair. Without ``rest_bin`` the KL is the partial sum
    over S, of any sign. ``logq`` / ``roll_logp`` [K]; ``-inf`` in ``roll_logp`` marks an unused slot."""
    kl = tv = p_kept = q_kept = 0.0
    for lq, lp in zip(logq, roll_logp):
        if lp == -math.inf:
            continue
        p, q = math.exp(float(lp)), math.exp(float(lq))
        kl += p * (float(lp) - float(lq))
        tv += abs(p - q)
        p_kept, q_kept = p_kept + p, q_kept + q
    p_rest, q_rest = max(1.0 - p_kept, 0.0), max(1.0 - q_kept, 0.0)
    if rest_bin and p_rest > 0:
        kl += p_rest * (math.log(p_rest) - math.log(q_rest))
    return kl, 0.5 * (tv + abs(p_rest - q_rest))


def ref_token_divergences(case: Case, *, rest_bin: bool = True) -> list[list[float]]:
    """Per sequence, the exact KL (eq. 51 + rest bin) of each real token, in order."""
    out = []
    for i, n in enumerate(case.lengths):
        row = []
        for t in range(n):
            if rest_bin:
                row.append(ref_exact_token_kl(case.logits[i, t], case.topk_index[i, t], case.topk_logp[i, t]))
            else:  # eq. 51 over the stored support alone (only to show that the rest bin matters)
                lq = _log_softmax(case.logits[i, t])
                row.append(
                    sum(
                        math.exp(lp) * (lp - lq[v])
                        for v, lp in zip(case.topk_index[i, t], case.topk_logp[i, t])
                        if lp > -math.inf
                    )
                )
        out.append(row)
    return out


def ref_log_ratios(case: Case) -> list[list[float]]:
    """Per sequence, ``log r_t = log pi_theta(y_t) - log pi_roll(y_t)`` of each real token (TRM section 6.2)."""
    return [[float(case.logp[i, t] - case.rollout_logp[i, t]) for t in range(n)] for i, n in enumerate(case.lengths)]


def ref_k2(log_r: float) -> float:
    """k2 = 0.5 (log r)^2, the max criterion's sample estimate (TRM, arXiv 2512.23075, section 6.2 and B.2)."""
    return 0.5 * log_r * log_r


def ref_k3(log_r: float) -> float:
    """k3 = r - 1 - log r, the average criterion's sample estimate (TRM, arXiv 2512.23075, section 6.2 and B.1)."""
    return math.exp(log_r) - 1.0 - log_r


def ref_ln_trm_weight(t: int, T: int, delta: float) -> float:
    """Position weight ``w_t = min(1, sqrt((T - t) delta / 2))``, t = 1..T (TRM, arXiv 2512.23075, eq. 76)."""
    return min(1.0, math.sqrt((T - t) * delta / 2.0))


def ref_ln_trm_normaliser(T: int, delta: float) -> float:
    """``Z(T) = sum_{t=1..T} w_t`` (TRM, arXiv 2512.23075, eq. 77)."""
    return sum(ref_ln_trm_weight(t, T, delta) for t in range(1, T + 1))


def ref_ln_trm_score(log_ratios: list[float], delta: float) -> float:
    """Normalised error score ``W~ = sum_t |r_t - 1| w_t / Z(T)`` (TRM, arXiv 2512.23075, eq. 76-77).

    Z(1) = 0 (spec section 4: guard length-1 sequences); the guard used here, as documented by the
    implementation, scores a length-1 sequence by its plain deviation ``|r_1 - 1|``.
    """
    T = len(log_ratios)
    Z = ref_ln_trm_normaliser(T, delta)
    if Z == 0:
        return abs(math.exp(log_ratios[0]) - 1.0) if T else 0.0
    return sum(abs(math.exp(lr) - 1.0) * ref_ln_trm_weight(t, T, delta) for t, lr in enumerate(log_ratios, 1)) / Z


def ref_ser_score(log_ratios: list[float]) -> float:
    """Sequence-error ratio ``mean_t |r_t - 1|`` (TRM, arXiv 2512.23075, eq. 82)."""
    return sum(abs(math.exp(lr) - 1.0) for lr in log_ratios) / len(log_ratios)


def ref_criteria(mask_name: str, params: dict, case: Case, *, rest_bin: bool = True) -> list[list[tuple[float, float]]]:
    """Per sequence, the (score, threshold) pairs of the mask's criteria (TRM section 6.2, appendix D)."""
    out = []
    if mask_name in EXACT:
        for kl in ref_token_divergences(case, rest_bin=rest_bin):
            pairs = []
            if mask_name in ("trm_max", "trm_max_avg"):
                pairs.append((max(kl), params["delta"]))
            if mask_name in ("trm_avg", "trm_max_avg"):
                pairs.append((sum(kl) / len(kl), params["delta_avg"]))
            out.append(pairs)
        return out
    for lr in ref_log_ratios(case):
        pairs = []
        if mask_name in ("trm_max_k2", "trm_max_avg_sample"):
            pairs.append((max(ref_k2(x) for x in lr), params["delta"]))
        if mask_name in ("trm_avg_k3", "trm_max_avg_sample"):
            pairs.append((sum(ref_k3(x) for x in lr) / len(lr), params["delta_avg"]))
        if mask_name == "ln_trm":
            pairs.append((ref_ln_trm_score(lr, params["delta"]), params["delta_w"]))
        if mask_name == "ser":
            pairs.append((ref_ser_score(lr), params["delta_ser"]))
        out.append(pairs)
    return out


def ref_keep(mask_name: str, params: dict, case: Case, *, rest_bin: bool = True) -> list[float]:
    """Keep weight M_i in {0, 1}: 1 iff every criterion's score <= its threshold (TRM, arXiv 2512.23075, eq. 49)."""
    criteria = ref_criteria(mask_name, params, case, rest_bin=rest_bin)
    return [float(all(score <= thr for score, thr in pairs)) for pairs in criteria]


def _ref_token_loss(objective: str, log_r: float, adv: float) -> tuple[float, float]:
    """(loss, d loss / d log pi_theta) of one token: Token-IS ``-r A`` or PPO clip
    ``max(-r A, -clip(r, 1 - eps_low, 1 + eps_high) A)`` (PPO, arXiv 1707.06347, eq. 7; DAPO bounds)."""
    r = math.exp(log_r)
    if objective == "token_is":
        return -r * adv, -r * adv
    unclipped = -r * adv
    clipped = -min(max(r, 1.0 - CLIP["clip_ratio_low"]), 1.0 + CLIP["clip_ratio_high"]) * adv
    if unclipped >= clipped:
        return unclipped, -r * adv
    return clipped, 0.0


def ref_masked_loss(case: Case, keep: list[float], objective: str, agg: str) -> tuple[float, np.ndarray]:
    """Loss of eq. 50 and its gradient w.r.t. the current log-probs [B,T] (TRM, arXiv 2512.23075, eq. 49-50).

    ``(1/N) sum_i M_i sum_t l_it``: a rejected sequence adds zero and still counts in N. N is the
    number of sequences (``seq-mean-token-sum``, eq. 50 as printed), or, for the other aggregations,
    their own denominator over the whole batch: all real tokens (``token-mean``) or the sequences
    after a per-sequence token mean (``seq-mean-token-mean``). ``l_it`` is the objective's token loss
    with ratio ``exp(logp - old_logp)``.
    """
    lengths = case.lengths
    n_seq = sum(1 for n in lengths if n > 0)
    n_tok = sum(lengths)
    total, grad = 0.0, np.zeros_like(case.logp)
    for i, n in enumerate(lengths):
        if agg == "token-mean":
            scale = 1.0 / n_tok
        elif agg == "seq-mean-token-sum":
            scale = 1.0 / n_seq
        elif agg == "seq-mean-token-mean":
            scale = 1.0 / (n * n_seq)
        else:
            raise ValueError(agg)
        for t in range(n):
            loss, dloss = _ref_token_loss(objective, case.logp[i, t] - case.old_logp[i, t], case.advantages[i, t])
            total += keep[i] * scale * loss
            grad[i, t] = keep[i] * scale * dloss
    return total, grad


def ref_logits_grad(case: Case, grad_logp: np.ndarray) -> np.ndarray:
    """Chain rule through ``log pi_theta(y) = z_y - logsumexp(z)``: ``d/dz_v = g (1[v = y] - softmax(z)_v)``."""
    out = np.zeros_like(case.logits)
    for i in range(case.logits.shape[0]):
        for t in range(case.logits.shape[1]):
            probs = np.exp(_log_softmax(case.logits[i, t]))
            out[i, t] = -grad_logp[i, t] * probs
            out[i, t, case.responses[i, t]] += grad_logp[i, t]
    return out


def ref_metrics(mask_name: str, keep: list[float], case: Case, length_edges=LENGTH_EDGES) -> dict[str, float]:
    """Monitoring of TRM (arXiv 2512.23075, section 7 and appendix D.1, remark D.1): acceptance rate
    (overall and per response-length bucket lo <= length < hi), the max and token-mean divergence
    (exact KL where distributions are stored, else max k2 and mean k3), the log absolute PPL gap
    ``mean_i |mean_t log pi_theta - mean_t log pi_roll|`` (eq. 52)."""
    lengths = case.lengths
    rows = [i for i, n in enumerate(lengths) if n > 0]
    out = {"trm/accept_rate": sum(keep[i] for i in rows) / len(rows)}
    for lo, hi in zip(length_edges, length_edges[1:]):
        sel = [i for i in rows if lo <= lengths[i] < hi]
        if sel:
            out[f"trm/accept_rate/len_{lo}_{hi}"] = sum(keep[i] for i in sel) / len(sel)
    if mask_name in EXACT:
        per_seq = ref_token_divergences(case)
        max_src, mean_src = per_seq, per_seq
    else:
        per_seq = ref_log_ratios(case)
        max_src = [[ref_k2(x) for x in row] for row in per_seq]
        mean_src = [[ref_k3(x) for x in row] for row in per_seq]
    out["trm/max_kl"] = max(x for row in max_src for x in row)
    out["trm/mean_kl"] = sum(x for row in mean_src for x in row) / sum(lengths)
    gaps = [abs(sum(row) / len(row)) for row in ref_log_ratios(case) if row]
    out["trm/ppl_gap"] = sum(gaps) / len(gaps)
    return out


# -- the code under test ----------------------------------------------------------------------
def _tensor(x: np.ndarray | None) -> torch.Tensor | None:
    return None if x is None else torch.from_numpy(np.ascontiguousarray(x))


def run_policy_loss(mask_name: str, params: dict, case: Case, objective: str, agg: str):
    """``PolicyLoss`` of the method (objective, mask, aggregation) on the case; returns
    (loss, gradient w.r.t. the logits or the log-probs, metrics, seq_mask)."""
    method = Method.from_params(
        objective=objective,
        objective_params=CLIP if objective == "clip" else {},
        mask=mask_name,
        mask_params={**params, "length_edges": LENGTH_EDGES, "position_edges": LENGTH_EDGES},
        loss_agg=agg,
    )
    if case.logits is not None:
        leaf = _tensor(case.logits).clone().requires_grad_(True)
        logp = torch.log_softmax(leaf, -1).gather(-1, _tensor(case.responses)[..., None])[..., 0]
    else:
        leaf = _tensor(case.logp).clone().requires_grad_(True)
        logp = leaf
    inp = PolicyInputs(
        logp=logp,
        old_logp=_tensor(case.old_logp),
        advantages=_tensor(case.advantages),
        response_mask=_tensor(case.mask),
        rollout_logp=None if case.logits is not None else _tensor(case.rollout_logp),
        logits=leaf if case.logits is not None else None,
        old_topk_index=_tensor(case.topk_index),
        old_topk_logp=_tensor(case.topk_logp),
    )
    out = PolicyLoss(method)(inp)
    out.loss.backward()
    return float(out.loss.detach()), leaf.grad.numpy(), out.metrics, out.seq_mask.tolist()


# -- tests ----------------------------------------------------------------------------------------
def _margins(mask_name: str, params: dict, case: Case) -> list[float]:
    return [abs(score - thr) / thr for pairs in ref_criteria(mask_name, params, case) for score, thr in pairs]


def test_every_registered_mask_has_a_reference():
    """Every mask in the registry (besides ``none``) is covered by a reference and a case here."""
    assert set(MASKS.names()) - {"none"} == set(EXACT + SAMPLE) == {mask for mask, _ in CASES.values()}


@pytest.mark.parametrize("case_id", list(CASES))
def test_cases_act(case_id):
    """Each mask keeps some sequences and rejects others, no score sits within 0.5% of its threshold
    (float32 log-ratios cannot flip a decision), and the kept and rejected sequences both hold
    positive and negative log-ratios and advantages."""
    mask_name, params = CASES[case_id]
    case = case_for(mask_name)
    keep = ref_keep(mask_name, params, case)
    assert 0 < sum(keep) < len(keep)
    assert min(_margins(mask_name, params, case)) > 5e-3
    log_r = ref_log_ratios(case)
    for kept in (1.0, 0.0):
        rows = [i for i, k in enumerate(keep) if k == kept]
        assert min(min(log_r[i]) for i in rows) < 0 < max(max(log_r[i]) for i in rows), (case_id, kept)
        assert min(case.advantages[i, 0] for i in rows) < 0 < max(case.advantages[i, 0] for i in rows), (case_id, kept)


def test_exact_case_needs_the_rest_bin_and_a_wide_vocabulary():
    """V = 300 >> K = 6 stored ids: the support keeps about half the rollout mass, the sampled id
    joins it in some positions and the extra slot is padding in others, and dropping the rest bin
    would change every exact mask's decisions."""
    case = exact_case()
    V, K = case.logits.shape[-1], case.topk_index.shape[-1]
    assert V >= 40 * K
    kept = np.exp(case.topk_logp).sum(-1)[case.mask > 0]
    assert 0.2 < kept.mean() < 0.8
    extra = case.topk_logp[..., -1][case.mask > 0]
    assert 0 < np.isfinite(extra).mean() < 1
    for name in EXACT:
        params = MASK_PARAMS[name]
        assert ref_keep(name, params, case, rest_bin=False) != ref_keep(name, params, case), name


@pytest.mark.parametrize(
    "pair", [("trm_max_avg", "trm_max", "trm_avg"), ("trm_max_avg_sample", "trm_max_k2", "trm_avg_k3")]
)
def test_max_and_avg_criteria_each_reject_what_the_other_keeps(pair):
    """Max&Avg (TRM section 7): with its own thresholds, the max criterion alone rejects a sequence
    the average criterion keeps, and the other way round (both criteria act)."""
    both, max_name, avg_name = pair
    params = MASK_PARAMS[both]
    case = case_for(both)
    only_max = ref_keep(max_name, {"delta": params["delta"]}, case)
    only_avg = ref_keep(avg_name, {"delta_avg": params["delta_avg"]}, case)
    assert any(m == 0 and a == 1 for m, a in zip(only_max, only_avg))
    assert any(m == 1 and a == 0 for m, a in zip(only_max, only_avg))
    assert ref_keep(both, params, case) == [m * a for m, a in zip(only_max, only_avg)]


def test_ln_trm_position_weights_act():
    """LN-TRM and SER disagree both ways on the sample batch (a last-token spike has weight 0 in
    LN-TRM, an early one the largest weight), and delta changes LN-TRM's decisions (w_t capped at 1)."""
    case = sample_case()
    ln = ref_keep(*CASES["ln_trm"], case)
    capped = ref_keep(*CASES["ln_trm_capped"], case)
    ser = ref_keep(*CASES["ser"], case)
    assert any(a == 1 and b == 0 for a, b in zip(ln, ser)) and any(a == 0 and b == 1 for a, b in zip(ln, ser))
    assert ln != capped
    weights = [ref_ln_trm_weight(t, 8, 0.5) for t in range(1, 9)]
    assert weights[0] == 1.0 and 0 < weights[-2] < 1 and weights[-1] == 0.0


@pytest.mark.parametrize("case_id", list(CASES))
@pytest.mark.parametrize(
    ("objective", "agg"),
    [("token_is", "token-mean"), ("clip", "seq-mean-token-sum"), ("clip", "seq-mean-token-mean")],
)
def test_policy_loss_matches_reference(case_id, objective, agg):
    """PolicyLoss with the mask: sequence keep weights, eq. 50 loss and gradient (w.r.t. the logits
    for the exact masks, the log-probs for the sample masks) and the mask's metrics as the reference."""
    mask_name, params = CASES[case_id]
    case = case_for(mask_name)
    keep = ref_keep(mask_name, params, case)
    ref_loss, ref_grad = ref_masked_loss(case, keep, objective, agg)
    if case.logits is not None:
        ref_grad = ref_logits_grad(case, ref_grad)
    loss, grad, metrics, seq_mask = run_policy_loss(mask_name, params, case, objective, agg)
    assert seq_mask == keep
    assert loss == pytest.approx(ref_loss, rel=OBJ_RTOL, abs=OBJ_ATOL)
    np.testing.assert_allclose(grad, ref_grad, rtol=OBJ_RTOL, atol=GRAD_ATOL * np.abs(ref_grad).max())
    # rejected sequences carry no gradient at all, padding neither
    for i, k in enumerate(keep):
        assert (np.abs(grad[i]).sum() == 0) == (k == 0)
    check_metrics(metrics, ref_metrics(mask_name, keep, case), exact=mask_name in EXACT)


def check_metrics(metrics: dict, expected: dict, *, exact: bool) -> None:
    """The mask's monitoring metrics equal the reference's: acceptance rates exactly, the exact KL
    in float64, the sample estimators and the PPL gap to float32 precision."""
    for key, value in expected.items():
        assert key in metrics, key
        if key.startswith("trm/accept_rate"):
            assert metrics[key] == pytest.approx(value, abs=1e-7), key  # a float32 mean of 0/1
        elif exact and key in ("trm/max_kl", "trm/mean_kl"):
            assert metrics[key] == pytest.approx(value, rel=KL_RTOL), key
        else:
            assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-8), key
    reported = {k for k in metrics if k.startswith("trm/accept_rate/")}
    assert reported == {k for k in expected if k.startswith("trm/accept_rate/")}


def test_clip_objective_acts_on_kept_sequences():
    """The clip cases clip on both sides among kept sequences: some tokens with r < 1 - eps_low and
    A < 0, some with r > 1 + eps_high and A > 0 (their gradient is zero)."""
    for mask_name in ("trm_max", "trm_max_k2"):
        case = case_for(mask_name)
        keep = ref_keep(mask_name, MASK_PARAMS[mask_name], case)
        low = high = 0
        for i, n in enumerate(case.lengths):
            for t in range(n):
                r = math.exp(case.logp[i, t] - case.old_logp[i, t])
                if keep[i] and r < 1 - CLIP["clip_ratio_low"] and case.advantages[i, t] < 0:
                    low += 1
                if keep[i] and r > 1 + CLIP["clip_ratio_high"] and case.advantages[i, t] > 0:
                    high += 1
        assert low > 0 and high > 0, mask_name


@pytest.mark.parametrize("case_id", [c for c in CASES if CASES[c][0] not in EXACT])
def test_sample_thresholds_are_inclusive(case_id):
    """Spec section 4 keeps a sequence iff its score <= the threshold: with every threshold 0, a
    sequence whose log-ratios are all exactly 0 is kept and one with a single 1e-3 deviation (of
    either sign) is rejected, through PolicyLoss as in the reference."""
    mask_name, params = CASES[case_id]
    zero = {key: (value if key == "delta" and mask_name == "ln_trm" else 0.0) for key, value in params.items()}
    case = sample_case()
    logp = case.rollout_logp.copy()
    logp[1, 2] += 1e-3
    logp[4, 0] -= 1e-3
    case = replace(case, logp=logp)
    keep = ref_keep(mask_name, zero, case)
    assert keep == [0.0 if i in (1, 4) else 1.0 for i in range(len(keep))]
    ref_loss, ref_grad = ref_masked_loss(case, keep, "token_is", "token-mean")
    loss, grad, _, seq_mask = run_policy_loss(mask_name, zero, case, "token_is", "token-mean")
    assert seq_mask == keep
    assert loss == pytest.approx(ref_loss, rel=OBJ_RTOL, abs=OBJ_ATOL)
    np.testing.assert_allclose(grad, ref_grad, rtol=OBJ_RTOL, atol=GRAD_ATOL * np.abs(ref_grad).max())


@pytest.mark.parametrize(("T", "expected"), [(256, 19.25), (1024, 154.36), (4096, 1235.5)])
def test_ln_trm_normaliser_spec_values(T, expected):
    """Z(T) at delta = 1e-4 (spec section 4 check values, half the printed digit), from the reference
    and as the implementation's score implies it: a single deviation at t = 1 scores |r_1 - 1| w_1 / Z(T);
    the mask keeps that sequence just below the score and rejects it just above."""
    delta = 1e-4
    assert ref_ln_trm_normaliser(T, delta) == pytest.approx(expected, abs=0.005 if T < 4096 else 0.05)
    log_ratio = torch.zeros(1, T, dtype=torch.float64)
    log_ratio[0, 0] = 0.3
    mask = torch.ones(1, T, dtype=torch.float64)
    score = float(ln_trm_scores(log_ratio, mask, delta)[0])
    implied_z = (math.exp(0.3) - 1.0) * ref_ln_trm_weight(1, T, delta) / score
    assert implied_z == pytest.approx(ref_ln_trm_normaliser(T, delta), rel=1e-9)
    expected_score = ref_ln_trm_score([0.3] + [0.0] * (T - 1), delta)
    inp = PolicyInputs(
        logp=log_ratio.float(), old_logp=torch.zeros(1, T), advantages=torch.zeros(1, T), response_mask=mask.float()
    )
    for factor, kept in ((1.001, 1.0), (0.999, 0.0)):
        out = MASKS.get("ln_trm")(inp, delta=delta, delta_w=expected_score * factor, monitor=False)
        assert out.seq_mask.tolist() == [kept]


def test_reference_exact_kl_is_eq51_on_the_full_support():
    """The reference itself: on the full vocabulary the rest bin is empty and the value is eq. 51;
    on a truncated support it is >= 0, at most the full KL, and 0 for an unchanged policy."""
    rng = np.random.default_rng(1)
    V = 40
    for _ in range(5):
        roll = _log_softmax(2.0 * rng.standard_normal(V))
        cur = roll + 0.5 * rng.standard_normal(V)
        dense = float(np.sum(np.exp(roll) * (roll - _log_softmax(cur))))
        full = np.arange(V)
        assert ref_exact_token_kl(cur, full, roll[full]) == pytest.approx(dense, rel=1e-12)
        top = np.argsort(-roll)[:5]
        truncated = ref_exact_token_kl(cur, top, roll[top])
        assert 0 <= truncated <= dense
        assert abs(ref_exact_token_kl(roll + 3.0, top, roll[top])) < 1e-12
