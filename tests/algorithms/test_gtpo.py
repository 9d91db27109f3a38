"""GTPO (GTPO, arXiv 2508.03772, sections 5, 11, 16): conflict spans on hand-built groups, a plain per-response loop
reference of the spans and of eq. 7, finite-difference gradients, and the entropy filter (eq. 6)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from runners.algorithms import OBJECTIVES
from runners.algorithms.gtpo import (
    compute_initial_entropy,
    conflict_spans,
    entropy_filter,
    gtpo_objective,
    gtpo_weights,
)
from runners.algorithms.loss_agg import seq_mean_token_mean
from runners.algorithms.types import PolicyInputs
from runners.metric_names import GTPO_CONFLICT_FRAC, GTPO_FILTERED_FRAC

LN2 = math.log(2.0)


def batch(rows, advs, groups):
    """Right-pad lists of token ids (pad id 0) into responses/mask [B,T]; advs/groups [B]."""
    width = max(len(r) for r in rows)
    responses = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return responses, mask, torch.tensor(groups), torch.tensor(advs, dtype=torch.float64)


def pad(rows, width):
    return torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.bool)


# -- plain per-response reference (definitions of GTPO (arXiv 2508.03772) section 5.1) ------------------------------
def ref_spans(rows, advs, groups):
    def conflicted(i, aligned):
        out = []
        for p, tok in enumerate(aligned[i]):
            hit = any(
                groups[j] == groups[i] and advs[j] * advs[i] < 0 and p < len(aligned[j]) and aligned[j][p] == tok
                for j in range(len(rows))
            )
            if not hit or advs[i] == 0:
                break
            out.append(p)
        return out

    forward, backward = [], []
    reversed_rows = [list(reversed(r)) for r in rows]
    for i, r in enumerate(rows):
        forward.append([p in conflicted(i, rows) for p in range(len(r))])
        backward.append([len(r) - 1 - p in conflicted(i, reversed_rows) for p in range(len(r))])
    return forward, backward


def ref_lambda(rows, advs, groups, combine):
    forward, backward = ref_spans(rows, advs, groups)
    on = lambda a: 2.0 if a > 0 else 0.0  # noqa: E731
    lam = []
    for i, r in enumerate(rows):
        if combine == "or":
            lam.append([on(advs[i]) if forward[i][t] or backward[i][t] else 1.0 for t in range(len(r))])
        else:
            lam.append(
                [
                    (on(advs[i]) if forward[i][t] else 1.0) * (on(advs[i]) if backward[i][t] else 1.0)
                    for t in range(len(r))
                ]
            )
    return lam


# -- hand-built groups ------------------------------------------------------------------------------
CASES = {
    # shared prefix (1 2) and shared suffix (7 9) with different lengths and right padding
    "prefix_and_suffix": (
        [[1, 2, 3, 7, 9], [1, 2, 4, 8, 7, 9]],
        [1.0, -1.0],
        [0, 0],
        [[1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]],
        [[0, 0, 0, 1, 1], [0, 0, 0, 0, 1, 1]],
    ),
    # a matching token in the middle (position 2, offset 1) is not part of a leading span
    "middle_match_ignored": (
        [[1, 2, 3, 4], [1, 5, 3, 6]],
        [1.0, -1.0],
        [0, 0],
        [[1, 0, 0, 0], [1, 0, 0, 0]],
        [[0, 0, 0, 0], [0, 0, 0, 0]],
    ),
    # the A=0 response shares everything with both sides but neither creates nor receives conflicts
    "zero_advantage_ignored": (
        [[1, 2], [3, 4], [3, 4], [1, 2]],
        [1.0, 0.0, -1.0, 0.0],
        [0, 0, 0, 0],
        [[0, 0], [0, 0], [0, 0], [0, 0]],
        [[0, 0], [0, 0], [0, 0], [0, 0]],
    ),
    # identical responses: every token is in both spans
    "both_spans": (
        [[1, 2, 3], [1, 2, 3]],
        [0.5, -0.5],
        [0, 0],
        [[1, 1, 1], [1, 1, 1]],
        [[1, 1, 1], [1, 1, 1]],
    ),
    "no_conflicts": (
        [[1, 2, 3], [4, 5, 6]],
        [1.0, -1.0],
        [0, 0],
        [[0, 0, 0], [0, 0, 0]],
        [[0, 0, 0], [0, 0, 0]],
    ),
    "only_positive": (
        [[1, 2, 3], [1, 2, 3], [1, 2]],
        [1.0, 2.0, 0.5],
        [0, 0, 0],
        [[0, 0, 0], [0, 0, 0], [0, 0]],
        [[0, 0, 0], [0, 0, 0], [0, 0]],
    ),
    # the pad id (0) is a real token of the longer response: padding never conflicts
    "padding_never_conflicts": (
        [[1, 2], [1, 2, 0]],
        [1.0, -1.0],
        [0, 0],
        [[1, 1], [1, 1, 0]],
        [[0, 0], [0, 0, 0]],
    ),
    # identical responses in different groups (ids 7 and 3, interleaved) do not conflict
    "groups_are_separate": (
        [[1, 2], [5, 6], [1, 2], [5, 6]],
        [1.0, 1.0, -1.0, 1.0],
        [7, 3, 3, 7],
        [[0, 0], [0, 0], [0, 0], [0, 0]],
        [[0, 0], [0, 0], [0, 0], [0, 0]],
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_conflict_spans_hand_built(name):
    """Spans equal the hand-derived ones and the plain-loop reference of section 5.1."""
    rows, advs, groups, want_fwd, want_bwd = CASES[name]
    responses, mask, group_index, adv = batch(rows, advs, groups)
    forward, backward = conflict_spans(responses, mask, group_index, adv)
    width = responses.shape[1]
    assert torch.equal(forward, pad(want_fwd, width)), forward
    assert torch.equal(backward, pad(want_bwd, width)), backward
    ref_fwd, ref_bwd = ref_spans(rows, advs, groups)
    assert torch.equal(forward, pad([[int(x) for x in r] for r in ref_fwd], width))
    assert torch.equal(backward, pad([[int(x) for x in r] for r in ref_bwd], width))


def test_weights_or_vs_product():
    """Paper OR gives 2 on any span of a positive response; the authors' product gives 4 in both."""
    rows, advs, groups, *_ = CASES["both_spans"]
    args = batch(rows, advs, groups)
    assert gtpo_weights(*args, combine="or").tolist() == [[2.0, 2.0, 2.0], [0.0, 0.0, 0.0]]
    assert gtpo_weights(*args, combine="product").tolist() == [[4.0, 4.0, 4.0], [0.0, 0.0, 0.0]]

    rows, advs, groups, *_ = CASES["prefix_and_suffix"]
    args = batch(rows, advs, groups)
    want = [[2.0, 2.0, 1.0, 2.0, 2.0, 0.0], [0.0, 0.0, 1.0, 1.0, 0.0, 0.0]]  # padding gets 0
    assert gtpo_weights(*args, combine="or").tolist() == want
    assert gtpo_weights(*args, combine="product").tolist() == want  # spans do not overlap here
    with pytest.raises(ValueError, match="combine"):
        gtpo_weights(*args, combine="and")


def random_batch(rng, num_groups=3, group_size=5, vocab=3, max_len=6):
    rows, advs, groups = [], [], []
    for g in rng.sample(range(100), num_groups):
        for _ in range(group_size):
            rows.append([rng.randrange(vocab) for _ in range(rng.randint(1, max_len))])
            advs.append(rng.choice([-1.5, -0.5, 0.0, 0.5, 1.0]))
            groups.append(g)
    order = list(range(len(rows)))
    rng.shuffle(order)  # group members need not be contiguous
    return [rows[i] for i in order], [advs[i] for i in order], [groups[i] for i in order]


@pytest.mark.parametrize("combine", ["or", "product"])
def test_weights_match_loop_reference_on_random_groups(combine):
    """Batched weights equal the per-response loop reference on 200 random small-vocabulary batches."""
    rng = random.Random(0)
    for _ in range(200):
        rows, advs, groups = random_batch(rng)
        responses, mask, group_index, adv = batch(rows, advs, groups)
        got = gtpo_weights(responses, mask, group_index, adv, combine=combine)
        want = ref_lambda(rows, advs, groups, combine)
        width = responses.shape[1]
        assert got.tolist() == [r + [0.0] * (width - len(r)) for r in want]


def test_mask_must_be_right_padded():
    responses = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="right-padded"):
        conflict_spans(responses, torch.tensor([[1, 0, 1]]), torch.tensor([0]), torch.tensor([1.0]))


# -- entropy filter (eq. 6) --------------------------------------------------------------------------
def test_entropy_filter_thresholds():
    h = torch.tensor([0.1, LN2, 0.7, 2.0])
    assert entropy_filter(h, h_ini=0.5).tolist() == [1.0, 1.0, 0.0, 0.0]  # H_ini < ln 2: drop <H>_i > ln 2
    assert entropy_filter(h, h_ini=0.8).tolist() == [1.0] * 4  # H_ini > ln 2: keep all
    assert entropy_filter(h, h_ini=None).tolist() == [1.0] * 4
    assert entropy_filter(h, h_ini=0.5, threshold=1.05).tolist() == [1.0, 1.0, 1.0, 0.0]  # section 12 ablation


def test_initial_entropy_hand_computed():
    ent = torch.tensor([[1.0, 3.0, 9.0], [4.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert compute_initial_entropy(ent, mask) == pytest.approx((2.0 + 4.0) / 2)
    assert compute_initial_entropy(ent, mask, per_response=False) == pytest.approx(8.0 / 3)


# -- objective: eq. 7 against a direct per-response loop ---------------------------------------------
def objective_inputs(seed=0, dtype=torch.float64):
    rows, advs, groups, *_ = CASES["prefix_and_suffix"]
    rows2, advs2, groups2, *_ = CASES["both_spans"]
    rows3, advs3, groups3, *_ = CASES["zero_advantage_ignored"]
    rows = rows + rows2 + rows3
    advs = advs + advs2 + advs3
    groups = groups + [g + 1 for g in groups2] + [g + 2 for g in groups3]
    responses, mask, group_index, adv = batch(rows, advs, groups)
    gen = torch.Generator().manual_seed(seed)
    shape = responses.shape
    old_logp = -torch.rand(shape, generator=gen, dtype=dtype) * 2
    logp = (old_logp + 0.1 * torch.randn(shape, generator=gen, dtype=dtype)).requires_grad_(True)
    entropy = (torch.rand(shape, generator=gen, dtype=dtype) * 1.4).requires_grad_(True)
    inp = PolicyInputs(
        logp=logp,
        old_logp=old_logp,
        advantages=adv[:, None].expand(shape).to(dtype),
        response_mask=mask,
        responses=responses,
        group_index=group_index,
        entropy=entropy,
    )
    return inp, rows, advs, groups


def eq7_loop(inp, rows, advs, groups, *, gamma, h_ini, combine="or"):
    """-J_GTPO of GTPO (arXiv 2508.03772) eq. 7, one response at a time."""
    lam = ref_lambda(rows, advs, groups, combine)
    total = 0.0
    for i, r in enumerate(rows):
        n = len(r)
        h_i = sum(inp.entropy[i, t].item() for t in range(n)) / n
        delta = 0.0 if (h_ini is not None and h_ini < LN2 and h_i > LN2) else 1.0
        ratio = [math.exp(inp.logp[i, t].item() - inp.old_logp[i, t].item()) for t in range(n)]
        total += delta * advs[i] / n * sum(lam[i][t] * ratio[t] for t in range(n)) - gamma * h_i
    return -total / len(rows)


def authors_loop(inp, rows, advs, groups, *, gamma, h_ini, combine="product"):
    """Authors' variant (GTPO, arXiv 2508.03772, Listing 3): shifted advantage, token mean / max(1, n_conflict)."""
    lam = ref_lambda(rows, advs, groups, combine)
    fwd, bwd = ref_spans(rows, advs, groups)
    total = 0.0
    for i, r in enumerate(rows):
        n = len(r)
        h_i = sum(inp.entropy[i, t].item() for t in range(n)) / n
        keep = not (h_ini is not None and h_ini < LN2 and h_i > LN2)
        a = (advs[i] - gamma * h_i) if keep else 0.0
        n_conflict = max(1, sum(f or b for f, b in zip(fwd[i], bwd[i])))
        ratio = [math.exp(inp.logp[i, t].item() - inp.old_logp[i, t].item()) for t in range(n)]
        total += -sum(ratio[t] * a * lam[i][t] for t in range(n)) / n / n_conflict
    return total / len(rows)


@pytest.mark.parametrize("h_ini", [None, 0.5, 0.9])
@pytest.mark.parametrize("combine", ["or", "product"])
def test_penalty_objective_equals_eq7_loop(h_ini, combine):
    inp, rows, advs, groups = objective_inputs()
    out = gtpo_objective(inp, gamma=0.1, combine=combine, h_ini=h_ini)
    assert out.extra["loss_agg"] == "seq-mean-token-mean"
    got = seq_mean_token_mean(out.loss_mat, inp.response_mask).item()
    assert got == pytest.approx(eq7_loop(inp, rows, advs, groups, gamma=0.1, h_ini=h_ini, combine=combine), abs=1e-12)


@pytest.mark.parametrize("h_ini", [None, 0.5])
def test_advantage_shift_equals_authors_loop(h_ini):
    inp, rows, advs, groups = objective_inputs(seed=1)
    out = gtpo_objective(inp, gamma=0.1, combine="product", entropy_term="advantage_shift", h_ini=h_ini)
    got = seq_mean_token_mean(out.loss_mat, inp.response_mask).item()
    assert got == pytest.approx(authors_loop(inp, rows, advs, groups, gamma=0.1, h_ini=h_ini), abs=1e-12)


def test_filter_actually_drops_some_responses():
    """The fixture has responses on both sides of ln 2, so the h_ini=0.5 cases above exercise delta."""
    inp, *_ = objective_inputs()
    out = gtpo_objective(inp, gamma=0.1, h_ini=0.5)
    h = (inp.entropy * inp.response_mask).sum(-1) / inp.response_mask.sum(-1)
    want = (h > LN2).double().mean().item()
    assert 0 < want < 1
    assert out.metrics[GTPO_FILTERED_FRAC] == pytest.approx(want)
    assert gtpo_objective(inp, gamma=0.1, h_ini=0.9).metrics[GTPO_FILTERED_FRAC] == 0.0


def test_penalty_gradient_matches_finite_differences():
    """Autograd gradient of the aggregated loss w.r.t. logp and entropy vs central differences (float64)."""
    inp, *_ = objective_inputs(seed=2)

    def loss(logp, entropy):
        x = PolicyInputs(**{**inp.__dict__, "logp": logp, "entropy": entropy})
        out = gtpo_objective(x, gamma=0.1, combine="product", h_ini=0.5)
        return seq_mean_token_mean(out.loss_mat, x.response_mask)

    assert torch.autograd.gradcheck(loss, (inp.logp, inp.entropy), eps=1e-6, atol=1e-8)


def test_advantage_shift_gradient():
    """logp: central differences; entropy: no gradient, the shift uses sg(<H>_i) (authors' code)."""
    inp, *_ = objective_inputs(seed=3)

    def loss(logp, entropy):
        x = PolicyInputs(**{**inp.__dict__, "logp": logp, "entropy": entropy})
        out = gtpo_objective(x, gamma=0.1, combine="product", entropy_term="advantage_shift", h_ini=0.5)
        return seq_mean_token_mean(out.loss_mat, x.response_mask)

    assert torch.autograd.gradcheck(lambda logp: loss(logp, inp.entropy), (inp.logp,), eps=1e-6, atol=1e-8)
    loss(inp.logp, inp.entropy).backward()
    assert inp.entropy.grad is None or not inp.entropy.grad.any()


def test_conflict_fraction_and_registry():
    inp, rows, advs, groups = objective_inputs()
    out = OBJECTIVES.get("gtpo")(inp, gamma=0.0)
    fwd, bwd = ref_spans(rows, advs, groups)
    conflicts = sum(f or b for fr, br in zip(fwd, bwd) for f, b in zip(fr, br))
    assert out.metrics[GTPO_CONFLICT_FRAC] == pytest.approx(conflicts / sum(len(r) for r in rows))
    assert conflicts > 0


def test_missing_inputs_raise_clearly():
    inp, *_ = objective_inputs()
    with pytest.raises(ValueError, match="responses"):
        gtpo_objective(PolicyInputs(**{**inp.__dict__, "responses": None}))
    with pytest.raises(ValueError, match="entropy"):
        gtpo_objective(PolicyInputs(**{**inp.__dict__, "entropy": None}), gamma=0.1)
    with pytest.raises(ValueError, match="entropy_term"):
        gtpo_objective(inp, entropy_term="bonus")
    out = gtpo_objective(PolicyInputs(**{**inp.__dict__, "entropy": None}), gamma=0.0)
    assert torch.isfinite(out.loss_mat).all()


def test_extreme_token_ids_take_the_compaction_path():
    """Ids near 2**60 (keys would overflow int64) and negative ids give the same spans as small ids."""
    rng = random.Random(1)
    for _ in range(20):
        rows, advs, groups = random_batch(rng)
        responses, mask, group_index, adv = batch(rows, advs, groups)
        want = conflict_spans(responses, mask, group_index, adv)
        for shift in (2**60, -5):
            got = conflict_spans(responses + shift, mask, group_index, adv)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
