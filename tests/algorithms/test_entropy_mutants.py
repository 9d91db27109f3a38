"""Entropy controllers (Entropy-preserving RL, arXiv 2603.11682) on cases aimed at mutation testing
(``make mutation``) of runners/algorithms/entropy.py.

Each test compares the library with values written here by hand or from the references of
``test_ref_entropy_control.py`` (section 5.1 bidirectional controller and the appendix D.2 listing,
section 5.2 ADAPO, appendix D.2 REPO-R / section 5.1 REPO-D advantages) and a float64 loop for the
Corollary-1 covariance (section 3), on inputs the main tests do not reach: a coefficient landing exactly
on a bound, a zero coefficient, parameter ranges at their limits, error messages, the iteration count
kept in checkpoints, single-token and padded batches.

Run: ``pytest tests/algorithms/test_entropy_mutants.py``.
"""

from __future__ import annotations

import math

import pytest
import torch

from runners.algorithms.entropy import (
    AdapoController,
    EntropyBonusController,
    EntropyController,
    NoEntropyControl,
    RepoDController,
    RepoRController,
    bidirectional_zeta_step,
    entropy_covariance,
)
from runners.metric_names import ENTROPY_BONUS_COEF, ENTROPY_EPS_HIGH, ENTROPY_TARGET, ENTROPY_ZETA
from tests.algorithms.test_ref_entropy_control import (
    ref_adapo_trajectory,
    ref_repo_d_advantage,
    ref_repo_r_advantage,
    ref_zeta_step,
)


# -- the bidirectional controller (section 5.1, appendix D.2 listing) ------------------------------------
@pytest.mark.parametrize(
    "zeta, entropy, want",
    [
        # a positive zeta halving exactly onto zeta_min stays there (the flip needs zeta / 2 < zeta_min)
        (0.5, 2.0, 0.25),
        # a negative zeta halving exactly onto -zeta_min stays there (the flip needs zeta / 2 > -zeta_min)
        (-0.5, 0.0, -0.25),
        # zeta = 0 counts as non-negative: above target 0 / 2 < zeta_min flips to -zeta_min ...
        (0.0, 2.0, -0.25),
        # ... below target 0 doubles to 0 (no flip on that side)
        (0.0, 0.0, 0.0),
        # doubling exactly onto the caps, and past them
        (2.0, 0.0, 4.0),
        (3.0, 0.0, 4.0),
        (-2.0, 2.0, -4.0),
        (-3.0, 2.0, -4.0),
        # at the target nothing moves, whatever the sign
        (0.3, 1.0, 0.3),
        (-0.3, 1.0, -0.3),
    ],
)
def test_bidirectional_step_on_the_bounds(zeta, entropy, want):
    """target = 1, zeta_min = 0.25, zeta_max = 4 (exact binary fractions): the step against a hand value and
    against the reference rule."""
    assert ref_zeta_step(zeta, entropy, 1.0, 0.25, 4.0) == want
    got = bidirectional_zeta_step(zeta, entropy, 1.0, 0.25, 4.0)
    assert got == want and math.copysign(1.0, got) == math.copysign(1.0, want)


def test_controllers_land_on_zeta_min_without_flipping():
    """REPO-R / REPO-D / the bonus through ``update``: a coefficient halving exactly onto its lower bound
    keeps its sign (zeta_min = 0.25, zeta0 = 0.5, target 1)."""
    for ctl, key, sign in (
        (RepoRController(zeta0=0.5, zeta_min=0.25, zeta_max=4.0), ENTROPY_ZETA, 1.0),
        (RepoDController(zeta0=-0.5, zeta_min=0.25, zeta_max=4.0), ENTROPY_ZETA, -1.0),
        (EntropyBonusController(beta0=0.5, beta_min=0.25, beta_max=4.0), ENTROPY_BONUS_COEF, 1.0),
    ):
        entropies = [1.0, 1.0 + sign, 1.0 + sign]  # above target pushes a positive one down, below a negative up
        got = [ctl.update(h)[key] for h in entropies]
        assert got == [0.5 * sign, 0.25 * sign, -0.25 * sign]


# -- checkpoint state ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "cls, extra",
    [
        (RepoRController, {"zeta": 0.004}),
        (RepoDController, {"zeta": 0.004}),
        (AdapoController, {"eps_high": 0.28 * 1.05 * 1.05}),
        (EntropyBonusController, {"beta": 0.004}),
    ],
)
def test_state_dict_counts_updates(cls, extra):
    """The state holds the target, the number of ``update`` calls made so far and the coefficient."""
    ctl = cls()
    assert (ctl.state_dict()["target"], ctl.state_dict()["num_updates"]) == (None, 0)
    for _ in range(3):
        ctl.update(0.5)  # first: target 0.5; then twice at the target: nothing moves
    ctl.update(0.25)
    ctl.update(0.25)
    state = ctl.state_dict()
    assert set(state) == {"target", "num_updates", *extra}
    assert state["target"] == 0.5 and state["num_updates"] == 5
    for key, value in extra.items():
        assert state[key] == pytest.approx(value, rel=1e-12)


def test_load_state_dict_restores_every_field():
    a = RepoRController()
    for h in (1.0, 0.9, 0.9):
        a.update(h)
    b = RepoRController(target=7.0)
    b.load_state_dict(a.state_dict())
    assert (b.target, b.num_updates, b.zeta) == (1.0, 3, pytest.approx(4e-3))
    base = NoEntropyControl()
    base.load_state_dict({"target": 2.0, "num_updates": 4})
    assert base.state_dict() == {"target": 2.0, "num_updates": 4}


@pytest.mark.parametrize(
    "cls", [NoEntropyControl, RepoRController, RepoDController, AdapoController, EntropyBonusController]
)
def test_load_state_dict_error_names_the_class_and_keys(cls):
    with pytest.raises(ValueError, match=rf"^{cls.__name__} state keys \['zeta'\] do not match expected \[") as err:
        cls().load_state_dict({"zeta": 1.0})
    assert "'num_updates'" in str(err.value) and "'target'" in str(err.value)


def test_base_controller_is_identity_and_takes_a_target():
    ctl = EntropyController(target=3)
    assert ctl.target == 3.0 and isinstance(ctl.target, float)
    adv = torch.tensor([[1.0, -2.0]])
    assert ctl.transform_advantages(adv, adv, torch.ones_like(adv)) is adv
    assert ctl.objective_overrides() == {} and ctl.loss_term(adv) is None
    assert ctl.update(5.0) == {} and ctl.target == 3.0 and ctl.num_updates == 1
    assert EntropyController().target is None


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_update_rejects_non_finite_entropy(bad):
    ctl = RepoRController()
    with pytest.raises(ValueError, match=r"^entropy controller update got a non-finite entropy"):
        ctl.update(bad)
    assert ctl.num_updates == 0 and ctl.target is None


def test_update_accepts_a_tensor_entropy():
    ctl = AdapoController()
    assert ctl.update(torch.tensor(1.5, dtype=torch.float64)) == {ENTROPY_EPS_HIGH: 0.28, ENTROPY_TARGET: 1.5}


# -- parameter ranges ------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [RepoRController, RepoDController])
def test_zeta_range_limits(cls):
    """zeta_min = zeta_max and |zeta0| on either end (either sign) are accepted; zeta_min <= 0, zeta_min >
    zeta_max and |zeta0| outside the range are not, with a message naming the parameters."""
    for zeta0 in (0.5, -0.5):
        assert cls(zeta0=zeta0, zeta_min=0.5, zeta_max=0.5).zeta == zeta0
    assert cls(zeta0=-0.2, zeta_min=0.2, zeta_max=3.0).zeta == -0.2
    assert cls(zeta0=-3.0, zeta_min=0.2, zeta_max=3.0).zeta == -3.0
    for zeta_min, zeta_max in ((0.0, 1.0), (-0.1, 1.0), (0.6, 0.5)):
        with pytest.raises(ValueError, match=r"^need 0 < zeta_min <= zeta_max, got zeta_min=.*, zeta_max="):
            cls(zeta0=0.5, zeta_min=zeta_min, zeta_max=zeta_max)
    for zeta0 in (0.1, -0.1, 3.5, -3.5):
        with pytest.raises(ValueError, match=r"^\|zeta0\|=.* must lie in \[zeta_min, zeta_max\] = \[0.2, 3.0\]$"):
            cls(zeta0=zeta0, zeta_min=0.2, zeta_max=3.0)


@pytest.mark.parametrize(
    "cls, key, want",
    [
        (RepoRController, ENTROPY_ZETA, 2e-3),
        (RepoDController, ENTROPY_ZETA, 2e-3),
        (AdapoController, ENTROPY_EPS_HIGH, 0.28 * 1.05),
        (EntropyBonusController, ENTROPY_BONUS_COEF, 2e-3),
    ],
)
def test_every_controller_keeps_a_given_target(cls, key, want):
    """target given: the first update is measured against it (entropy below it: the coefficient rises)."""
    ctl = cls(target=2.0)
    assert ctl.target == 2.0 and ctl.state_dict()["target"] == 2.0
    assert ctl.update(1.5) == {key: pytest.approx(want, rel=1e-12), ENTROPY_TARGET: 2.0}


def test_zeta_controller_stores_floats():
    ctl = RepoDController(zeta0=1, zeta_min=1, zeta_max=2, target=1)
    assert [type(v) for v in (ctl.zeta, ctl.zeta_min, ctl.zeta_max, ctl.target)] == [float] * 4


def test_paper_defaults():
    """Section 5.1 / appendix D.2: REPO-R |zeta| in [1e-4, 0.05], zeta0 = 1e-3; REPO-D |zeta| in [1e-3, 10];
    section 5.2: ADAPO eps_low 0.2, eps_high 0.28 in [0.2, 0.32], x1.05 / x0.95; bonus as REPO-D."""
    r = RepoRController()
    assert (r.zeta, r.zeta_min, r.zeta_max, r.target) == (1e-3, 1e-4, 0.05, None)
    d = RepoDController()
    assert (d.zeta, d.zeta_min, d.zeta_max, d.target) == (1e-3, 1e-3, 10.0, None)
    a = AdapoController()
    assert (a.eps_low, a.eps_high, a.eps_high_min, a.eps_high_max, a.increase, a.decrease, a.target) == (
        0.2,
        0.28,
        0.2,
        0.32,
        1.05,
        0.95,
        None,
    )
    b = EntropyBonusController()
    assert (b.beta, b.beta_min, b.beta_max, b.adaptive, b.target) == (1e-3, 1e-3, 10.0, True, None)
    assert NoEntropyControl().target is None and NoEntropyControl().num_updates == 0


def test_adapo_range_limits():
    assert AdapoController(eps_high=0.2).eps_high == 0.2
    assert AdapoController(eps_high=0.32).eps_high == 0.32
    ctl = AdapoController(eps_low=0.1, eps_high=0.3, eps_high_min=0.25, eps_high_max=0.35, target=1.0)
    assert ctl.objective_overrides() == {"clip_ratio_low": 0.1, "clip_ratio_high": 0.3}
    for eps_high in (0.19, 0.33):
        with pytest.raises(
            ValueError, match=r"^eps_high=.* must lie in \[eps_high_min, eps_high_max\] = \[0.2, 0.32\]$"
        ):
            AdapoController(eps_high=eps_high)
    for increase, decrease in ((1.0, 0.95), (0.9, 0.95), (1.05, 1.0), (1.05, 0.0), (1.05, -0.5)):
        with pytest.raises(ValueError, match=r"^need increase > 1 and 0 < decrease < 1, got increase=.*, decrease="):
            AdapoController(increase=increase, decrease=decrease)
    # rates just inside the limits are accepted and used
    ctl = AdapoController(eps_high=0.25, eps_high_min=0.0, eps_high_max=1.0, increase=1.5, decrease=0.5)
    got = [ctl.update(h)[ENTROPY_EPS_HIGH] for h in (1.0, 0.5, 0.5, 2.0, 2.0, 2.0)]
    assert got == pytest.approx(ref_adapo_trajectory([1.0, 0.5, 0.5, 2.0, 2.0, 2.0], 0.25, 0.0, 1.0, 1.5, 0.5))
    assert got == pytest.approx([0.25, 0.375, 0.5625, 0.28125, 0.140625, 0.0703125])


def test_adapo_reaches_its_bounds_exactly():
    ctl = AdapoController(eps_high=0.25, eps_high_min=0.125, eps_high_max=0.5, increase=2.0, decrease=0.5)
    got = [ctl.update(h)[ENTROPY_EPS_HIGH] for h in (1.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0)]
    assert got == [0.25, 0.5, 0.5, 0.25, 0.125, 0.125, 0.125]
    assert ctl.objective_overrides() == {"clip_ratio_low": 0.2, "clip_ratio_high": 0.125}


def test_bonus_ranges():
    """With adaptive=False beta is free (zero or outside the adaptive range); adaptive needs 0 < beta_min <=
    |beta0| <= beta_max, either sign."""
    assert EntropyBonusController(beta0=0.0, adaptive=False).beta == 0.0
    assert EntropyBonusController(beta0=50.0, beta_min=0.0, adaptive=False).beta == 50.0
    assert EntropyBonusController(beta0=-0.5, beta_min=0.5, beta_max=0.5).beta == -0.5
    assert EntropyBonusController(beta0=2.0, beta_min=0.5, beta_max=2.0).beta == 2.0
    for beta0, beta_min, beta_max in ((0.5, 0.0, 1.0), (0.1, 0.2, 1.0), (-1.5, 0.2, 1.0), (0.5, 0.6, 0.4)):
        with pytest.raises(ValueError, match=r"^need 0 < beta_min <= \|beta0\| <= beta_max, got "):
            EntropyBonusController(beta0=beta0, beta_min=beta_min, beta_max=beta_max)
    fixed = EntropyBonusController(beta0=0.0, adaptive=False)
    assert fixed.adaptive is False
    assert [fixed.update(h)[ENTROPY_BONUS_COEF] for h in (1.0, 0.5, 2.0)] == [0.0, 0.0, 0.0]
    flag = EntropyBonusController(adaptive=1)
    assert flag.adaptive is True


def test_bonus_metrics_and_loss_term():
    ctl = EntropyBonusController(beta0=0.5, beta_min=0.25, beta_max=4.0)
    assert ctl.update(1.0) == {ENTROPY_BONUS_COEF: 0.5, ENTROPY_TARGET: 1.0}
    assert ctl.update(0.5) == {ENTROPY_BONUS_COEF: 1.0, ENTROPY_TARGET: 1.0}
    h = torch.tensor([[0.5, 2.0], [1.5, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(ctl.loss_term(h), torch.tensor([[-0.5, -2.0], [-1.5, 0.0]], dtype=torch.float64))


# -- advantage transforms --------------------------------------------------------------------------------
def _ref_transform(fn, adv, logp, mask, zeta):
    out = adv.clone()
    for i in range(adv.shape[0]):
        for t in range(adv.shape[1]):
            if mask[i, t]:
                out[i, t] = fn(float(adv[i, t]), float(logp[i, t]), zeta)
    return out


ADV = torch.tensor([[0.5, -0.5, 0.0, 2.0, -2.0, 0.0, 3.0], [-1.0, 1.0, 0.0, 4.0, -4.0, 7.0, -7.0]], dtype=torch.float64)
LOGP = torch.tensor(
    [[-0.5, -2.0, -1.0, -40.0, -40.0, -3.0, -9.0], [-12.0, -12.0, -0.25, -0.1, -25.0, -1.0, -1.0]], dtype=torch.float64
)
MASK = torch.tensor([[1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0, 0]])


@pytest.mark.parametrize("zeta", [0.05, -0.05, 0.1, -0.1])
@pytest.mark.parametrize("mask_dtype", [torch.int64, torch.bool, torch.float32])
def test_repo_r_transform_against_reference(zeta, mask_dtype):
    """Appendix D.2: A > 0: max(0, A(1 - zeta logp)), A < 0: min(0, A(1 + zeta logp)), A = 0 and padding
    unchanged; both clamps act on the log-prob -40 / -25 / -12 tokens at |zeta| = 0.05 / 0.1."""
    ctl = RepoRController(zeta0=zeta, zeta_min=0.01, zeta_max=0.1)
    mask = MASK.to(mask_dtype)
    got = ctl.transform_advantages(ADV, LOGP, mask)
    want = _ref_transform(ref_repo_r_advantage, ADV, LOGP, MASK, zeta)
    torch.testing.assert_close(got, want, rtol=1e-14, atol=0)
    assert int((got == 0).sum()) > int((ADV == 0).sum())  # some clamp fired


def test_repo_r_zero_advantage_on_a_zero_probability_token():
    """A = 0 is returned unchanged (the D.2 listing's ``else A``), even where logp = -inf makes A(1 -/+ zeta
    logp) undefined."""
    adv = torch.tensor([[0.0, 1.0, -1.0]], dtype=torch.float64)
    logp = torch.tensor([[-math.inf, -1.0, -1.0]], dtype=torch.float64)
    for zeta in (0.05, -0.05):
        got = RepoRController(zeta0=zeta).transform_advantages(adv, logp, torch.ones(1, 3))
        step = 0.05 if zeta > 0 else -0.05  # A (1 -/+ zeta logp) at logp = -1
        want = torch.tensor([[0.0, 1.0 + step, -1.0 + step]], dtype=torch.float64)
        torch.testing.assert_close(got, want, rtol=1e-14, atol=0)


@pytest.mark.parametrize("zeta", [0.5, -2.0])
def test_repo_d_transform_against_reference(zeta):
    ctl = RepoDController(zeta0=zeta)
    got = ctl.transform_advantages(ADV, LOGP, MASK.bool())
    torch.testing.assert_close(got, _ref_transform(ref_repo_d_advantage, ADV, LOGP, MASK, zeta), rtol=1e-14, atol=0)


def test_transforms_detach_logp():
    """The advantage transforms treat logp as a constant (appendix D.2: ``logp = new_logp.detach()``)."""
    logp = LOGP.clone().requires_grad_(True)
    for ctl in (RepoRController(zeta0=0.05), RepoDController(zeta0=0.5)):
        out = ctl.transform_advantages(ADV, logp, MASK)
        assert not out.requires_grad


# -- Corollary-1 covariance (section 3) ------------------------------------------------------------------
def ref_covariance(logp, adv, mask, logits=None, prob_weighted=True):
    """C = token mean over the valid tokens of pi_t (A_t - mean A) (logp_t - centre_t), float64 loops;
    centre_t = sum_v pi_v log pi_v of the token's state with logits, else the mean valid logp."""
    rows, cols = logp.shape
    valid = [(i, t) for i in range(rows) for t in range(cols) if float(mask[i, t]) != 0]
    count = max(1, len(valid))
    mean_adv = math.fsum(float(adv[i, t]) for i, t in valid) / count
    mean_logp = math.fsum(float(logp[i, t]) for i, t in valid) / count
    total = []
    for i, t in valid:
        if logits is None:
            centre = mean_logp
        else:
            z = [float(v) for v in logits[i, t]]
            top = max(z)
            lse = top + math.log(math.fsum(math.exp(v - top) for v in z))
            centre = math.fsum(math.exp(v - lse) * (v - lse) for v in z)
        term = (float(adv[i, t]) - mean_adv) * (float(logp[i, t]) - centre)
        if prob_weighted:
            term *= math.exp(float(logp[i, t]))
        total.append(term)
    return math.fsum(total) / count


def _cov_case(seed=3, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    logits = 1.5 * torch.randn(3, 5, 6, generator=gen, dtype=torch.float64)
    tokens = torch.randint(0, 6, (3, 5), generator=gen)
    logp = torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0]
    adv = torch.randn(3, 5, generator=gen, dtype=torch.float64) + 0.7
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.float64)
    # padding carries values that would move every mean if it were counted
    logp = torch.where(mask > 0, logp, torch.full_like(logp, -50.0))
    adv = torch.where(mask > 0, adv, torch.full_like(adv, 100.0))
    return logp.to(dtype), adv.to(dtype), mask, logits.to(dtype)


@pytest.mark.parametrize("prob_weighted", [True, False])
@pytest.mark.parametrize("with_logits", [True, False])
def test_covariance_against_loop(prob_weighted, with_logits):
    logp, adv, mask, logits = _cov_case()
    lg = logits if with_logits else None
    got = entropy_covariance(logp, adv, mask, lg, prob_weighted=prob_weighted)
    assert got.dtype == torch.float64 and got.shape == ()
    want = ref_covariance(logp, adv, mask, lg, prob_weighted)
    assert float(got) == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert abs(want) > 1e-3
    if prob_weighted:  # the default weights by pi
        assert float(entropy_covariance(logp, adv, mask, lg)) == float(got)


def test_covariance_float64_logp_with_float32_logits_is_computed_in_float64():
    """float64 log-probs: the per-state centring is computed in float64 from the (float32) logits, so the
    result matches a float64 loop on the same logits to float64 precision."""
    logp, adv, mask, logits = _cov_case(seed=5)
    logits32 = logits.float()
    logp = torch.log_softmax(logits32.double(), -1).max(-1).values  # sampled: each state's likeliest token
    got = entropy_covariance(logp, adv, mask, logits32)
    assert got.dtype == torch.float64
    assert float(got) == pytest.approx(ref_covariance(logp, adv, mask, logits32.double()), rel=1e-12, abs=1e-15)


def test_covariance_float32():
    logp, adv, mask, logits = _cov_case(seed=7, dtype=torch.float32)
    got = entropy_covariance(logp, adv, mask, logits)
    assert got.dtype == torch.float32
    assert float(got) == pytest.approx(ref_covariance(logp, adv, mask, logits), rel=1e-4)


def test_covariance_single_token_and_empty_mask():
    """One valid token: A - mean A = 0, so C = 0 without logits; with logits the centring is the state's
    -H, the advantage still centred to 0. Two valid tokens: the mean over 2. No valid token: 0."""
    logp = torch.tensor([[math.log(0.5), math.log(0.25), -3.0]], dtype=torch.float64)
    adv = torch.tensor([[1.0, -1.0, 9.0]], dtype=torch.float64)
    one = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)
    assert float(entropy_covariance(logp, adv, one)) == 0.0
    two = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    # mean A = 0, mean logp = log(0.5 * 0.25) / 2 = 1.5 log 0.5; L = +/- 0.5 log 2
    l2 = 0.5 * math.log(2.0)
    want_pw = (0.5 * 1.0 * l2 + 0.25 * (-1.0) * (-l2)) / 2
    assert float(entropy_covariance(logp, adv, two)) == pytest.approx(want_pw, rel=1e-14)
    assert float(entropy_covariance(logp, adv, two, prob_weighted=False)) == pytest.approx(l2, rel=1e-14)
    none = torch.zeros(1, 3, dtype=torch.float64)
    assert float(entropy_covariance(logp, adv, none)) == 0.0
    # with logits: each token centred on its own state's -H
    logits = torch.log(torch.tensor([[[0.5, 0.5], [0.25, 0.75], [0.5, 0.5]]], dtype=torch.float64))
    lp = torch.tensor([[math.log(0.5), math.log(0.25), math.log(0.5)]], dtype=torch.float64)
    got = entropy_covariance(lp, adv, two, logits)
    h0, h1 = math.log(2.0), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    want = (0.5 * 1.0 * (math.log(0.5) + h0) + 0.25 * (-1.0) * (math.log(0.25) + h1)) / 2
    assert float(got) == pytest.approx(want, rel=1e-14)
    assert float(got) == pytest.approx(ref_covariance(lp, adv, two, logits), rel=1e-14)


def test_covariance_count_of_one():
    """A single valid token whose advantage differs from the padding: C over count = 1 is 0 (the advantage
    is centred on itself) with the batch centre; with logits the log-prob is centred on -H but the advantage
    still on itself, so C = 0 as well; with two valid tokens of equal state the count is 2."""
    logits = torch.log(torch.tensor([[[0.2, 0.8], [0.2, 0.8]]], dtype=torch.float64))
    lp = torch.log(torch.tensor([[0.2, 0.8]], dtype=torch.float64))
    adv = torch.tensor([[2.0, 0.0]], dtype=torch.float64)
    h = -(0.2 * math.log(0.2) + 0.8 * math.log(0.8))
    one = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    assert float(entropy_covariance(lp, adv, one, logits)) == 0.0
    both = torch.ones(1, 2, dtype=torch.float64)
    want = (0.2 * 1.0 * (math.log(0.2) + h) + 0.8 * (-1.0) * (math.log(0.8) + h)) / 2
    assert float(entropy_covariance(lp, adv, both, logits)) == pytest.approx(want, rel=1e-14)
