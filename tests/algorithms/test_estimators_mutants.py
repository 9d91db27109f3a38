"""Advantage estimators on the inputs that mutation testing (``make mutation``) showed the other estimator
tests leave unchecked: float64 whitening at full precision, tiny and single-token batches, empty batches,
all-equal groups whose float32 mean has rounding noise, dtypes of the outputs, the value bootstrap of
EGAE on edge rows, GPG's rescale on edge counts, the default parameters and the error messages.

Expected values come from the papers' formulas (GRPO arXiv 2402.03300 sec. 4.1.2, RLOO 2402.14740,
GPG 2504.02546 sec. 3, REINFORCE++ 2501.03262, GAE 1506.02438 eq. 16, EGAE / T-PPO 2506.15050 sec. 3.1
eq. 6), worked by hand or computed by the float64 references of ``test_ref_estimators``; batch whitening
follows verl 0.9.1's ``masked_whiten`` (``1e-8`` added to the token count and under the square root,
Bessel's correction), written out below in float64.

Run: ``pytest tests/algorithms/test_estimators_mutants.py``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from runners.algorithms.estimators import (
    compute_drgrpo_advantages,
    compute_egae_advantages,
    compute_gae_advantages,
    compute_gpg_advantages,
    compute_grpo_advantages,
    compute_loop_advantages,
    compute_rfpp_advantages,
    compute_rfpp_baseline_advantages,
    compute_rloo_advantages,
    group_inverse,
    last_real_value,
    masked_whiten,
)
from runners.algorithms.types import AdvantageInputs

from .test_ref_estimators import (
    ref_discounted_returns,
    ref_egae,
    ref_gae,
    ref_gpg,
    ref_grpo,
    ref_rfpp,
    ref_rloo,
    token_case,
)

OUTCOME_FNS = [
    compute_grpo_advantages,
    compute_drgrpo_advantages,
    compute_rloo_advantages,
    compute_loop_advantages,
    compute_gpg_advantages,
    compute_rfpp_baseline_advantages,
]


# -- batch whitening --------------------------------------------------------------------------------------
def verl_whiten(values: np.ndarray, mask: np.ndarray, *, center: bool = True) -> np.ndarray:
    """verl 0.9.1 ``masked_whiten`` in float64 loops: ``mean = sum(x m) / (n + 1e-8)``,
    ``var = sum((x - mean)^2 m) / (n + 1e-8) * n / (n - 1)`` (Bessel; no correction for n = 1),
    ``(x - mean) / sqrt(var + 1e-8)`` (``x / sqrt(var + 1e-8)`` without centring)."""
    n = 0.0
    total = 0.0
    for x, m in zip(values.ravel(), mask.ravel()):
        n += float(m)
        total += float(x) * float(m)
    mean = total / (n + 1e-8)
    sq = sum((float(x) - mean) ** 2 * float(m) for x, m in zip(values.ravel(), mask.ravel()))
    var = sq / (n + 1e-8)
    if n > 1:
        var *= n / (n - 1)
    out = np.empty(values.shape)
    for idx in np.ndindex(values.shape):
        x = float(values[idx])
        out[idx] = ((x - mean) if center else x) / math.sqrt(var + 1e-8)
    return out


def _whiten_cases():
    rng = np.random.default_rng(11)
    values = rng.normal(0.3, 1.7, (4, 6))
    holes = (rng.random((4, 6)) < 0.7).astype(np.float64)
    holes[0, 0] = 1.0
    one = np.zeros((4, 6))
    one[2, 3] = 1.0
    two = np.zeros((4, 6))
    two[1, 1] = two[3, 5] = 1.0
    three = np.zeros((4, 6))
    three[0, 2] = three[1, 4] = three[2, 0] = 1.0
    return [
        ("holes", values, holes),
        ("one_token", values, one),
        ("two_tokens", values, two),
        ("three_tokens", values, three),
        ("all", values, np.ones((4, 6))),
        ("tiny_spread", 1e-5 * values, holes),  # variance ~3e-10: the 1e-8 under the root dominates
    ]


@pytest.mark.parametrize("center", [True, False])
@pytest.mark.parametrize(("values", "mask"), [c[1:] for c in _whiten_cases()], ids=[c[0] for c in _whiten_cases()])
def test_masked_whiten_float64_is_verls_formula_to_the_last_digits(values, mask, center):
    """float64 in, float64 out, equal to the formula to 1e-12 relative: the 1e-8 terms (token count and
    variance), Bessel's n / (n - 1) from two tokens on, none for one token, and the centring all act."""
    ours = masked_whiten(torch.tensor(values), torch.tensor(mask), center=center)
    assert ours.dtype == torch.float64
    np.testing.assert_allclose(ours.numpy(), verl_whiten(values, mask, center=center), rtol=1e-12, atol=1e-300)


def test_masked_whiten_defaults_to_centring():
    values = np.array([[1.0, 2.0, 4.0], [8.0, 0.0, 0.0]])
    mask = np.array([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    ours = masked_whiten(torch.tensor(values), torch.tensor(mask))
    np.testing.assert_allclose(ours.numpy(), verl_whiten(values, mask, center=True), rtol=1e-12)


def test_masked_whiten_hand_values_in_float32():
    """Two tokens 1 and 3: mean 2, unbiased variance 2, so (-1, 1) / sqrt(2 + 1e-8); a padding entry
    (value 5) is left out of the statistics."""
    values = torch.tensor([[1.0, 5.0], [3.0, 0.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    out = masked_whiten(values, mask)
    s = math.sqrt(2.0)
    torch.testing.assert_close(out[:, 0], torch.tensor([-1 / s, 1 / s]), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(masked_whiten(values, mask, center=False)[:, 0], torch.tensor([1 / s, 3 / s]))


# -- empty batches and all-equal groups ---------------------------------------------------------------------
@pytest.mark.parametrize("fn", OUTCOME_FNS, ids=lambda f: f.__name__)
def test_outcome_estimators_accept_an_empty_batch(fn):
    inp = AdvantageInputs(torch.zeros(0, 3), torch.zeros(0, 3), torch.zeros(0, dtype=torch.long))
    adv, ret = fn(inp)
    assert adv.shape == (0, 3) and ret.shape == (0, 3)


def _noisy_constant_groups():
    """Groups {0.9 x3}, {-0.9 x3} (their float32 mean is not exactly 0.9: rounding noise of ~6e-8) and
    {1, 0, 0.5}; one token each."""
    scores = [0.9, -0.9, 1.0, 0.9, -0.9, 0.0, 0.9, -0.9, 0.5]
    groups = [0, 1, 2, 0, 1, 2, 0, 1, 2]
    rewards = torch.tensor(scores, dtype=torch.float32)[:, None]
    return AdvantageInputs(rewards, torch.ones(9, 1), torch.tensor(groups)), np.array(scores), np.array(groups)


def test_all_equal_groups_give_exactly_zero_despite_float32_rounding():
    """R_i - mean_g R = 0 for a group of equal rewards (and GRPO's 0 / (0 + eps) = 0), also when the
    float32 group mean rounds away from the common value; the informative group is unaffected."""
    inp, scores, groups = _noisy_constant_groups()
    mask = np.ones((9, 1))
    constant = groups != 2
    for fn, ref in [
        (compute_grpo_advantages, ref_grpo(scores[:, None], mask, groups)),
        (compute_drgrpo_advantages, ref_grpo(scores[:, None], mask, groups, norm_by_std=False)),
        (compute_rloo_advantages, ref_rloo(scores[:, None], mask, groups)),
    ]:
        adv, _ = fn(inp)
        assert torch.all(adv[torch.tensor(constant)] == 0), fn.__name__
        np.testing.assert_allclose(adv.double().numpy(), ref, rtol=1e-5, atol=1e-6)


def test_gpg_paper_rescale_counts_all_equal_groups_of_either_sign_as_silent():
    """GPG (arXiv 2504.02546 sec. 3) alpha = B / (B - M): the six responses of the two all-equal groups
    are silent, so alpha = 9 / 3; they get 0 and the group {1, 0, 0.5} gets 3 (R - 0.5)."""
    inp, scores, groups = _noisy_constant_groups()
    adv, _ = compute_gpg_advantages(inp, rescale="groups")
    expected = np.where(groups == 2, 3.0 * (scores - 0.5), 0.0)
    np.testing.assert_allclose(adv[:, 0].double().numpy(), expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(
        adv.double().numpy(), ref_gpg(scores[:, None], np.ones((9, 1)), groups, rescale="groups")
    )


def test_gpg_rescale_with_one_nonzero_score_and_with_no_informative_group():
    """verl's alpha = B / #non-zero scores with exactly one non-zero score: 3 / 1. The paper's alpha with
    no informative response (a singleton and an all-equal group) is B / max(B - M, 1) = 3 / 1, and the
    singleton's advantage is its score (baseline 0)."""
    rewards = torch.tensor([[2.0], [0.0], [0.0]])
    inp = AdvantageInputs(rewards, torch.ones(3, 1), torch.tensor([0, 0, 1]))
    adv, _ = compute_gpg_advantages(inp)  # group {2, 0}: centred (1, -1); singleton {0}: 0
    torch.testing.assert_close(adv[:, 0], torch.tensor([3.0, -3.0, 0.0]))
    silent = AdvantageInputs(torch.tensor([[2.0], [0.5], [0.5]]), torch.ones(3, 1), torch.tensor([7, 4, 4]))
    adv, _ = compute_gpg_advantages(silent, rescale="groups")
    torch.testing.assert_close(adv[:, 0], torch.tensor([6.0, 0.0, 0.0]))
    ref = ref_gpg(np.array([[2.0], [0.5], [0.5]]), np.ones((3, 1)), np.array([7, 4, 4]), rescale="groups")
    np.testing.assert_allclose(adv.double().numpy(), ref)


def test_gpg_rejects_a_zero_f_norm():
    inp = AdvantageInputs(torch.ones(2, 1), torch.ones(2, 1), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="f_norm"):
        compute_gpg_advantages(inp, f_norm=0.0)
    adv, _ = compute_gpg_advantages(
        AdvantageInputs(torch.tensor([[1.0], [0.0]]), torch.ones(2, 1), [0, 0]), f_norm=0.25
    )
    torch.testing.assert_close(adv[:, 0], torch.tensor([2.0 * 0.5 / 0.25, -2.0 * 0.5 / 0.25]))


# -- dtypes, masks and group ids -----------------------------------------------------------------------------
def _float64_inputs():
    case = token_case(0)
    groups = torch.tensor([0, 1, 0, 1, 2, 2, 2])
    return case, AdvantageInputs(
        torch.tensor(case.rewards, dtype=torch.float64),
        torch.tensor(case.mask, dtype=torch.float64),
        groups,
        values=torch.tensor(case.values, dtype=torch.float64),
        finished=torch.tensor(case.finished),
    )


@pytest.mark.parametrize(
    "fn",
    [*OUTCOME_FNS, compute_rfpp_advantages, compute_gae_advantages, compute_egae_advantages],
    ids=lambda f: f.__name__,
)
def test_float64_inputs_give_float32_outputs(fn):
    """The estimators' contract: float32 advantages and returns whatever the input dtype."""
    _, inp = _float64_inputs()
    adv, ret = fn(inp)
    assert adv.dtype == torch.float32 and ret.dtype == torch.float32


def test_bool_mask_and_integer_finished_flags_are_accepted():
    """A bool response_mask acts as 0/1 and finished may be 0/1 integers or floats of shape [B, 1]."""
    case = token_case(2)
    float_inp = AdvantageInputs(
        torch.tensor(case.rewards, dtype=torch.float32),
        torch.tensor(case.mask, dtype=torch.float32),
        values=torch.tensor(case.values, dtype=torch.float32),
        finished=torch.tensor(case.finished),
    )
    ref_adv, ref_ret = ref_egae(case.rewards, case.values, case.mask, case.finished, gamma=0.9, lam=0.8)
    for finished in (
        torch.tensor(case.finished.astype(np.int64)),
        torch.tensor(case.finished.astype(np.float32))[:, None],
    ):
        inp = AdvantageInputs(
            float_inp.token_rewards, float_inp.response_mask > 0, values=float_inp.values, finished=finished
        )
        adv, ret = compute_egae_advantages(inp, gamma=0.9, lam=0.8)
        np.testing.assert_allclose(adv.double().numpy(), ref_adv, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ret.double().numpy(), ref_ret, rtol=1e-5, atol=1e-6)
    rfpp, _ = compute_rfpp_advantages(AdvantageInputs(float_inp.token_rewards, float_inp.response_mask > 0))
    np.testing.assert_allclose(rfpp.double().numpy(), ref_rfpp(case.rewards, case.mask)[0], rtol=1e-5, atol=1e-6)


def test_group_inverse_dense_ids():
    """Ids are dense 0..G-1 in sorted order of the group keys, for tensors (also [B, 1]) and hashables."""
    expected = torch.tensor([2, 0, 2, 1, 0])
    torch.testing.assert_close(group_inverse(torch.tensor([9, 3, 9, 5, 3]), 5), expected)
    torch.testing.assert_close(group_inverse(torch.tensor([[9], [3], [9], [5], [3]]), 5), expected)
    torch.testing.assert_close(group_inverse(["c", "a", "c", "b", "a"], 5), expected)
    torch.testing.assert_close(group_inverse(np.array([["c"], ["a"], ["c"], ["b"], ["a"]]), 5), expected)
    out = group_inverse(np.array(["c", "a", "c", "b", "a"], dtype=object), 5, torch.device("cpu"))
    assert out.dtype == torch.long
    torch.testing.assert_close(out, expected)
    with pytest.raises(ValueError, match="group_index"):
        group_inverse(None, 3)
    with pytest.raises(ValueError, match="group_index has 2 entries for 3 responses"):
        group_inverse(torch.tensor([0, 1]), 3)
    with pytest.raises(ValueError, match="group_index has 2 entries for 3 responses"):
        group_inverse(["a", "b"], 3)


def test_outcome_scores_sum_over_tokens_per_response():
    """R_i = sum_t r_{i,t} with T != B (a square batch would hide a sum over the wrong axis)."""
    rewards = torch.tensor([[0.25, 0.0, 0.75], [0.0, 0.0, 0.0]])
    inp = AdvantageInputs(rewards, torch.ones(2, 3), torch.tensor([0, 0]))
    adv, _ = compute_drgrpo_advantages(inp)
    torch.testing.assert_close(adv, torch.tensor([[0.5] * 3, [-0.5] * 3]))


# -- last_real_value and EGAE's bootstrap ---------------------------------------------------------------------
def test_last_real_value_picks_the_last_real_token():
    """Rows: last real token at 2 (a hole before it), at 0 only, none (0 even where padding has values),
    at 3 with trailing padding; T = 5 > B = 4 would expose a wrong axis."""
    values = torch.tensor(
        [
            [1.0, 2.0, 3.0, 4.0, 5.0],
            [6.0, 7.0, 8.0, 9.0, 10.0],
            [11.0, 12.0, 13.0, 14.0, 15.0],
            [16.0, 17.0, 18.0, 19.0, 20.0],
        ]
    )
    mask = torch.tensor(
        [
            [1.0, 0.0, 1.0, 0.0, 0.0],
            [1.0, 0.0, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0, 0.0],
            [1.0, 1.0, 1.0, 1.0, 0.0],
        ]
    )
    torch.testing.assert_close(last_real_value(values, mask), torch.tensor([3.0, 6.0, 0.0, 19.0]))


def test_egae_bootstraps_a_one_token_window_from_its_own_value():
    """An unfinished response with one real token (position 0): V(s_1) = V(s_0), so with gamma = 0.5 the
    TD term is r + 0.5 V - V = 1 - 0.5 * 2 = 0; a finished one has 1 - 2 = -1 (T-PPO eq. 6)."""
    rewards = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    values = torch.tensor([[2.0, 5.0, 7.0], [2.0, 5.0, 7.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    inp = AdvantageInputs(rewards, mask, values=values, finished=torch.tensor([False, True]))
    adv, ret = compute_egae_advantages(inp, gamma=0.5, lam=0.9, whiten=False)
    torch.testing.assert_close(adv, torch.tensor([[0.0, 0.0, 0.0], [-1.0, 0.0, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[2.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))


# -- defaults -------------------------------------------------------------------------------------------------
def test_defaults_are_the_documented_ones():
    """Called without parameters: GRPO eps 1e-6 with std, GPG verl rescale with f_norm 1, REINFORCE++
    gamma 1 centred, GAE gamma = lam = 1 whitened, EGAE gamma 1, lam 0.95 whitened."""
    case = token_case(3)
    groups = np.array([0, 1, 0, 1, 2, 2, 2])
    r32 = torch.tensor(case.rewards, dtype=torch.float32)
    m32 = torch.tensor(case.mask, dtype=torch.float32)
    inp = AdvantageInputs(
        r32,
        m32,
        torch.tensor(groups),
        values=torch.tensor(case.values, dtype=torch.float32),
        finished=torch.tensor(case.finished),
    )

    def close(ours, ref):
        np.testing.assert_allclose(ours.double().numpy(), ref, rtol=1e-5, atol=1e-6)

    # scores with a small spread so that std_eps = 1e-6 is visible at rtol 1e-5
    small = AdvantageInputs(r32 * 1e-3, m32, torch.tensor(groups))
    close(compute_grpo_advantages(small)[0], ref_grpo(case.rewards * 1e-3, case.mask, groups, std_eps=1e-6))
    close(compute_gpg_advantages(inp)[0], ref_gpg(case.rewards, case.mask, groups, rescale="verl", f_norm=1.0))
    adv, ret = compute_rfpp_advantages(inp)
    ref_adv, ref_ret = ref_rfpp(case.rewards, case.mask, gamma=1.0, center=True)
    close(adv, ref_adv)
    close(ret, ref_ret)
    adv, ret = compute_gae_advantages(inp)
    ref_adv, ref_ret = ref_gae(case.rewards, case.values, case.mask, gamma=1.0, lam=1.0, whiten=True)
    close(adv, ref_adv)
    close(ret, ref_ret)
    adv, ret = compute_egae_advantages(inp)
    ref_adv, ref_ret = ref_egae(case.rewards, case.values, case.mask, case.finished, gamma=1.0, lam=0.95, whiten=True)
    close(adv, ref_adv)
    close(ret, ref_ret)


# -- token returns ----------------------------------------------------------------------------------------------
def test_discounted_returns_with_holes_and_t_greater_than_b():
    """REINFORCE++ returns G_t = r_t + gamma G_{next real token}, zero off the mask (B = 2, T = 5)."""
    rewards = np.array([[0.5, 0.0, 1.0, 0.0, 2.0], [1.0, 1.0, 0.0, 0.0, 0.0]])
    mask = np.array([[1.0, 0.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0, 0.0]])
    _, ret = compute_rfpp_advantages(
        AdvantageInputs(torch.tensor(rewards, dtype=torch.float32), torch.tensor(mask, dtype=torch.float32)),
        gamma=0.5,
    )
    expected = ref_discounted_returns(rewards, mask, 0.5)
    np.testing.assert_allclose(expected[0], [0.5 + 0.5 * 1.5, 0.0, 1.5, 1.0, 2.0])
    np.testing.assert_allclose(ret.double().numpy(), expected, rtol=1e-6)


# -- error messages ------------------------------------------------------------------------------------------------
def test_error_messages_name_the_field():
    with pytest.raises(ValueError, match=r"token_rewards \(2, 3\) and response_mask \(2, 4\)"):
        compute_grpo_advantages(AdvantageInputs(torch.zeros(2, 3), torch.ones(2, 4), torch.tensor([0, 0])))
    with pytest.raises(ValueError, match=r"must both be \[B,T\]"):
        compute_rfpp_advantages(AdvantageInputs(torch.zeros(3), torch.ones(3)))
    with pytest.raises(ValueError, match="inp.group_index is required"):
        compute_rloo_advantages(AdvantageInputs(torch.zeros(2, 3), torch.ones(2, 3)))
    with pytest.raises(ValueError, match=r"gae needs critic values: inp.values \[B,T\] is None"):
        compute_gae_advantages(AdvantageInputs(torch.zeros(2, 3), torch.ones(2, 3)))
    with pytest.raises(ValueError, match=r"egae needs critic values"):
        compute_egae_advantages(AdvantageInputs(torch.zeros(2, 3), torch.ones(2, 3), finished=torch.ones(2) > 0))
    with pytest.raises(ValueError, match=r"gae: inp.values \(2, 2\) must match response_mask \(2, 3\)"):
        compute_gae_advantages(AdvantageInputs(torch.zeros(2, 3), torch.ones(2, 3), values=torch.zeros(2, 2)))
    with pytest.raises(ValueError, match=r"egae needs inp.finished \[B\]"):
        compute_egae_advantages(AdvantageInputs(torch.zeros(2, 3), torch.ones(2, 3), values=torch.zeros(2, 3)))
    with pytest.raises(ValueError, match=r"egae: inp.finished has 3 entries for 2 responses"):
        compute_egae_advantages(
            AdvantageInputs(torch.zeros(2, 3), torch.ones(2, 3), values=torch.zeros(2, 3), finished=torch.ones(3) > 0)
        )
    with pytest.raises(ValueError, match=r"gpg rescale='bogus'; valid values: verl, groups, none$"):
        compute_gpg_advantages(AdvantageInputs(torch.zeros(2, 1), torch.ones(2, 1), [0, 0]), rescale="bogus")
