"""GTPO (arXiv 2508.03772) cases aimed at mutation testing (``make mutation``) of runners/algorithms/gtpo.py.

Each test compares the library with values written here by hand or with the plain-loop references of
``test_ref_gtpo.py`` (section 5.1 conflict spans, eq. 5 weights, eq. 6 filter, eq. 7 loss), on inputs the
main tests do not reach:

- H_ini (section 5.2) with an all-padding response, for int, bool and float masks;
- input errors: each message names the offending input (shapes, the first row that is not right-padded, the
  valid modes, the missing PolicyInputs fields, a filter asked for without entropies);
- token ids near 2**62, where (group, position, id) keys built from the raw ids would wrap in int64;
- defaults (eq. 5 weight 2 with M_fw OR M_bw, gamma = 0.1, eq. 7 penalty) through calls without options;
- dtypes of the weights, the filter and the objective's extras; H_ini = ln 2 (no filter);
- the ablation threshold of the filter (sections 12-13), the advantage shift without entropies, and the
  metrics of a batch with one real response;
- a response_mask that is not [B,T] (1-D or 3-D) given to gtpo_objective: conflict_spans' ValueError naming
  both shapes, not an error of the masked mean that precedes it.

Run: ``pytest tests/algorithms/test_gtpo_mutants.py``.
"""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch

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
from tests.algorithms.test_ref_gtpo import (
    GAMMA,
    MEAN_ENTROPY,
    TOL,
    _leaves,
    make_gtpo_case,
    make_inputs,
    ref_conflict_spans,
    ref_entropy_filter,
    ref_gtpo_loss,
    ref_lambda,
    ref_mean_entropies,
)

LN2 = math.log(2.0)


# -- H_ini (section 5.2) --------------------------------------------------------------------------------
@pytest.mark.parametrize("mask_dtype", [torch.int64, torch.bool, torch.float32])
def test_initial_entropy_skips_responses_without_tokens(mask_dtype):
    """The per-response statistic averages <H>_i over responses that have at least one token: an all-padding
    row (its masked mean is 0) is left out of the mean, not counted as a response of entropy 0."""
    ent = torch.tensor([[1.0, 3.0, 9.0], [5.0, 7.0, 9.0], [4.0, 9.0, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]]).to(mask_dtype)
    assert compute_initial_entropy(ent, mask) == pytest.approx((2.0 + 4.0) / 2, abs=1e-12)
    assert compute_initial_entropy(ent, mask, per_response=False) == pytest.approx((1.0 + 3.0 + 4.0) / 3, abs=1e-12)


# -- input errors name the offending field --------------------------------------------------------------
def _spans(responses, mask, groups, advs):
    return conflict_spans(torch.tensor(responses), torch.tensor(mask), torch.tensor(groups), torch.tensor(advs))


def test_conflict_spans_shape_errors_name_the_inputs():
    ok_ids, ok_mask = [[1, 2, 3], [1, 2, 4]], [[1, 1, 1], [1, 1, 0]]
    with pytest.raises(ValueError, match=re.escape("responses (2, 3) and response_mask (2, 2) must be [B,T]")):
        _spans(ok_ids, [[1, 1], [1, 1]], [0, 0], [1.0, -1.0])
    with pytest.raises(ValueError, match=re.escape("responses (1, 2, 3) and response_mask (1, 2, 3) must be [B,T]")):
        _spans([ok_ids], [ok_mask], [0], [1.0])
    with pytest.raises(ValueError, match=re.escape("responses (3,) and response_mask (3,) must be [B,T]")):
        _spans([1, 2, 3], [1, 1, 1], [0, 0, 0], [1.0, -1.0, 1.0])
    with pytest.raises(ValueError, match=re.escape("group_index (3,) and advantages_seq (2,) must be [B] with B=2")):
        _spans(ok_ids, ok_mask, [0, 0, 0], [1.0, -1.0])
    with pytest.raises(ValueError, match=re.escape("group_index (2,) and advantages_seq (1,) must be [B] with B=2")):
        _spans(ok_ids, ok_mask, [0, 0], [1.0])
    with pytest.raises(TypeError, match="integer token ids"):
        _spans([[1.0, 2.0]], [[1, 1]], [0], [1.0])


def test_right_padding_error_names_the_first_bad_row():
    """Rows 1 and 2 are not prefixes of ones (row 0 is): the message names row 1 and shows its mask."""
    ids = [[1, 2, 3], [1, 2, 3], [1, 2, 3]]
    with pytest.raises(ValueError, match=re.escape("right-padded (ones then zeros); row 1 is not: [1, 0, 1]")):
        _spans(ids, [[1, 1, 0], [1, 0, 1], [0, 1, 0]], [0, 0, 0], [1.0, -1.0, 1.0])


def test_unknown_modes_list_the_valid_ones():
    args = (torch.tensor([[1, 2]]), torch.tensor([[1, 1]]), torch.tensor([0]), torch.tensor([1.0]))
    with pytest.raises(ValueError, match=re.escape("unknown GTPO combine 'and'; valid: or, product")):
        gtpo_weights(*args, combine="and")
    case = make_gtpo_case()
    logp, entropy = _leaves(case)
    with pytest.raises(
        ValueError, match=re.escape("unknown GTPO entropy_term 'bonus'; valid: penalty, advantage_shift")
    ):
        gtpo_objective(make_inputs(case, logp, entropy), entropy_term="bonus")


def test_missing_group_index_names_both_fields():
    case = make_gtpo_case()
    logp, entropy = _leaves(case)
    inp = make_inputs(case, logp, entropy)
    want = re.escape("gtpo objective needs PolicyInputs.responses (token ids) and PolicyInputs.group_index")
    for field in ("responses", "group_index"):
        with pytest.raises(ValueError, match=want):
            gtpo_objective(dataclasses.replace(inp, **{field: None}))


def test_filter_without_entropies_is_an_error_and_ln2_is_no_filter():
    """gamma = 0 needs no entropies unless eq. 6 filters (H_ini < ln 2); H_ini = ln 2 and above keep all
    responses (eq. 6 leaves ln 2 open; the library keeps all), so they run without entropies."""
    case = make_gtpo_case()
    logp, entropy = _leaves(case)
    inp = make_inputs(case, logp, None)
    with pytest.raises(ValueError, match=r"PolicyInputs\.entropy for gamma=0.0 / h_ini=0.5"):
        gtpo_objective(inp, gamma=0.0, h_ini=0.5)
    want = ref_gtpo_loss(
        logp, case.old_logp, entropy, case.rows, case.advs, case.groups, h_ini=1.0, gamma=0.0
    )  # h_ini above ln 2: no response dropped
    for h_ini in (LN2, 0.9, None):
        out = gtpo_objective(inp, gamma=0.0, h_ini=h_ini)
        torch.testing.assert_close(seq_mean_token_mean(out.loss_mat, case.mask), want, **TOL)
        assert out.extra["gtpo_delta"].tolist() == [1.0] * len(case.rows)


# -- conflict detection with token ids near the int64 range ---------------------------------------------
def test_huge_token_ids_do_not_alias_other_positions():
    """Ids up to 2**62 - 1 in one group of 5-token responses: (group, position, id) keys built from the raw ids
    would exceed int64 and wrap, so that id X at position 0 and id X at position 4 meet (4 * 2**62 = 2**64).
    Here X sits at position 0 of the positive and at position 4 of the negative response (offsets 4 and 0
    from their ends), so nothing is aligned: no forward or backward span (section 5.1), lambda = 1."""
    x = 2**62 - 1
    rows = [[x, 1, 2, 3, 4], [5, 6, 7, 8, x]]
    advs, groups = [1.0, -1.0], [0, 0]
    forward, backward = _spans(rows, [[1] * 5, [1] * 5], groups, advs)
    ref_fw, ref_bw = ref_conflict_spans(rows, advs, groups)
    assert forward.tolist() == ref_fw == [[False] * 5] * 2
    assert backward.tolist() == ref_bw == [[False] * 5] * 2
    # a real conflict at the huge id is still found: both responses start and end with X
    rows = [[x, 1, 2, 3, x], [x, 6, 7, 8, x]]
    forward, backward = _spans(rows, [[1] * 5, [1] * 5], groups, advs)
    ref_fw, ref_bw = ref_conflict_spans(rows, advs, groups)
    assert forward.tolist() == ref_fw == [[True, False, False, False, False]] * 2
    assert backward.tolist() == ref_bw == [[False, False, False, False, True]] * 2


# -- defaults: the paper's values (gamma 0.1, M_fw OR M_bw, weight 2, eq. 7 penalty) --------------------
def test_gtpo_weights_defaults_are_eq5():
    """Identical responses (every token in both spans): the default is the paper's OR with weight 2."""
    args = (torch.tensor([[1, 2, 3], [1, 2, 3]]), torch.ones(2, 3), torch.tensor([0, 0]), torch.tensor([0.5, -0.5]))
    assert gtpo_weights(*args).tolist() == [[2.0, 2.0, 2.0], [0.0, 0.0, 0.0]]


def test_gtpo_objective_defaults_are_eq7():
    """Called without options: eq. 7 with gamma = 0.1 and the OR weights, no filter (h_ini unknown)."""
    case = make_gtpo_case()
    logp, entropy = _leaves(case)
    out = gtpo_objective(make_inputs(case, logp, entropy))
    want = ref_gtpo_loss(logp, case.old_logp, entropy, case.rows, case.advs, case.groups, h_ini=1.0, gamma=0.1)
    torch.testing.assert_close(seq_mean_token_mean(out.loss_mat, case.mask), want, **TOL)
    lam = ref_lambda(case.rows, case.advs, case.groups, "or")
    width = case.mask.shape[1]
    assert out.extra["gtpo_lambda"].tolist() == [r + [0.0] * (width - len(r)) for r in lam]
    assert out.extra["gtpo_delta"].tolist() == [1.0] * len(case.rows)
    assert GAMMA == 0.1


# -- dtypes -----------------------------------------------------------------------------------------------
def test_weights_come_in_the_default_float_dtype():
    """gtpo_weights returns the default float dtype whatever the mask's dtype (a float64 or bool mask)."""
    args = (torch.tensor([[1, 2, 3], [1, 2, 4]]), torch.tensor([0, 0]), torch.tensor([1.0, -1.0]))
    for mask in (torch.ones(2, 3, dtype=torch.float64), torch.ones(2, 3, dtype=torch.bool)):
        lam = gtpo_weights(args[0], mask, *args[1:])
        assert lam.dtype == torch.get_default_dtype()
        assert lam.tolist() == [[2.0, 2.0, 1.0], [0.0, 0.0, 1.0]]


def test_entropy_filter_dtype_and_ln2_boundary():
    """delta has the entropies' dtype; H_ini exactly ln 2 keeps every response (eq. 6 leaves it open)."""
    h = torch.tensor([0.1, 0.9, 2.0], dtype=torch.float64)
    for h_ini, want in ((0.5, [1.0, 0.0, 0.0]), (LN2, [1.0, 1.0, 1.0]), (None, [1.0, 1.0, 1.0])):
        got = entropy_filter(h, h_ini)
        assert got.dtype == torch.float64 and got.tolist() == want


def test_objective_extras_follow_the_log_prob_dtype():
    """float64 log-probs with float32 entropies: lambda and delta come back in float64 (the loss dtype), and the
    loss with a conflict weight of 3 instead of 2 is eq. 7 with those weights."""
    case = make_gtpo_case()
    logp, entropy = _leaves(case)
    inp = make_inputs(case, logp, entropy.detach().float())
    out = gtpo_objective(inp, gamma=0.0, h_ini=0.5, conflict_weight=3.0)
    assert out.extra["gtpo_lambda"].dtype == torch.float64 and out.extra["gtpo_delta"].dtype == torch.float64
    lam = ref_lambda(case.rows, case.advs, case.groups, "or", weight=3.0)
    delta = ref_entropy_filter(ref_mean_entropies(inp.entropy.double(), case.rows), 0.5)
    width = case.mask.shape[1]
    assert out.extra["gtpo_lambda"].tolist() == [r + [0.0] * (width - len(r)) for r in lam]
    assert out.extra["gtpo_delta"].tolist() == delta
    want = 0.0
    for i, row in enumerate(case.rows):  # eq. 7 with gamma = 0, one response at a time
        ratio = [math.exp(float(logp[i, t].detach() - case.old_logp[i, t])) for t in range(len(row))]
        want -= delta[i] * case.advs[i] * sum(lam[i][t] * ratio[t] for t in range(len(row))) / len(row)
    got = seq_mean_token_mean(out.loss_mat, case.mask)
    assert got.dtype == torch.float64
    assert float(got.detach()) == pytest.approx(want / len(case.rows), rel=1e-12, abs=1e-14)

    out = gtpo_objective(make_inputs(case, logp, None), gamma=0.0)  # no entropies: delta = 1 in float64
    assert out.extra["gtpo_delta"].dtype == torch.float64 and out.extra["gtpo_delta"].tolist() == [1.0] * 16


# -- filter threshold, advantage shift without entropies, metrics on small batches ------------------------
def test_objective_passes_the_entropy_threshold_to_the_filter():
    """Ablation threshold (sections 12-13) 1.05 instead of ln 2: responses with <H>_i in (ln 2, 1.05] are kept."""
    case = make_gtpo_case()
    logp, entropy = _leaves(case)
    out = gtpo_objective(make_inputs(case, logp, entropy), h_ini=0.5, entropy_threshold=1.05)
    want = ref_entropy_filter(ref_mean_entropies(entropy, case.rows), 0.5, threshold=1.05)
    assert want != ref_entropy_filter(MEAN_ENTROPY, 0.5)
    assert out.extra["gtpo_delta"].tolist() == want
    assert out.metrics[GTPO_FILTERED_FRAC] == pytest.approx(want.count(0.0) / len(want), abs=1e-12)


def test_advantage_shift_without_entropies():
    """entropy_term="advantage_shift" with gamma = 0 and no filter runs without entropies: A_i unshifted."""
    case = make_gtpo_case()
    logp, entropy = _leaves(case)
    out = gtpo_objective(make_inputs(case, logp, None), gamma=0.0, combine="product", entropy_term="advantage_shift")
    want = ref_gtpo_loss(
        logp,
        case.old_logp,
        entropy,
        case.rows,
        case.advs,
        case.groups,
        h_ini=1.0,
        gamma=0.0,
        combine="product",
        entropy_term="advantage_shift",
    )
    torch.testing.assert_close(seq_mean_token_mean(out.loss_mat, case.mask), want, **TOL)


def test_filtered_fraction_counts_only_responses_with_tokens():
    """One real response (dropped by eq. 6: <H> = 1.0 > ln 2 with H_ini = 0.5) and one all-padding row: the
    filtered fraction is 1 out of the 1 response with tokens, and no token is in a conflict span."""
    mask = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    logp = torch.full((2, 3), -1.0, dtype=torch.float64)
    inp = PolicyInputs(
        logp=logp,
        old_logp=logp - 0.2,
        advantages=torch.tensor([[1.0] * 3, [0.0] * 3], dtype=torch.float64),
        response_mask=mask,
        responses=torch.tensor([[4, 5, 6], [0, 0, 0]]),
        group_index=torch.tensor([0, 0]),
        entropy=torch.ones(2, 3, dtype=torch.float64),
    )
    out = gtpo_objective(inp, h_ini=0.5)
    assert out.metrics[GTPO_FILTERED_FRAC] == 1.0
    assert out.metrics[GTPO_CONFLICT_FRAC] == 0.0
    assert out.extra["gtpo_delta"].tolist() == [0.0, 1.0]
    # dropped response: only the entropy penalty gamma * H_t remains; padding is 0
    assert out.loss_mat.tolist() == [[0.1, 0.1, 0.1], [0.0, 0.0, 0.0]]


# -- the objective's own input checks -------------------------------------------------------------------
def test_objective_rejects_a_response_mask_that_is_not_b_t():
    """A 1-D response_mask [T] broadcasts against the [B,T] advantages, but section 5.1's aligned positions need
    one mask row per response: gtpo_objective stops with conflict_spans' ValueError naming both shapes, as for
    a 3-D mask, before it builds any loss."""
    logp = torch.full((2, 3), -1.0, dtype=torch.float64)
    inp = PolicyInputs(
        logp=logp,
        old_logp=logp - 0.2,
        advantages=torch.tensor([[1.0] * 3, [-1.0] * 3], dtype=torch.float64),
        response_mask=torch.ones(2, 3, dtype=torch.float64),
        responses=torch.tensor([[4, 5, 6], [4, 5, 7]]),
        group_index=torch.tensor([0, 0]),
        entropy=torch.ones(2, 3, dtype=torch.float64),
    )
    assert gtpo_objective(inp).extra["gtpo_lambda"].tolist() == [[2.0, 2.0, 1.0], [0.0, 0.0, 1.0]]
    for bad in (torch.ones(3, dtype=torch.float64), torch.ones(1, 2, 3, dtype=torch.float64)):
        want = f"responses (2, 3) and response_mask {tuple(bad.shape)} must be [B,T]"
        with pytest.raises(ValueError, match=re.escape(want)):
            gtpo_objective(dataclasses.replace(inp, response_mask=bad))


@pytest.mark.parametrize("logp_dtype", [torch.float32, torch.bfloat16])
def test_advantage_shift_divides_by_the_exact_conflict_count(logp_dtype):
    """``entropy_term="advantage_shift"`` divides each token's loss by its response's conflict-token count
    (GTPO arXiv 2508.03772, section 16, Listing 3). Two identical responses of 257 tokens with opposite
    advantages: every token is on a conflict span, the positive response's tokens carry weight 2 (eq. 5's
    conflict weight) and its row sums to -2 exactly, also with bfloat16 log-probs and float32 advantages
    (a count rounded to bfloat16 is 256: the row summed to -2.0078)."""
    T = 257
    responses = torch.arange(3, 3 + T).repeat(2, 1)
    logp = torch.zeros(2, T, dtype=logp_dtype)
    inp = PolicyInputs(
        logp=logp,
        old_logp=logp.clone(),
        advantages=torch.tensor([[1.0], [-1.0]]).expand(2, T).contiguous(),
        response_mask=torch.ones(2, T),
        responses=responses,
        group_index=torch.tensor([0, 0]),
    )
    out = gtpo_objective(inp, entropy_term="advantage_shift", gamma=0.0)
    assert out.loss_mat.dtype == torch.float32
    assert float(out.loss_mat[0].sum()) == pytest.approx(-2.0, abs=1e-6)
    assert float(out.loss_mat[0, 0]) == pytest.approx(-2.0 / T, rel=1e-6)
