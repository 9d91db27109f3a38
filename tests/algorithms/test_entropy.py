"""Entropy control (Entropy-preserving RL, arXiv 2603.11682, sections 3-5, appendix D.2): controller trajectories against the rules
applied by hand step by step, REPO advantage transforms against hand-computed values, checkpoint
round trips, and the Corollary-1 covariance against the exact entropy change of a tabular softmax."""

from __future__ import annotations

import pytest
import torch

from runners.algorithms import ENTROPY_CONTROLLERS
from runners.algorithms.entropy import (
    AdapoController,
    EntropyBonusController,
    NoEntropyControl,
    RepoDController,
    RepoRController,
    entropy_covariance,
)
from runners.metric_names import ENTROPY_BONUS_COEF, ENTROPY_EPS_HIGH, ENTROPY_TARGET, ENTROPY_ZETA

LO, HI, EQ = 0.9, 1.1, 1.0  # entropies below / above / at the target set by the first update (1.0)


def drive(ctl, entropies, key):
    return [ctl.update(h)[key] for h in entropies]


def test_repo_r_zeta_trajectory():
    """Doubling to the cap, halving to the sign flip at zeta_min, then back (D.2 listing, by hand)."""
    ctl = RepoRController()
    seq = [EQ] + [LO] * 7 + [HI] * 11 + [LO] * 4 + [EQ]
    # fmt: off
    want = [
        1e-3,  # first iteration sets the target, no rule fires
        2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2, 0.05, 0.05,  # x2 capped at zeta_max = 0.05
        0.025, 0.0125, 0.00625, 0.003125, 0.0015625, 0.00078125, 0.000390625, 0.0001953125,
        -1e-4,  # 9.765625e-5 < zeta_min = 1e-4: flip to -zeta_min
        -2e-4, -4e-4,  # negative zeta doubles in magnitude while entropy stays high
        -2e-4, -1e-4,  # entropy low: halves ...
        1e-4,  # ... -5e-5 > -zeta_min: flip to +zeta_min
        2e-4,
        2e-4,  # entropy equal to target: unchanged
    ]
    # fmt: on
    got = drive(ctl, seq, ENTROPY_ZETA)
    assert got == pytest.approx(want, rel=1e-12)
    assert ctl.metrics()[ENTROPY_TARGET] == EQ


def test_repo_d_bounds_and_flip():
    ctl = RepoDController()  # |zeta| in [1e-3, 10], zeta0 = 1e-3
    assert drive(ctl, [EQ, HI, HI, LO, LO, LO], ENTROPY_ZETA) == pytest.approx(
        [1e-3, -1e-3, -2e-3, -1e-3, 1e-3, 2e-3]  # 5e-4 < 1e-3 flips; -5e-4 > -1e-3 flips back
    )
    ctl = RepoDController()
    got = drive(ctl, [EQ] + [LO] * 15, ENTROPY_ZETA)
    assert got[13] == pytest.approx(8.192)  # 1e-3 * 2**13
    assert got[14:] == [10.0, 10.0]  # 16.384 capped at zeta_max
    ctl = RepoDController()
    assert drive(ctl, [EQ] + [HI] * 16, ENTROPY_ZETA)[-1] == -10.0


def test_adapo_eps_high_trajectory():
    ctl = AdapoController()
    assert ctl.objective_overrides() == {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}
    got = drive(ctl, [EQ, LO, LO, LO, LO], ENTROPY_EPS_HIGH)
    assert got == pytest.approx([0.28, 0.28 * 1.05, 0.28 * 1.05**2, 0.32, 0.32])  # 0.3241 capped
    got = drive(ctl, [HI] * 10, ENTROPY_EPS_HIGH)
    want, eps = [], 0.32
    for _ in range(10):
        eps = max(0.95 * eps, 0.2)
        want.append(eps)
    assert got == pytest.approx(want)
    assert want[-1] == 0.2 and want[-2] > 0.2  # the floor is reached within the sequence
    assert ctl.objective_overrides() == {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2}
    assert drive(ctl, [EQ], ENTROPY_EPS_HIGH) == [0.2]


def test_entropy_bonus_adapts_like_zeta_and_adds_minus_beta_h():
    ctl = EntropyBonusController()
    assert drive(ctl, [EQ, LO, LO, HI], ENTROPY_BONUS_COEF) == pytest.approx([1e-3, 2e-3, 4e-3, 2e-3])
    h = torch.tensor([[0.5, 2.0]], requires_grad=True)
    term = ctl.loss_term(h)
    assert term[0].tolist() == pytest.approx([-1e-3, -4e-3])
    term.sum().backward()
    assert h.grad[0].tolist() == pytest.approx([-2e-3, -2e-3])  # minimising the loss raises entropy
    fixed = EntropyBonusController(beta0=0.01, adaptive=False)
    assert drive(fixed, [EQ, LO, HI], ENTROPY_BONUS_COEF) == [0.01, 0.01, 0.01]


def test_explicit_target_overrides_first_iteration():
    ctl = RepoRController(target=2.0)
    assert ctl.update(1.5) == {ENTROPY_ZETA: 2e-3, ENTROPY_TARGET: 2.0}


@pytest.mark.parametrize("cls", [RepoRController, RepoDController, AdapoController, EntropyBonusController])
def test_state_dict_round_trip_continues_identically(cls):
    seq = [EQ, LO, LO, HI, HI, HI, LO]
    a = cls()
    drive(a, seq[:4], ENTROPY_TARGET)
    b = cls()
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == a.state_dict()
    assert [b.update(h) for h in seq[4:]] == [a.update(h) for h in seq[4:]]
    with pytest.raises(ValueError, match="state keys"):
        cls().load_state_dict({"zeta": 1.0})


def test_update_rejects_non_finite_entropy():
    with pytest.raises(ValueError, match="non-finite"):
        RepoRController().update(float("nan"))


def test_bad_parameters_raise():
    with pytest.raises(ValueError, match="zeta0"):
        RepoRController(zeta0=1.0)
    with pytest.raises(ValueError, match="eps_high"):
        AdapoController(eps_high=0.5)


# -- advantage transforms --------------------------------------------------------------------------
ADV = torch.tensor([[1.0, 1.0, -1.0, -1.0, 0.0, 2.0, 5.0]])
LOGP = torch.tensor([[-1.0, -30.0, -1.0, -30.0, -5.0, -0.5, -1.0]])
MASK = torch.tensor([[1, 1, 1, 1, 1, 1, 0]])  # last position is padding: left unchanged


def test_repo_r_transform_hand_computed():
    ctl = RepoRController(zeta0=0.05)
    got = ctl.transform_advantages(ADV, LOGP, MASK)
    # A>0: A(1 - 0.05 logp); A<0: A(1 + 0.05 logp) clamped <= 0 (-1 * (1 - 1.5) = 0.5 -> 0)
    assert got[0].tolist() == pytest.approx([1.05, 2.5, -0.95, 0.0, 0.0, 2.05, 5.0])
    ctl = RepoRController(zeta0=-0.05)
    got = ctl.transform_advantages(ADV, LOGP, MASK)
    # A>0: 1 * (1 - 1.5) = -0.5 clamped >= 0; A<0: -1 * (1 + 0.05) = -1.05, -1 * (1 + 1.5) = -2.5
    assert got[0].tolist() == pytest.approx([0.95, 0.0, -1.05, -2.5, 0.0, 1.95, 5.0])


def test_repo_d_transform_hand_computed():
    ctl = RepoDController(zeta0=0.5)
    got = ctl.transform_advantages(ADV, LOGP, MASK)
    assert got[0].tolist() == pytest.approx([1.5, 16.0, -0.5, 14.0, 2.5, 2.25, 5.0])


def test_no_control_and_registry():
    for name in ENTROPY_CONTROLLERS.names():
        ctl = ENTROPY_CONTROLLERS.get(name)()
        assert isinstance(ctl.update(1.0), dict)
        assert ctl.transform_advantages(ADV, LOGP, MASK).shape == ADV.shape
    none = NoEntropyControl()
    assert none.transform_advantages(ADV, LOGP, MASK) is ADV
    assert none.loss_term(LOGP) is None and none.objective_overrides() == {} and none.update(0.3) == {}


# -- Corollary-1 covariance against the exact entropy change of a tabular softmax -----------------------
def softmax_entropy(z):
    logp = torch.log_softmax(z, -1)
    return -(logp.exp() * logp).sum(-1)


def sampled_inputs(z, reward, num_samples, seed):
    """num_samples on-policy actions per state as a [N, S] batch (states are token positions)."""
    pi = torch.softmax(z, -1)
    gen = torch.Generator().manual_seed(seed)
    actions = torch.multinomial(pi, num_samples, replacement=True, generator=gen).T  # [N, S]
    states = torch.arange(z.shape[0]).expand_as(actions)
    logp = torch.log_softmax(z, -1)[states, actions]
    adv = (reward - (pi * reward).sum(-1, keepdim=True))[states, actions]
    logits = z.expand(num_samples, *z.shape)
    return logp, adv, torch.ones_like(logp), logits


SCENARIOS = {
    # reward on the likeliest action of each state: sharpening, entropy falls
    "reward_likely": (torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5], [0.0, 1.5, -0.5, 0.2, 0.1]]), [0, 1]),
    # reward on a rare action: flattening, entropy rises
    "reward_rare": (torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5], [0.0, 1.5, -0.5, 0.2, 0.1]]), [3, 2]),
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("step", ["vanilla", "natural"])
def test_covariance_predicts_entropy_change(scenario, step):
    """-alpha * C from sampled tokens vs the exact entropy change of one small step (Corollary 1/2)."""
    z, good = SCENARIOS[scenario]
    z = z.double()
    reward = torch.zeros_like(z)
    reward[torch.arange(z.shape[0]), good] = 1.0
    pi = torch.softmax(z, -1)
    adv = reward - (pi * reward).sum(-1, keepdim=True)
    alpha = 1e-3
    grad = pi * adv if step == "vanilla" else adv  # tabular softmax: exact PG / natural PG direction
    actual = (softmax_entropy(z + alpha * grad) - softmax_entropy(z)).mean().item()

    logp, a, mask, logits = sampled_inputs(z, reward, 40000, seed=0)
    cov = entropy_covariance(logp, a, mask, logits, prob_weighted=step == "vanilla").item()
    predicted = -alpha * cov
    assert (predicted > 0) == (actual > 0) == (scenario == "reward_rare")
    assert predicted == pytest.approx(actual, rel=0.05)


def test_batch_centring_estimate_single_state():
    """Without logits, one state: centring on the batch mean of logp estimates E[log pi] = -H."""
    z = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5]], dtype=torch.float64)
    reward = torch.tensor([[1.0, 0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    logp, a, mask, logits = sampled_inputs(z, reward, 40000, seed=1)
    exact = entropy_covariance(logp, a, mask, logits).item()
    batch = entropy_covariance(logp, a, mask).item()
    assert exact > 0
    assert batch == pytest.approx(exact, rel=0.1)
    pi = torch.softmax(z, -1)
    grad = pi * (reward - (pi * reward).sum())
    actual = (softmax_entropy(z + 1e-3 * grad) - softmax_entropy(z)).item()
    assert -1e-3 * batch == pytest.approx(actual, rel=0.1)


def test_exact_centring_matters_across_states():
    """A near-uniform and a peaked state: the logits' per-state centring E_a[log pi] predicts the
    entropy change; one batch-wide centre does not (it mixes the two states' mean log-probs)."""
    z = torch.tensor([[0.0, 0.1, -0.1, 0.05, 0.0], [4.0, 0.0, -1.0, -2.0, 1.0]], dtype=torch.float64)
    reward = torch.zeros_like(z)
    reward[:, 0] = 1.0
    pi = torch.softmax(z, -1)
    grad = pi * (reward - (pi * reward).sum(-1, keepdim=True))
    actual = (softmax_entropy(z + 1e-3 * grad) - softmax_entropy(z)).mean().item()
    logp, a, mask, logits = sampled_inputs(z, reward, 40000, seed=0)
    assert -1e-3 * entropy_covariance(logp, a, mask, logits).item() == pytest.approx(actual, rel=0.05)
    assert -1e-3 * entropy_covariance(logp, a, mask).item() < 2 * actual  # batch centre: off by > 2x
