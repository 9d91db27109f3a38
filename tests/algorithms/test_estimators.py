"""Advantage estimators against verl's own functions, hand-computed EGAE cases, a Monte-Carlo check
of EGAE on a random walk with an exactly solved value function, and property tests on extreme inputs.

Run: ``pytest tests/algorithms/test_estimators.py`` (the ``verl`` tests import verl's core_algos).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from runners.algorithms import ESTIMATORS
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
)
from runners.algorithms.types import AdvantageInputs

from ._ref_batches import outcome_batch, random_mask

SEEDS = [0, 1, 2]


@pytest.fixture(scope="module")
def core_algos():
    return pytest.importorskip("verl.trainer.ppo.core_algos")


def _close(ours: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor, tol: float = 1e-5) -> None:
    torch.testing.assert_close(ours * mask, ref.float() * mask, rtol=tol, atol=tol)


# -- agreement with verl ---------------------------------------------------------------------
@pytest.mark.verl
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_and_drgrpo_match_verl(core_algos, seed, norm_by_std):
    """GRPO (and Dr.GRPO = norm_adv_by_std_in_grpo=False) equal verl's compute_grpo_outcome_advantage,
    singleton group included; verl's uid strings and our long ids give the same result."""
    rewards, mask, groups, uids = outcome_batch(seed)
    ref, _ = core_algos.compute_grpo_outcome_advantage(
        rewards.clone(), mask.clone(), uids, norm_adv_by_std_in_grpo=norm_by_std
    )
    ours, returns = compute_grpo_advantages(AdvantageInputs(rewards, mask, groups), norm_by_std=norm_by_std)
    _close(ours, ref, mask)
    _close(returns, ref, mask)
    by_uid, _ = compute_grpo_advantages(AdvantageInputs(rewards, mask, uids), norm_by_std=norm_by_std)
    torch.testing.assert_close(by_uid, ours)
    if not norm_by_std:
        torch.testing.assert_close(compute_drgrpo_advantages(AdvantageInputs(rewards, mask, groups))[0], ours)


@pytest.mark.verl
@pytest.mark.parametrize("seed", SEEDS)
def test_rloo_and_loop_match_verl(core_algos, seed):
    """RLOO equals verl's compute_rloo_outcome_advantage; LOOP uses the same advantages."""
    rewards, mask, groups, uids = outcome_batch(seed)
    ref, _ = core_algos.compute_rloo_outcome_advantage(rewards.clone(), mask.clone(), uids)
    inp = AdvantageInputs(rewards, mask, groups)
    _close(compute_rloo_advantages(inp)[0], ref, mask)
    _close(compute_loop_advantages(inp)[0], ref, mask)


@pytest.mark.verl
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_rfpp_matches_verl(core_algos, seed, gamma):
    """REINFORCE++ (token returns, global whitening) equals verl's, incl. masks with interior holes."""
    from verl.trainer.config import AlgoConfig

    gen = torch.Generator().manual_seed(seed)
    mask = random_mask(gen, 12, 8, holes=True)
    rewards = torch.randn(12, 8, generator=gen) * mask
    ref_adv, ref_ret = core_algos.compute_reinforce_plus_plus_outcome_advantage(
        rewards.clone(), mask.clone(), config=AlgoConfig(gamma=gamma)
    )
    adv, ret = compute_rfpp_advantages(AdvantageInputs(rewards, mask), gamma=gamma)
    _close(adv, ref_adv, mask)
    _close(ret, ref_ret, mask)


@pytest.mark.verl
@pytest.mark.parametrize("seed", SEEDS)
def test_rfpp_baseline_matches_verl(core_algos, seed):
    """REINFORCE++-baseline (group mean, then global whitening) equals verl's."""
    rewards, mask, groups, uids = outcome_batch(seed)
    ref, _ = core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(rewards.clone(), mask.clone(), uids)
    _close(compute_rfpp_baseline_advantages(AdvantageInputs(rewards, mask, groups))[0], ref, mask)


@pytest.mark.verl
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("binary", [True, False])
def test_gpg_matches_verl(core_algos, seed, binary):
    """GPG with rescale="verl" equals verl's compute_gpg_outcome_advantage (alpha = B / #non-zero)."""
    rewards, mask, groups, uids = outcome_batch(seed, binary=binary)
    ref, _ = core_algos.compute_gpg_outcome_advantage(rewards.clone(), mask.clone(), uids)
    _close(compute_gpg_advantages(AdvantageInputs(rewards, mask, groups))[0], ref, mask)


@pytest.mark.verl
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae_matches_verl(core_algos, seed, gamma, lam):
    """GAE (whitened advantages, returns = raw + values) equals verl's compute_gae_advantage_return,
    incl. masks with interior holes that carry values through."""
    gen = torch.Generator().manual_seed(seed)
    mask = random_mask(gen, 10, 9, holes=True)
    rewards = torch.randn(10, 9, generator=gen) * mask
    values = torch.randn(10, 9, generator=gen)
    ref_adv, ref_ret = core_algos.compute_gae_advantage_return(rewards, values, mask, gamma, lam)
    adv, ret = compute_gae_advantages(AdvantageInputs(rewards, mask, values=values), gamma=gamma, lam=lam)
    _close(adv, ref_adv, mask)
    _close(ret, ref_ret, mask)


# -- hand-computed cases -----------------------------------------------------------------------
def test_grpo_hand_case_and_singleton_convention():
    """Group {1, 0, 1}: mean 2/3, unbiased std 1/sqrt(3); a singleton keeps its raw score (verl)."""
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.7]])
    mask = torch.ones(4, 2)
    adv, _ = compute_grpo_advantages(AdvantageInputs(rewards, mask, torch.tensor([5, 5, 5, 9])), std_eps=0.0)
    std = math.sqrt(1 / 3)
    expected = torch.tensor([1 / 3 / std, -2 / 3 / std, 1 / 3 / std, 0.7])
    torch.testing.assert_close(adv[:, 0], expected)


def test_gpg_rescale_modes_hand_case():
    """Groups {1,0} and {0,0}: centred (0.5, -0.5, 0, 0); verl alpha = 4/1, paper alpha = 4/2."""
    rewards = torch.tensor([[1.0], [0.0], [0.0], [0.0]])
    inp = AdvantageInputs(rewards, torch.ones(4, 1), torch.tensor([0, 0, 1, 1]))
    centred = torch.tensor([0.5, -0.5, 0.0, 0.0])
    torch.testing.assert_close(compute_gpg_advantages(inp)[0][:, 0], 4 * centred)
    torch.testing.assert_close(compute_gpg_advantages(inp, rescale="groups")[0][:, 0], 2 * centred)
    torch.testing.assert_close(compute_gpg_advantages(inp, rescale="none")[0][:, 0], centred)
    with pytest.raises(ValueError, match="rescale"):
        compute_gpg_advantages(inp, rescale="bogus")


def _egae(rewards, values, mask, finished, **kw):
    inp = AdvantageInputs(
        torch.tensor(rewards), torch.tensor(mask), values=torch.tensor(values), finished=torch.tensor(finished)
    )
    return compute_egae_advantages(inp, whiten=False, **kw)


def test_egae_hand_cases():
    """T-PPO (arXiv 2506.15050) eq. 6 by hand. Row 0 finished (terminal V = 0); row 1 unfinished with V(s_3) = V(s_2);
    row 2 unfinished with one padding slot (its value 9.9 must be ignored)."""
    adv, ret = _egae(
        [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
        [[0.5, 0.6, 0.7], [0.2, 0.4, 0.3], [0.2, 0.4, 9.9]],
        [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]],
        [True, False, False],
        gamma=1.0,
        lam=0.5,
    )
    # row 0: deltas (0.1, 0.1, 0.3) -> A2 = 0.3, A1 = 0.1 + 0.5 * 0.3, A0 = 0.1 + 0.5 * A1
    # row 1: deltas (0.2, -0.1, 0.0) -> A2 = 0, A1 = -0.1, A0 = 0.2 - 0.05
    # row 2: deltas (0.2, 0.0) -> A1 = 0, A0 = 0.2
    expected = torch.tensor([[0.225, 0.25, 0.3], [0.15, -0.1, 0.0], [0.2, 0.0, 0.0]])
    torch.testing.assert_close(adv, expected)
    values = torch.tensor([[0.5, 0.6, 0.7], [0.2, 0.4, 0.3], [0.2, 0.4, 0.0]])
    torch.testing.assert_close(ret, expected + values)


def test_egae_hand_case_discounted():
    """gamma = 0.9, lam = 1, unfinished, V = (1, 2): delta_1 = 0.9*2 - 2, delta_0 = 0.9*2 - 1,
    A_0 = delta_0 + 0.9 delta_1 = 0.62."""
    adv, _ = _egae([[0.0, 0.0]], [[1.0, 2.0]], [[1.0, 1.0]], [False], gamma=0.9, lam=1.0)
    torch.testing.assert_close(adv, torch.tensor([[0.62, -0.2]]))


@pytest.mark.parametrize("seed", SEEDS)
def test_egae_finished_rows_equal_gae(seed):
    """Finished responses get plain GAE (per row without whitening; whole batch with whitening)."""
    gen = torch.Generator().manual_seed(seed)
    mask = random_mask(gen, 8, 6)
    rewards = torch.randn(8, 6, generator=gen) * mask
    values = torch.randn(8, 6, generator=gen)
    finished = torch.rand(8, generator=gen) < 0.5
    kw = {"gamma": 0.97, "lam": 0.9}
    inp = AdvantageInputs(rewards, mask, values=values, finished=finished)
    egae, _ = compute_egae_advantages(inp, whiten=False, **kw)
    gae, _ = compute_gae_advantages(inp, whiten=False, **kw)
    torch.testing.assert_close(egae[finished], gae[finished])
    assert not torch.allclose(egae[~finished], gae[~finished])
    all_done = AdvantageInputs(rewards, mask, values=values, finished=torch.ones(8, dtype=torch.bool))
    for a, b in zip(compute_egae_advantages(all_done, **kw), compute_gae_advantages(all_done, **kw)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("seed", SEEDS)
def test_egae_gamma_one_last_window_token_has_zero_td(seed):
    """gamma = 1, no reward in the window: the last real token of an unfinished response has A = 0."""
    gen = torch.Generator().manual_seed(seed)
    mask = random_mask(gen, 6, 5)
    values = torch.randn(6, 5, generator=gen)
    inp = AdvantageInputs(torch.zeros(6, 5), mask, values=values, finished=torch.zeros(6, dtype=torch.bool))
    adv, _ = compute_egae_advantages(inp, gamma=1.0, lam=0.95, whiten=False)
    last = mask.sum(-1).long() - 1
    assert torch.all(adv[torch.arange(6), last] == 0)
    assert torch.all(adv[mask == 0] == 0)


def test_egae_requires_finished_and_values():
    inp = AdvantageInputs(torch.zeros(2, 3), torch.ones(2, 3), values=torch.zeros(2, 3))
    with pytest.raises(ValueError, match="finished"):
        compute_egae_advantages(inp)
    with pytest.raises(ValueError, match="values"):
        compute_gae_advantages(AdvantageInputs(torch.zeros(2, 3), torch.ones(2, 3)))
    with pytest.raises(ValueError, match="group_index"):
        compute_grpo_advantages(AdvantageInputs(torch.zeros(2, 3), torch.ones(2, 3)))


# -- Monte-Carlo check on a finite-horizon random walk -------------------------------------------
HORIZON, WINDOW, P_UP, GOAL = 12, 8, 0.55, 2


def _walk_values() -> np.ndarray:
    """Exact V[t, s + HORIZON] = P(final position >= GOAL | position s at step t), by backward DP."""
    states = np.arange(-HORIZON, HORIZON + 1)
    value = np.zeros((HORIZON + 1, states.size))
    value[HORIZON] = (states >= GOAL).astype(float)
    for t in range(HORIZON - 1, -1, -1):
        up = np.append(value[t + 1][1:], 0.0)
        down = np.insert(value[t + 1][:-1], 0, 0.0)
        value[t] = P_UP * up + (1 - P_UP) * down
    return value


def _walks(n: int, seed: int):
    rng = np.random.default_rng(seed)
    steps = np.where(rng.random((n, HORIZON)) < P_UP, 1, -1)
    positions = np.concatenate([np.zeros((n, 1), dtype=int), np.cumsum(steps, axis=1)], axis=1)
    return positions  # [n, HORIZON + 1], state before token t is positions[:, t]


@pytest.mark.slow
def test_egae_monte_carlo_random_walk():
    """With the exact value function of a random walk (reward 1 at step 12 if the position >= 2),
    EGAE on the first 8-token window (unfinished) is an unbiased estimate of the true advantage
    Q(s_t, a_t) - V(s_t) at every window position but the last (where its TD term is 0); plain GAE
    on the same truncated window (V = 0 after it) is strongly biased; full-length GAE is unbiased."""
    value = _walk_values()
    n = 20000
    pos = _walks(n, seed=7)
    offset = HORIZON
    final_reward = (pos[:, HORIZON] >= GOAL).astype(float)
    # the DP is right: Monte-Carlo mean of the outcome from the start matches V(0, 0)
    assert abs(final_reward.mean() - value[0, offset]) < 4 * final_reward.std() / math.sqrt(n)

    v_all = np.stack([value[t, pos[:, t] + offset] for t in range(HORIZON + 1)], axis=1)  # [n, H+1]
    true_adv = v_all[:, 1:] - v_all[:, :-1]  # reward only at the end, transitions deterministic given a

    def stats(adv: torch.Tensor, length: int) -> tuple[np.ndarray, np.ndarray]:
        err = adv.numpy()[:, :length] - true_adv[:, :length]
        return err.mean(0), err.std(0) / math.sqrt(n) + 1e-6  # 1e-6: float32 rounding where A_t is exact

    window = torch.ones(n, WINDOW)
    window_values = torch.tensor(v_all[:, :WINDOW], dtype=torch.float32)
    unfinished = AdvantageInputs(torch.zeros(n, WINDOW), window, values=window_values, finished=torch.zeros(n) > 0)
    egae, _ = compute_egae_advantages(unfinished, gamma=1.0, lam=0.95, whiten=False)
    mean, se = stats(egae, WINDOW - 1)
    assert np.all(np.abs(mean) < 4.5 * se), (mean, se)
    assert np.all(egae[:, WINDOW - 1].numpy() == 0)

    truncated_gae, _ = compute_gae_advantages(unfinished, gamma=1.0, lam=0.95, whiten=False)
    mean_bad, se_bad = stats(truncated_gae, WINDOW - 1)
    assert np.all(np.abs(mean_bad) > 10 * se_bad)

    full_rewards = torch.zeros(n, HORIZON)
    full_rewards[:, -1] = torch.tensor(final_reward, dtype=torch.float32)
    finished = AdvantageInputs(
        full_rewards,
        torch.ones(n, HORIZON),
        values=torch.tensor(v_all[:, :HORIZON], dtype=torch.float32),
        finished=torch.ones(n) > 0,
    )
    full, _ = compute_egae_advantages(finished, gamma=1.0, lam=0.95, whiten=False)
    mean_full, se_full = stats(full, HORIZON)
    assert np.all(np.abs(mean_full) < 4.5 * se_full), (mean_full, se_full)


# -- properties on extreme inputs --------------------------------------------------------------
@st.composite
def _extreme_batches(draw):
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    length = draw(st.integers(1, 4))
    batch = sum(sizes)
    reward_values = st.sampled_from([0.0, 1.0, -1.0, 1e6, -1e6, 1e-7, 0.5])
    if draw(st.booleans()):
        scores = [draw(reward_values)] * batch  # all equal
    else:
        scores = draw(st.lists(reward_values, min_size=batch, max_size=batch))
    lengths = draw(st.lists(st.integers(1, length), min_size=batch, max_size=batch))
    values = draw(st.lists(st.sampled_from([0.0, 1.0, -3.0, 1e4]), min_size=batch, max_size=batch))
    finished = draw(st.lists(st.booleans(), min_size=batch, max_size=batch))
    mask = (torch.arange(length)[None, :] < torch.tensor(lengths)[:, None]).float()
    rewards = torch.zeros(batch, length)
    rewards[torch.arange(batch), torch.tensor(lengths) - 1] = torch.tensor(scores)
    groups = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    return AdvantageInputs(
        rewards,
        mask,
        group_index=groups,
        values=torch.tensor(values)[:, None].expand(batch, length).contiguous(),
        finished=torch.tensor(finished),
    )


@pytest.mark.parametrize("name", ESTIMATORS.names())
@settings(max_examples=40, deadline=None)
@given(inp=_extreme_batches())
def test_estimators_finite_and_zero_on_padding(name, inp):
    """Every registered estimator: finite outputs, zeros on padding, for groups of one, all-equal
    rewards, length-1 responses and rewards of 1e6."""
    adv, ret = ESTIMATORS.get(name)(inp)
    assert adv.shape == inp.token_rewards.shape and ret.shape == adv.shape
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert torch.all(adv[inp.response_mask == 0] == 0)


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo", "loop", "gpg", "rfpp_baseline"])
@settings(max_examples=30, deadline=None)
@given(
    score=st.sampled_from([0.0, 1.0, 0.1, 1e6, -7.3]),
    size=st.integers(2, 6),
    length=st.integers(1, 3),
)
def test_all_equal_rewards_give_zero_advantage(name, score, size, length):
    """A group whose rewards are all equal carries no signal: advantages are exactly 0."""
    rewards = torch.zeros(size, length)
    rewards[:, -1] = score
    inp = AdvantageInputs(rewards, torch.ones(size, length), group_index=torch.zeros(size, dtype=torch.long))
    adv, _ = ESTIMATORS.get(name)(inp)
    assert torch.all(adv == 0)
