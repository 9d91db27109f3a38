"""Entropy controllers (Entropy-preserving RL, arXiv 2603.11682) against references written here from the paper.

For REPO-R, REPO-D, ADAPO and the adaptive entropy bonus, over about thirty iterations whose entropies lie
above, below and at the target (the first iteration's entropy), so that each coefficient moves off its
start both ways, changes sign where the rule flips it, and sits on its bounds for a while:

- the coefficient after each ``update`` against the paper's rule (section 5.1 adaptive controller, as in
  the appendix D.2 listing; ADAPO's section 5.2 rule), iterated here;
- at every iteration, the trainer's loss (``PolicyLoss`` with the controller, on a DAPO clip objective
  aggregated by token-mean) and its gradient w.r.t. the logits, against a loop reference: the PPO clip
  loss with the REPO-R / REPO-D advantages (appendix D.2 listing; section 5.1, logp detached), ADAPO's
  eps_high, or plus the bonus -beta H (appendix C.3 / A.7); and the term each controller adds (loss with
  the controller minus the loss without) is not negligible.

The batch has tokens with both advantage signs and zero advantages, ratios spread on both sides of every
clip bound the controllers reach (some clipped at the top, some at the bottom, some not), and two very
unlikely sampled tokens (log-prob about -30) on which REPO-R's clamps act once |zeta| = zeta_max.

Tolerance: the clip objective computes the ratio and the loss in float32 (runners/algorithms/objectives.py),
so values agree with the float64 loops to about 1e-6 relative.

Run: ``pytest tests/algorithms/test_ref_entropy_control.py``.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch

from runners.algorithms import ENTROPY_CONTROLLERS
from runners.algorithms.method import Method
from runners.algorithms.policy_loss import PolicyLoss
from runners.algorithms.types import PolicyInputs
from runners.metric_names import ENTROPY_BONUS_COEF, ENTROPY_EPS_HIGH, ENTROPY_TARGET, ENTROPY_ZETA
from tests.algorithms.test_ref_gtpo import ref_token_entropy, ref_token_logp

TOL = {"rtol": 2e-6, "atol": 1e-7, "check_dtype": False}  # float32 ratio and clip loss (module docstring)
CLIP = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}  # DAPO clip under REPO and the bonus
TARGET = 1.0
# iteration k's entropy: TARGET + sign * margin; the first iteration sets the target (sign 0)
SIGNS = {
    # REPO-R: up to zeta_max, down through the flip to -zeta_min and on to -zeta_max, then back up
    "repo_r": [0] + [-1] * 7 + [1] * 18 + [0] + [-1] * 3,
    # REPO-D: starts on zeta_min, flips at once, back through the flip, doubles to zeta_max
    "repo_d": [0] + [1] * 4 + [-1] * 19 + [1] * 2 + [0],
    # ADAPO: up to eps_high_max, down to eps_high_min, back up
    "adapo": [0] + [-1] * 6 + [1] * 11 + [-1] * 2 + [0],
    # bonus: up to beta_max, down through the flip, back through the flip
    "bonus": [0] + [-1] * 9 + [1] * 16 + [-1] * 3 + [0],
}
# the conf/entropy_control/*.yaml defaults (the bonus starts higher than its 1e-3 default)
PARAMS = {
    "repo_r": {"zeta0": 1e-3, "zeta_min": 1e-4, "zeta_max": 0.05},
    "repo_d": {"zeta0": 1e-3, "zeta_min": 1e-3, "zeta_max": 10.0},
    "adapo": {"eps_high": 0.28, "eps_high_min": 0.2, "eps_high_max": 0.32},
    "bonus": {"beta0": 0.05, "beta_min": 1e-3, "beta_max": 10.0},
}
METRIC = {"repo_r": ENTROPY_ZETA, "repo_d": ENTROPY_ZETA, "adapo": ENTROPY_EPS_HIGH, "bonus": ENTROPY_BONUS_COEF}


# -- reference ----------------------------------------------------------------------------------------
def ref_zeta_step(zeta, entropy, target, zeta_min, zeta_max):
    """One step of the adaptive bidirectional controller (Entropy-preserving RL, arXiv 2603.11682, section
    5.1 and the appendix D.2 listing): entropy above target pushes zeta down (halving a positive one, flipped
    to -zeta_min once below zeta_min; doubling a negative one, down to -zeta_max), below target pushes it up
    (the mirror image); at the target zeta stays."""
    if entropy > target:
        if zeta >= 0:
            zeta = zeta / 2
            return -zeta_min if zeta < zeta_min else zeta
        return max(-zeta_max, 2 * zeta)
    if entropy < target:
        if zeta < 0:
            zeta = zeta / 2
            return zeta_min if zeta > -zeta_min else zeta
        return min(zeta_max, 2 * zeta)
    return zeta


def ref_zeta_trajectory(entropies, zeta0, zeta_min, zeta_max):
    """zeta after each iteration; the target is the first iteration's entropy (section 5.1, step 1)."""
    target, zeta, out = entropies[0], zeta0, []
    for h in entropies:
        zeta = ref_zeta_step(zeta, h, target, zeta_min, zeta_max)
        out.append(zeta)
    return out


def ref_adapo_trajectory(entropies, eps_high, eps_high_min, eps_high_max, increase=1.05, decrease=0.95):
    """ADAPO's eps_high after each iteration (Entropy-preserving RL, arXiv 2603.11682, section 5.2): H < H_init:
    min(1.05 eps_high, 0.32); H > H_init: max(0.95 eps_high, 0.2); H_init = the first iteration's entropy."""
    target, out = entropies[0], []
    for h in entropies:
        if h < target:
            eps_high = min(increase * eps_high, eps_high_max)
        elif h > target:
            eps_high = max(decrease * eps_high, eps_high_min)
        out.append(eps_high)
    return out


def ref_coefficients(control, entropies):
    params = PARAMS[control]
    if control == "adapo":
        return ref_adapo_trajectory(entropies, params["eps_high"], params["eps_high_min"], params["eps_high_max"])
    if control == "bonus":
        return ref_zeta_trajectory(entropies, params["beta0"], params["beta_min"], params["beta_max"])
    return ref_zeta_trajectory(entropies, params["zeta0"], params["zeta_min"], params["zeta_max"])


def ref_repo_r_advantage(a, logp, zeta):
    """REPO-R (Entropy-preserving RL, arXiv 2603.11682, appendix D.2 listing; logp detached, raw log-prob for L):
    A > 0: max(0, A (1 - zeta logp)); A < 0: min(0, A (1 + zeta logp)); A = 0: 0."""
    if a > 0:
        return max(0.0, a * (1 - zeta * logp))
    if a < 0:
        return min(0.0, a * (1 + zeta * logp))
    return a


def ref_repo_d_advantage(a, logp, zeta):
    """REPO-D (Entropy-preserving RL, arXiv 2603.11682, section 5.1: A - beta L, with the raw log-prob for L as
    in appendix D.2 and beta = zeta): A - zeta logp, logp detached (every token, A = 0 included)."""
    return a - zeta * logp


def ref_controlled_loss(logp, old_logp, entropy, adv, lengths, control, coef):
    """Token-mean loss of the DAPO clip objective under the controller with coefficient ``coef`` (torch
    scalar, differentiable in ``logp`` / ``entropy`` [B,T]; ``adv`` [B,T] values; ``lengths`` per row):

        -min(r A', clip(r, 1 - eps_low, 1 + eps_high) A')   (PPO clip, arXiv 1707.06347; DAPO bounds)

    A' = REPO-R / REPO-D advantages for ``repo_r`` / ``repo_d`` (zeta = coef); eps_low = 0.2, eps_high = coef
    for ``adapo`` (section 5.2); for ``bonus`` the objective J + beta H adds -beta H_t per token (appendix C.3,
    A.7). ``control=None``: no controller (the baseline the added term is measured against).
    """
    eps_low, eps_high = CLIP["clip_ratio_low"], CLIP["clip_ratio_high"]
    if control == "adapo":
        eps_high = coef
    total, count = 0, 0
    for i, n in enumerate(lengths):
        for t in range(n):
            a, lp = float(adv[i, t]), float(logp[i, t].detach())
            if control == "repo_r":
                a = ref_repo_r_advantage(a, lp, coef)
            elif control == "repo_d":
                a = ref_repo_d_advantage(a, lp, coef)
            ratio = torch.exp(logp[i, t] - old_logp[i, t])
            clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
            total = total - torch.minimum(ratio * a, clipped * a)
            if control == "bonus":
                total = total - coef * entropy[i, t]
            count += 1
    return total / count


# -- the case -----------------------------------------------------------------------------------------
LENGTHS = [6, 5, 4, 6, 3, 6, 2, 5]
SEQ_ADV = [1.3, -0.7, 0.0, -1.1, 0.9, 0.4, -0.5, 0.0]
UNLIKELY = [(0, 2), (3, 4)]  # (row, position) of a sampled token with log-prob about -30: A > 0 and A < 0


@functools.cache
def make_control_case(seed=25):
    """logits [B,T,V] float64, sampled tokens, mask, per-token advantages (sequence value plus a small
    token-level spread, exact zeros kept), and old log-probs putting each ratio on a spread grid."""
    gen = torch.Generator().manual_seed(seed)
    batch, width, vocab = len(LENGTHS), max(LENGTHS), 10
    logits = 2.0 * torch.randn(batch, width, vocab, generator=gen, dtype=torch.float64)
    responses = torch.multinomial(torch.softmax(logits, -1).reshape(-1, vocab), 1, generator=gen).reshape(batch, width)
    for row, pos in UNLIKELY:
        logits[row, pos, responses[row, pos]] = -28.0
    mask = (torch.arange(width)[None, :] < torch.tensor(LENGTHS)[:, None]).double()
    seq = torch.tensor(SEQ_ADV, dtype=torch.float64)[:, None]
    advantages = (seq + 0.1 * seq.sign() * torch.rand(batch, width, generator=gen, dtype=torch.float64)) * mask
    # ratios 0.5 .. 1.6 in a fixed shuffled order, none within 0.002 of a clip bound (checked below)
    grid = torch.linspace(0.5, 1.6, batch * width, dtype=torch.float64) + 0.0048
    ratios = grid[torch.randperm(batch * width, generator=gen)].reshape(batch, width)
    old_logp = ref_token_logp(logits, responses) - ratios.log()
    return SimpleNamespace(logits=logits, responses=responses, mask=mask, advantages=advantages, old_logp=old_logp)


def entropies_for(control):
    return [TARGET + s * (0.05 + 0.01 * k) for k, s in enumerate(SIGNS[control])]


def objective_params_for(control):
    """The clip objective's parameters: DAPO's bounds; under ADAPO other values, which its overrides replace
    (eps_low = 0.2 fixed, eps_high its coefficient)."""
    return {"clip_ratio_low": 0.1, "clip_ratio_high": 0.5} if control == "adapo" else dict(CLIP)


def method_for(control):
    return Method.from_params(
        objective="clip",
        objective_params=objective_params_for(control),
        entropy_control=control,
        entropy_control_params=PARAMS[control],
        loss_agg="token-mean",
    )


def trainer_loss(case, control, controller):
    """PolicyLoss(method, controller) on the case: (loss, d loss / d logits)."""
    logits = case.logits.clone().requires_grad_(True)
    inp = PolicyInputs(
        logp=ref_token_logp(logits, case.responses),
        old_logp=case.old_logp,
        advantages=case.advantages,
        response_mask=case.mask,
        responses=case.responses,
        entropy=ref_token_entropy(logits),
    )
    loss = PolicyLoss(method_for(control), controller)(inp).loss
    (grad,) = torch.autograd.grad(loss, logits)
    return loss.detach(), grad


def reference_loss(case, control, coef):
    """ref_controlled_loss on the case: (loss, d loss / d logits)."""
    logits = case.logits.clone().requires_grad_(True)
    loss = ref_controlled_loss(
        ref_token_logp(logits, case.responses),
        case.old_logp,
        ref_token_entropy(logits),
        case.advantages,
        LENGTHS,
        control,
        coef,
    )
    (grad,) = torch.autograd.grad(loss, logits)
    return loss.detach(), grad


def assert_trajectory_acts(control, coefs):
    """The coefficient moves both ways, reaches its bounds, and (zeta, beta) changes sign."""
    params = PARAMS[control]
    steps = [b - a for a, b in zip(coefs, coefs[1:])]
    assert any(d > 0 for d in steps) and any(d < 0 for d in steps) and any(d == 0 for d in steps)
    if control == "adapo":
        assert params["eps_high_max"] in coefs and params["eps_high_min"] in coefs
        return
    low, high = (
        (params["zeta_min"], params["zeta_max"]) if "zeta0" in params else (params["beta_min"], params["beta_max"])
    )
    assert high in coefs  # the cap
    assert -low in coefs  # the flip from positive to negative
    if control == "repo_r":
        assert -high in coefs  # the negative cap: REPO-R's clamps need |zeta| logp < -1 on the unlikely tokens
    else:
        assert coefs.index(low, coefs.index(-low)) > 0  # the flip back from negative to positive


# -- tests --------------------------------------------------------------------------------------------
def test_case_is_not_trivial():
    """Ratios on both sides of every clip bound the controllers use; the unlikely tokens are unlikely."""
    case = make_control_case()
    ratio = (ref_token_logp(case.logits, case.responses) - case.old_logp).exp()[case.mask > 0]
    adv = case.advantages[case.mask > 0]
    bounds = [0.8] + [1 + e for e in ref_coefficients("adapo", entropies_for("adapo"))] + [1.28]
    assert min(abs(float(r) - b) for r in ratio for b in bounds) > 2e-3
    assert int(((ratio > 1.32) & (adv > 0)).sum()) >= 3 and int(((ratio < 0.8) & (adv < 0)).sum()) >= 3
    assert int(((ratio > 1.2) & (ratio < 1.32) & (adv > 0)).sum()) >= 2  # ADAPO's eps_high decides these
    assert int((adv == 0).sum()) > 0
    logp = ref_token_logp(case.logits, case.responses)
    assert all(float(logp[r, p]) < -25 for r, p in UNLIKELY)


@pytest.mark.parametrize("control", sorted(SIGNS))
def test_coefficient_trajectory_matches_the_paper_rule(control):
    """The coefficient each ``update`` reports equals the rule iterated by hand, target = first entropy."""
    entropies = entropies_for(control)
    ctl = ENTROPY_CONTROLLERS.get(control)(**PARAMS[control])
    got = [ctl.update(h)[METRIC[control]] for h in entropies]
    want = ref_coefficients(control, entropies)
    assert got == pytest.approx(want, rel=1e-12, abs=0)
    assert ctl.metrics()[ENTROPY_TARGET] == TARGET
    assert_trajectory_acts(control, want)


@pytest.mark.parametrize("control", sorted(SIGNS))
def test_trainer_loss_and_gradient_follow_the_coefficient(control):
    """At every iteration: loss and d/d logits of PolicyLoss with the updated controller equal the reference
    with the reference coefficient; the term the controller adds is well above the tolerance."""
    case = make_control_case()
    entropies = entropies_for(control)
    coefs = ref_coefficients(control, entropies)
    base, _ = reference_loss(case, None, None)
    ctl = ENTROPY_CONTROLLERS.get(control)(**PARAMS[control])
    added = []
    for step, (h, coef) in enumerate(zip(entropies, coefs)):
        ctl.update(h)
        loss, grad = trainer_loss(case, control, ctl)
        ref_loss, ref_grad = reference_loss(case, control, coef)
        torch.testing.assert_close(loss, ref_loss, **TOL, msg=lambda m, s=step: f"step {s}: {m}")
        torch.testing.assert_close(grad, ref_grad, **TOL, msg=lambda m, s=step: f"step {s}: {m}")
        added.append(abs(float(ref_loss - base)))
    # ADAPO changes the loss only while eps_high differs from DAPO's 0.28; the others at every step
    assert sum(a > 1e-4 for a in added) >= (len(added) // 2 if control == "adapo" else len(added))


def test_repo_r_clamps_act_at_zeta_max():
    """With |zeta| = zeta_max = 0.05 and log-prob about -30, 1 -/+ zeta logp changes sign: REPO-R's clamp sets
    the advantage to 0 (A > 0 at zeta < 0, A < 0 at zeta > 0), so the unlikely token gets no gradient."""
    case = make_control_case()
    logp = ref_token_logp(case.logits, case.responses)
    for zeta, (row, pos) in ((-0.05, UNLIKELY[0]), (0.05, UNLIKELY[1])):
        a = float(case.advantages[row, pos])
        assert ref_repo_r_advantage(a, float(logp[row, pos]), zeta) == 0.0
        ctl = ENTROPY_CONTROLLERS.get("repo_r")(**{**PARAMS["repo_r"], "zeta0": zeta})
        out = ctl.transform_advantages(case.advantages, logp, case.mask)
        assert float(out[row, pos]) == 0.0 and a != 0.0
        _, grad = trainer_loss(case, "repo_r", ctl)
        assert float(grad[row, pos].abs().sum()) == 0.0 and float(grad[row].abs().sum()) > 0
