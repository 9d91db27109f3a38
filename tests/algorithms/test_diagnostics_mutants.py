"""Post-update diagnostics (runners/algorithms/diagnostics.py): exact values of the coarse KL with its rest
bin, unused slots and zero-probability kept ids, its non-negativity, the strict eps comparison and the
metric names of ``kl_exceedance``, and GTPO's conflict tokens on a hand-worked group, found by mutation
testing.

References: the coarse-grained KL(q || p) over the kept ids plus one rest bin (TROLL, arXiv 2510.03817,
eq. 4) evaluated in float64 loops with ``math``; Gibbs' inequality (KL >= 0); metric names written out;
conflict spans worked by hand from GTPO (arXiv 2508.03772, section 5.1).

Run: ``pytest tests/algorithms/test_diagnostics_mutants.py``.
"""

from __future__ import annotations

import math

import pytest
import torch

from runners.algorithms.diagnostics import coarse_reverse_kl, conflict_tokens, kl_exceedance

NEG_INF = float("-inf")


def _ref_coarse_kl(new_logits: torch.Tensor, index: torch.Tensor, old_topk_logp: torch.Tensor) -> list[float]:
    """sum_{kept} q log(q / p) + q_rest log(q_rest / p_rest), 0 log 0 = 0, in float64 loops."""
    out = []
    for row, ids, logps in zip(new_logits.double().tolist(), index.tolist(), old_topk_logp.double().tolist()):
        finite = [x for x in row if x != NEG_INF]
        top = max(finite)
        z = top + math.log(math.fsum(math.exp(x - top) for x in finite))
        kl, q_kept, p_kept = [], [], []
        for i, lp in zip(ids, logps):
            if lp == NEG_INF:
                continue  # unused slot
            q = math.exp(row[i] - z) if row[i] != NEG_INF else 0.0
            p = math.exp(lp)
            q_kept.append(q)
            p_kept.append(p)
            if q > 0:
                kl.append(q * (row[i] - z - lp))
        q_rest = max(1.0 - math.fsum(q_kept), 0.0)
        p_rest = max(1.0 - math.fsum(p_kept), 0.0)
        if q_rest > 0:
            kl.append(q_rest * (math.log(q_rest) - math.log(p_rest)))
        out.append(max(math.fsum(kl), 0.0))
    return out


def test_coarse_kl_equals_the_rest_bin_formula():
    g = torch.Generator().manual_seed(3)
    vocab = 10
    old = torch.randn(6, vocab, generator=g, dtype=torch.float64) * 1.5
    new = old + torch.randn(6, vocab, generator=g, dtype=torch.float64) * 0.6
    old_logp = torch.log_softmax(old, -1)
    index = torch.topk(old, 4, dim=-1).indices
    topk = old_logp.gather(-1, index)
    topk[1, 3] = NEG_INF  # unused slots: not kept, their mass goes to the rest bin
    topk[4, 2:] = NEG_INF
    ours = coarse_reverse_kl(new, index, topk)
    assert ours.dtype == torch.float64 and ours.shape == (6,)
    ref = _ref_coarse_kl(new, index, topk)
    assert ours.tolist() == pytest.approx(ref, rel=1e-10, abs=1e-15)
    # hand check of one row: kept {a, b}, the rest bin holds everything else
    q = torch.softmax(new[4], -1)
    p = torch.softmax(old[4], -1)
    a, b = index[4, 0], index[4, 1]
    q_rest, p_rest = 1 - q[a] - q[b], 1 - p[a] - p[b]
    hand = q[a] * math.log(q[a] / p[a]) + q[b] * math.log(q[b] / p[b]) + q_rest * math.log(q_rest / p_rest)
    assert float(ours[4]) == pytest.approx(float(hand), rel=1e-10)


def test_coarse_kl_with_a_kept_id_of_zero_new_probability():
    # the new policy puts -inf on kept id 2 (q = 0: its term is 0 log 0 = 0) and on the rest of the vocabulary
    new = torch.tensor([[0.3, -0.2, NEG_INF, NEG_INF, NEG_INF]], dtype=torch.float64)
    index = torch.tensor([[0, 1, 2, 4]])
    old_topk = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.0]], dtype=torch.float64))  # slot 3 unused (-inf)
    ours = coarse_reverse_kl(new, index, old_topk)
    q0, q1 = math.exp(0.3) / (math.exp(0.3) + math.exp(-0.2)), math.exp(-0.2) / (math.exp(0.3) + math.exp(-0.2))
    hand = q0 * math.log(q0 / 0.4) + q1 * math.log(q1 / 0.3)  # q_rest = 0, p_rest = 0.1
    assert torch.isfinite(ours).all()
    assert float(ours[0]) == pytest.approx(hand, rel=1e-12)


def test_coarse_kl_of_a_rest_bin_the_old_policy_does_not_cover():
    # p's kept ids hold all of its mass (p_rest = 0) but q leaves some outside: the KL is large and finite
    new = torch.tensor([[1.0, 0.5, 0.0, -1.0]], dtype=torch.float64)
    index = torch.tensor([[0, 1]])
    old_topk = torch.log(torch.tensor([[0.75, 0.25]], dtype=torch.float64))
    ours = float(coarse_reverse_kl(new, index, old_topk)[0])
    q = torch.softmax(new[0], -1).tolist()
    q_rest = q[2] + q[3]
    kept = q[0] * math.log(q[0] / 0.75) + q[1] * math.log(q[1] / 0.25)
    # the rest bin's log p_rest is floored at log(1e-300) = -690.8
    assert ours == pytest.approx(kept + q_rest * (math.log(q_rest) + 300 * math.log(10)), rel=1e-12)


def test_coarse_kl_is_never_negative():
    # nearly identical policies (logits 1e-9 apart): the KL, ~1e-18, is below the rounding of its sum
    # (~1e-16, up to ~1e-13 through the rest bin), which must not make it negative (Gibbs' inequality)
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(400, 17, generator=g, dtype=torch.float64) * 3
    old = logits + 1e-9 * torch.randn(400, 17, generator=g, dtype=torch.float64)
    logp = torch.log_softmax(old, -1)
    full = torch.arange(17).expand(400, 17)
    kl = coarse_reverse_kl(logits, full, logp)
    assert (kl >= 0).all() and float(kl.max()) < 1e-12
    top = torch.topk(logits, 5, dim=-1).indices
    kl_top = coarse_reverse_kl(logits, top, logp.gather(-1, top))
    assert (kl_top >= 0).all() and float(kl_top.max()) < 1e-12


def test_kl_exceedance_is_strict_and_names_both_policies():
    eps = (0.01, 0.02, 0.05, 0.1, 0.2)
    # one token at each eps exactly (not above it), one just above 0.05, one far above all
    kl = torch.tensor([0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.05 + 1e-12, 3.0], dtype=torch.float64)
    expected = {0.01: 6 / 8, 0.02: 5 / 8, 0.05: 4 / 8, 0.1: 2 / 8, 0.2: 1 / 8}
    got = kl_exceedance(kl)
    assert got == pytest.approx({f"actor/post_update_kl_frac_above_{e:g}": expected[e] for e in eps})
    sampler = kl_exceedance(kl, sampler=True)
    assert sampler == pytest.approx({f"actor/post_update_kl_sampler_frac_above_{e:g}": expected[e] for e in eps})
    assert all(isinstance(v, float) for v in got.values())


def _group_batch():
    """Two prompt groups, worked by hand (GTPO section 5.1).

    group 0: r0 = 5 6 7 8 (A > 0), r1 = 5 6 9 8 (A < 0), r2 = 5 3 3 (A = 0: mean of +1, -1, 0; the padding 5 is
    not counted); group 1: r3 = 1 2 (A > 0), r4 = 1 4 2 (A < 0).
    forward spans: r0, r1 positions 0-1; r3, r4 position 0. backward spans (from each end): r0, r1 their last
    token (8 = 8, then 7 != 9); r3, r4 their last token (2 = 2, then 1 != 4). r2 has none.
    """
    responses = torch.tensor([[5, 6, 7, 8], [5, 6, 9, 8], [5, 3, 3, 0], [1, 2, 0, 0], [1, 4, 2, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.float32)
    advantages = torch.tensor(
        [[0.5, 1.0, 0.2, 0.1], [-1.0, -0.3, -0.2, -0.4], [1.0, -1.0, 0.0, 5.0], [2.0, 0.1, 0.0, 0.0], [-0.1] * 4]
    )
    data = {"responses": responses, "response_mask": mask, "group_index": torch.tensor([7, 7, 7, 3, 3])}
    return data, advantages, mask


def test_conflict_tokens_are_the_union_of_forward_and_backward_spans():
    data, advantages, mask = _group_batch()
    got = conflict_tokens(data["responses"], data["response_mask"], data["group_index"], advantages, mask=mask)
    expected = torch.tensor(
        [
            [True, True, False, True],
            [True, True, False, True],
            [False, False, False, False],
            [True, True, False, False],
            [True, False, True, False],
        ]
    )
    assert got.dtype == torch.bool
    assert torch.equal(got, expected)


def test_conflict_tokens_only_on_tokens_of_the_given_mask():
    data, advantages, mask = _group_batch()
    trained = mask.clone()
    trained[0, 3] = 0.0  # a token left out of training (data's mask keeps it): not reported
    got = conflict_tokens(data["responses"], data["response_mask"], data["group_index"], advantages, mask=trained)
    assert got[0].tolist() == [True, True, False, False]
    assert got[1].tolist() == [True, True, False, True]
    assert not got[trained == 0].any()
