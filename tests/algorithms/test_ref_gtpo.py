"""GTPO (GTPO, arXiv 2508.03772) against a reference written here from the paper, in plain Python loops.

What is compared with what:

- conflict spans (section 5.1, "Conflict tokens definitions": forward / backward alignment, first contiguous
  span from the start / from each completion's own end; zero-advantage completions ignored as in Listing 2)
  against ``conflict_spans``;
- the token weights lambda (eq. 5: M = M_fw OR M_bw; and the authors' product of the forward and backward
  weights, Listing 2) against ``gtpo_weights``;
- the entropy filter delta (eq. 6) against ``entropy_filter``, its ln 2 boundary included;
- the GTPO loss (eq. 7 with the importance ratio of the authors' token loss, Listing 3; and the authors'
  advantage-shift form, section 16) and its gradient w.r.t. the log-probs and the entropies, against the
  registered objective reduced by the registered ``seq-mean-token-mean`` aggregation, and against the
  trainer's ``PolicyLoss`` (gradient w.r.t. the logits); on-policy, the gradient is checked against eq. 23.

The case: four prompt groups of four completions, right-padded, different lengths; groups with both
advantage signs sharing prefixes and suffixes (some conflicts inside the spans, some shared tokens after
the first break that must not count, zero-advantage completions that must not count as either sign, a
completion equal to an opposite-sign one so its two spans overlap), and completions whose mean entropy
lies on either side of ln 2 (some close to it), so the filter drops some of both signs and keeps others.

Run: ``pytest tests/algorithms/test_ref_gtpo.py``.
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import pytest
import torch

from runners.algorithms import LOSS_AGGS, OBJECTIVES
from runners.algorithms.gtpo import conflict_spans, entropy_filter, gtpo_weights
from runners.algorithms.method import Method
from runners.algorithms.policy_loss import PolicyLoss
from runners.algorithms.types import PolicyInputs
from runners.metric_names import GTPO_CONFLICT_FRAC, GTPO_FILTERED_FRAC

LN2 = math.log(2.0)
VOCAB = 12
GAMMA = 0.1
TOL = {"rtol": 1e-10, "atol": 1e-12}  # float64 everywhere: the code and the loops differ only by rounding

# four groups of four completions (token ids, 0 = padding); see the module docstring
ROWS = [
    [1, 2, 3, 8, 5, 6, 9], [1, 2, 4, 8, 6, 9], [1, 3, 3, 8, 7, 5, 6, 9], [2, 2, 3, 5, 6, 9],
    [3, 4, 5, 6], [7, 4, 5, 2, 2], [3, 4, 9, 6], [3, 8, 8],
    [4, 2, 9], [5, 6, 5, 9], [1, 2, 8], [4, 2, 9],
    [1, 2, 3], [1, 2, 3], [1, 2, 3, 4], [2, 2],
]  # fmt: skip
ADVS = [1.2, -0.8, 0.6, -1.0, 1.5, -1.5, 0.0, 0.0, 0.7, 0.3, -0.4, -0.6, 0.0, 0.0, 0.0, 0.0]
GROUPS = [g for g in range(4) for _ in range(4)]
# mean token entropy <H>_i of each completion under the current policy (ln 2 = 0.693)
MEAN_ENTROPY = [0.3, 2.0, 0.8, 0.6, 0.4, 1.5, 0.9, 0.2, 0.65, 1.2, 0.5, 0.75, 0.3, 1.0, 0.1, 2.2]


# -- reference (plain loops) --------------------------------------------------------------------------
def ref_conflict_spans(rows, advs, groups):
    """Forward and backward conflict spans, lists of bools per completion (GTPO, arXiv 2508.03772, section 5.1).

    Token v at position p of completion i is a forward conflict if some completion of i's group with A > 0
    and some with A < 0 carry v at position p; backward: the same at offset r from each completion's own end.
    M_fw / M_bw mark the first contiguous span of such tokens from the start / from the end. Completions
    with A = 0 are in neither G+ nor G- and get no span (Listing 2, "active subset").
    """

    def token(j, step, backward):
        if step >= len(rows[j]):
            return None
        return rows[j][len(rows[j]) - 1 - step] if backward else rows[j][step]

    def is_conflict(i, step, backward):
        v = token(i, step, backward)
        peers = [j for j in range(len(rows)) if groups[j] == groups[i] and token(j, step, backward) == v]
        return any(advs[j] > 0 for j in peers) and any(advs[j] < 0 for j in peers)

    forward, backward = [], []
    for i, row in enumerate(rows):
        fw, bw = [False] * len(row), [False] * len(row)
        if advs[i] != 0:
            for step in range(len(row)):
                if not is_conflict(i, step, False):
                    break
                fw[step] = True
            for step in range(len(row)):
                if not is_conflict(i, step, True):
                    break
                bw[len(row) - 1 - step] = True
        forward.append(fw)
        backward.append(bw)
    return forward, backward


def ref_lambda(rows, advs, groups, combine="or", weight=2.0):
    """lambda_{i,t} (GTPO, arXiv 2508.03772, eq. 5 / eq. 22): 1 off the conflict mask, 0 on it for A < 0,
    ``weight`` (2) on it for A > 0. ``combine="or"``: mask M = M_fw OR M_bw (section 5.1); ``"product"``:
    forward weight times backward weight (authors' code, section 16, Listing 2: final_mask = mask_fwd * mask_bw).
    """
    forward, backward = ref_conflict_spans(rows, advs, groups)

    def on_mask(a):
        return weight if a > 0 else (0.0 if a < 0 else 1.0)

    out = []
    for i, row in enumerate(rows):
        lam = []
        for t in range(len(row)):
            if combine == "or":
                lam.append(on_mask(advs[i]) if forward[i][t] or backward[i][t] else 1.0)
            else:
                lam.append((on_mask(advs[i]) if forward[i][t] else 1.0) * (on_mask(advs[i]) if backward[i][t] else 1.0))
        out.append(lam)
    return out


def ref_entropy_filter(mean_entropies, h_ini, threshold=LN2):
    """delta_i (GTPO, arXiv 2508.03772, eq. 6): 1 if H_ini > ln 2; if H_ini < ln 2, 0 where <H>_i > ln 2 and 1
    where <H>_i <= ln 2. (H_ini = ln 2 is left open by eq. 6 and not asked here.)"""
    assert h_ini != LN2
    if h_ini > LN2:
        return [1.0 for _ in mean_entropies]
    return [0.0 if h > threshold else 1.0 for h in mean_entropies]


def ref_mean_entropies(entropy, rows):
    """<H>_i: mean of the per-token entropies over completion i's tokens (values only)."""
    return [sum(float(entropy[i, t].detach()) for t in range(len(row))) / len(row) for i, row in enumerate(rows)]


def ref_gtpo_loss(logp, old_logp, entropy, rows, advs, groups, *, h_ini, gamma, combine="or", entropy_term="penalty"):
    """-J_GTPO as a torch scalar built token by token (differentiable in ``logp`` and ``entropy`` [B,T]).

    ``"penalty"`` (GTPO, arXiv 2508.03772, eq. 7, per group of G completions, averaged over the groups):
        J = (1/G) sum_i [ delta_i A_i / |o_i| sum_t lambda_it r_it - gamma <H>_i ]
    with r_it = pi_theta / pi_old (the ratio of the authors' token loss, Listing 3: value 1 on-policy,
    carrying the gradient). ``"advantage_shift"`` (authors' code, section 16, Listing 3): A_i becomes
    delta_i (A_i - gamma sg(<H>_i)), each completion's token mean -A_i lambda_it r_it is divided by its
    number of conflict positions (forward OR backward span, clamped to >= 1), and the completions' losses
    are summed (divided here by the number of completions, a constant learning-rate scale).
    """
    lam = ref_lambda(rows, advs, groups, combine)
    means = ref_mean_entropies(entropy, rows)
    delta = ref_entropy_filter(means, h_ini)
    forward, backward = ref_conflict_spans(rows, advs, groups)
    per_completion = []
    for i, row in enumerate(rows):
        ratio = [torch.exp(logp[i, t] - old_logp[i, t]) for t in range(len(row))]
        if entropy_term == "penalty":
            surrogate = sum(lam[i][t] * ratio[t] for t in range(len(row))) * delta[i] * advs[i] / len(row)
            mean_h = sum(entropy[i, t] for t in range(len(row))) / len(row)
            per_completion.append(-(surrogate - gamma * mean_h))
        else:
            shifted = delta[i] * (advs[i] - gamma * means[i])
            n_conflict = max(1, sum(forward[i][t] or backward[i][t] for t in range(len(row))))
            token_mean = sum(-shifted * lam[i][t] * ratio[t] for t in range(len(row))) / len(row)
            per_completion.append(token_mean / n_conflict)
    if entropy_term != "penalty":
        return sum(per_completion) / len(rows)
    group_ids = sorted(set(groups))
    per_group = []
    for g in group_ids:
        members = [i for i in range(len(rows)) if groups[i] == g]
        per_group.append(sum(per_completion[i] for i in members) / len(members))
    return sum(per_group) / len(group_ids)


def ref_token_logp(logits, responses):
    """log pi(y_t | c_t) = log softmax(logits)[y_t], [B,T] (float64, differentiable)."""
    return torch.log_softmax(logits, -1).gather(-1, responses[..., None]).squeeze(-1)


def ref_token_entropy(logits):
    """H_t = -sum_v p_v log p_v of softmax(logits), [B,T] (float64, differentiable)."""
    logq = torch.log_softmax(logits, -1)
    return -(logq.exp() * logq).sum(-1)


# -- the case -----------------------------------------------------------------------------------------
def _scaled_logits(base, length, target):
    """c * base [T,V] with c found by bisection so that the mean entropy of the first ``length`` rows is
    ``target`` (the entropy of softmax(c z) falls as c grows)."""
    lo, hi = 0.0, 60.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if float(ref_token_entropy(mid * base)[:length].mean()) > target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi) * base


@functools.cache
def make_gtpo_case(seed=0):
    """The test batch: tensors [B,T] (and logits [B,T,V]) plus the plain lists the references read."""
    gen = torch.Generator().manual_seed(seed)
    width = max(len(r) for r in ROWS)
    responses = torch.tensor([r + [0] * (width - len(r)) for r in ROWS])
    mask = torch.tensor([[1.0] * len(r) + [0.0] * (width - len(r)) for r in ROWS], dtype=torch.float64)
    logits = torch.stack(
        [
            _scaled_logits(torch.randn(width, VOCAB, generator=gen, dtype=torch.float64), len(r), h)
            for r, h in zip(ROWS, MEAN_ENTROPY)
        ]
    )
    old_logp = ref_token_logp(logits, responses) + 0.3 * torch.randn(
        responses.shape, generator=gen, dtype=torch.float64
    )
    advantages = torch.tensor(ADVS, dtype=torch.float64)[:, None].expand(-1, width).contiguous()
    return SimpleNamespace(
        rows=ROWS,
        advs=ADVS,
        groups=GROUPS,
        responses=responses,
        mask=mask,
        group_index=torch.tensor(GROUPS),
        uids=[f"prompt-{g}" for g in GROUPS],
        logits=logits,
        old_logp=old_logp,
        advantages=advantages,
    )


def make_inputs(case, logp, entropy, old_logp=None):
    return PolicyInputs(
        logp=logp,
        old_logp=case.old_logp if old_logp is None else old_logp,
        advantages=case.advantages,
        response_mask=case.mask,
        responses=case.responses,
        group_index=case.group_index,
        entropy=entropy,
    )


def _leaves(case):
    logp = ref_token_logp(case.logits, case.responses).detach().requires_grad_(True)
    entropy = ref_token_entropy(case.logits).detach().requires_grad_(True)
    return logp, entropy


def _grads(loss, leaves):
    """d loss / d leaves, zeros for a leaf the loss does not depend on (the detached <H>_i of advantage_shift)."""
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return tuple(torch.zeros_like(x) if g is None else g for x, g in zip(leaves, grads))


# -- tests --------------------------------------------------------------------------------------------
def test_case_exercises_every_part_of_gtpo():
    """The batch has forward-only, backward-only, overlapping and empty spans, shared tokens after the first
    break (raw conflicts outside the span), zero-advantage completions, and a filter that drops completions
    of both signs (some with spans) while keeping others, with means on both sides close to ln 2."""
    case = make_gtpo_case()
    forward, backward = ref_conflict_spans(case.rows, case.advs, case.groups)
    has_fw = [any(f) for f in forward]
    has_bw = [any(b) for b in backward]
    assert len({sum(f) for f in forward}) >= 4 and len({sum(b) for b in backward}) >= 3  # spans of several lengths
    assert any(not f and b for f, b in zip(has_fw, has_bw))
    assert any(any(x and y for x, y in zip(f, b)) for f, b in zip(forward, backward))  # overlap: product = 4
    assert any(not f and not b and a != 0 for f, b, a in zip(has_fw, has_bw, case.advs))
    # raw conflicts (same token, same position, both signs) outside the leading forward span
    outside = 0
    for i, row in enumerate(case.rows):
        for p in range(len(row)):
            peers = [j for j in range(len(case.rows)) if case.groups[j] == case.groups[i] and p < len(case.rows[j])]
            same = [case.advs[j] for j in peers if case.rows[j][p] == row[p]]
            outside += case.advs[i] != 0 and not forward[i][p] and min(same) < 0 < max(same)
    assert outside >= 3
    means = ref_mean_entropies(ref_token_entropy(case.logits), case.rows)
    assert means == pytest.approx(MEAN_ENTROPY, abs=1e-9)
    delta = ref_entropy_filter(means, 0.5)
    dropped_signs = {math.copysign(1, a) for a, d in zip(case.advs, delta) if d == 0 and a != 0}
    assert dropped_signs == {1.0, -1.0} and 0 < sum(delta) < len(delta)
    assert any(d == 0 and (f or b) for d, f, b in zip(delta, has_fw, has_bw))
    assert any(d == 1 and (f or b) for d, f, b in zip(delta, has_fw, has_bw))
    assert min(abs(m - LN2) for m in means) < 0.1


def test_conflict_spans_match_the_definition():
    case = make_gtpo_case()
    forward, backward = conflict_spans(case.responses, case.mask, case.group_index, torch.tensor(ADVS))
    ref_fw, ref_bw = ref_conflict_spans(case.rows, case.advs, case.groups)
    for i, row in enumerate(case.rows):
        assert forward[i, : len(row)].tolist() == ref_fw[i], i
        assert backward[i, : len(row)].tolist() == ref_bw[i], i
        assert not forward[i, len(row) :].any() and not backward[i, len(row) :].any()


@pytest.mark.parametrize("combine", ["or", "product"])
def test_weights_match_eq5(combine):
    case = make_gtpo_case()
    lam = gtpo_weights(case.responses, case.mask, case.group_index, torch.tensor(ADVS), combine=combine)
    ref = ref_lambda(case.rows, case.advs, case.groups, combine)
    for i, row in enumerate(case.rows):
        assert lam[i, : len(row)].tolist() == ref[i], i
        assert float(lam[i, len(row) :].abs().sum()) == 0.0
    values = {v for row in ref for v in row}
    assert values == ({0.0, 1.0, 2.0} if combine == "or" else {0.0, 1.0, 2.0, 4.0})


@pytest.mark.parametrize("h_ini", [0.5, 1.0])
def test_entropy_filter_matches_eq6(h_ini):
    """Means on both sides of ln 2 (1e-9 away), and exactly ln 2, which eq. 6 keeps (<H>_i <= ln 2)."""
    means = [0.1, LN2 - 1e-9, LN2, LN2 + 1e-9, 0.8, 2.0]
    got = entropy_filter(torch.tensor(means, dtype=torch.float64), h_ini)
    assert got.tolist() == ref_entropy_filter(means, h_ini)
    if h_ini < LN2:
        assert got.tolist() == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]


# (entropy_term, combine): the paper's eq. 7 with both combinations, and the authors' code
FORMS = [("penalty", "or"), ("penalty", "product"), ("advantage_shift", "product")]


@pytest.mark.parametrize("h_ini", [0.5, 1.0])
@pytest.mark.parametrize(("entropy_term", "combine"), FORMS)
def test_objective_loss_and_gradient_match_reference(entropy_term, combine, h_ini):
    """Registered objective + registered seq-mean-token-mean: loss, d/d logp, d/d H, and the metrics."""
    case = make_gtpo_case()
    logp, entropy = _leaves(case)
    out = OBJECTIVES.get("gtpo")(
        make_inputs(case, logp, entropy), gamma=GAMMA, combine=combine, entropy_term=entropy_term, h_ini=h_ini
    )
    loss = LOSS_AGGS.get(out.extra["loss_agg"])(out.loss_mat, case.mask)
    grads = _grads(loss, (logp, entropy))

    ref_logp, ref_entropy = _leaves(case)
    ref = ref_gtpo_case_loss(case, ref_logp, ref_entropy, h_ini, entropy_term=entropy_term, combine=combine)
    ref_grads = _grads(ref, (ref_logp, ref_entropy))
    torch.testing.assert_close(loss, ref, **TOL)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, **TOL)

    forward, backward = ref_conflict_spans(case.rows, case.advs, case.groups)
    in_span = sum(f or b for fw, bw in zip(forward, backward) for f, b in zip(fw, bw))
    assert out.metrics[GTPO_CONFLICT_FRAC] == pytest.approx(in_span / sum(map(len, case.rows)), abs=1e-12)
    delta = ref_entropy_filter(ref_mean_entropies(entropy, case.rows), h_ini)
    assert out.metrics[GTPO_FILTERED_FRAC] == pytest.approx(delta.count(0.0) / len(delta), abs=1e-12)


def test_on_policy_gradient_is_eq23():
    """On-policy (pi_old = pi_theta, ratio 1 carrying the gradient, GTPO, arXiv 2508.03772, eq. 23 and eq. 7):
    d(-J)/d logp_it = -delta_i A_i lambda_it / (N |o_i|) and d(-J)/d H_it = gamma / (N |o_i|), N completions
    (equal groups: the mean of the group means is the mean over completions). Written out, not autograd."""
    case = make_gtpo_case()
    h_ini = 0.5
    logp, entropy = _leaves(case)
    out = OBJECTIVES.get("gtpo")(make_inputs(case, logp, entropy, logp.detach()), gamma=GAMMA, h_ini=h_ini)
    d_logp, d_entropy = _grads(LOSS_AGGS.get("seq-mean-token-mean")(out.loss_mat, case.mask), (logp, entropy))
    lam = ref_lambda(case.rows, case.advs, case.groups)
    delta = ref_entropy_filter(ref_mean_entropies(entropy, case.rows), h_ini)
    n = len(case.rows)
    want_logp = torch.zeros_like(d_logp)
    want_entropy = torch.zeros_like(d_entropy)
    for i, row in enumerate(case.rows):
        for t in range(len(row)):
            want_logp[i, t] = -delta[i] * case.advs[i] * lam[i][t] / (n * len(row))
            want_entropy[i, t] = GAMMA / (n * len(row))
    torch.testing.assert_close(d_logp, want_logp, **TOL)
    torch.testing.assert_close(d_entropy, want_entropy, **TOL)
    assert int((want_logp == 0).sum()) > int((case.mask == 0).sum())  # some real tokens get no gradient


def ref_gtpo_on_logits(case, h_ini, *, entropy_term="penalty", combine="or"):
    """``ref_gtpo_loss`` with log-probs and entropies taken from the case's logits: (loss, d loss / d logits)."""
    logits = case.logits.clone().requires_grad_(True)
    loss = ref_gtpo_case_loss(
        case,
        ref_token_logp(logits, case.responses),
        ref_token_entropy(logits),
        h_ini,
        entropy_term=entropy_term,
        combine=combine,
    )
    (grad,) = torch.autograd.grad(loss, logits)
    return loss.detach(), grad


def ref_gtpo_case_loss(case, logp, entropy, h_ini, *, entropy_term="penalty", combine="or"):
    """``ref_gtpo_loss`` of the case's completions, groups and advantages for the given log-probs and entropies."""
    return ref_gtpo_loss(
        logp,
        case.old_logp,
        entropy,
        case.rows,
        case.advs,
        case.groups,
        h_ini=h_ini,
        gamma=GAMMA,
        combine=combine,
        entropy_term=entropy_term,
    )


@pytest.mark.parametrize(("entropy_term", "combine"), FORMS)
def test_trainer_policy_loss_matches_reference_through_logits(entropy_term, combine):
    """The trainer's PolicyLoss (GTPO with its natural seq-mean-token-mean): loss and d/d logits, where
    logp and H are functions of the logits (the entropy term's gradient reaches every vocabulary entry)."""
    case = make_gtpo_case()
    h_ini = 0.5
    method = Method.from_params(
        objective="gtpo",
        objective_params={"gamma": GAMMA, "combine": combine, "entropy_term": entropy_term, "h_ini_prompts": 100},
        loss_agg="seq-mean-token-mean",
    )
    logits = case.logits.clone().requires_grad_(True)
    inp = make_inputs(case, ref_token_logp(logits, case.responses), ref_token_entropy(logits))
    out = PolicyLoss(method)(inp, h_ini=h_ini)
    (grad,) = _grads(out.loss, (logits,))
    ref, ref_grad = ref_gtpo_on_logits(case, h_ini, entropy_term=entropy_term, combine=combine)
    torch.testing.assert_close(out.loss, ref, **TOL)
    torch.testing.assert_close(grad, ref_grad, **TOL)
    assert float(grad.abs().sum()) > 0
