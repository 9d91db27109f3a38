"""TROLL's projection solver (runners/algorithms/troll_solver.py) on the cases that mutation testing
found unchecked: the bracketing search step by step, its stop test and bounds, the Newton polish,
the implicit gradient of eta*, zero-probability entries, the diagnostics of ``project_with_info``,
dtypes, empty and multi-dimensional inputs, and the evaluation budgets.

References (float64 numpy/scipy, written from TROLL, arXiv 2510.03817, section 3.1 and appendix A):
- the projection (eq. 4) log p_eta = log_softmax((log q_new + eta log q_old) / (eta + 1)) on the
  common support, with eta* the root of KL(p_eta || q_old) = eps found by scipy's ``brentq``
  (``test_ref_troll.ref_project``, and ``np_root`` below where entries have zero probability);
- the negated dual (appendix A.2, Listing 2 ``dual``) f(eta) = eta eps + (eta + 1) logsumexp((lq + eta lo) / (eta + 1))
  over the common support;
- Listing 3's n-ary bracketing (with the stop test "every bracket narrower than tol") written out in
  numpy below (``np_bracketing``), evaluated for a few steps, where the dual values at the grid points
  differ far beyond rounding;
- d eta* / d lq (appendix A.3) by central differences of the brentq root.

Run: ``pytest tests/algorithms/test_troll_solver_mutants.py``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import brentq
from scipy.special import log_softmax as np_log_softmax
from scipy.special import logsumexp

from runners.algorithms import troll_solver
from runners.algorithms.troll_solver import (
    ImplicitEta,
    categorical_kl,
    dual_objective,
    log_normalize,
    project,
    project_with_info,
    solve_dual,
)

from .test_ref_troll import ref_project

EPS = 0.05
INF = math.inf
PAPER = dict(num_points=8, tol=1e-5, eta_min=1e-7, eta_max=1e2)  # Listing 3's values

# -- numpy references ------------------------------------------------------------------------------


def np_kl(logp: np.ndarray, logq: np.ndarray) -> np.ndarray:
    """KL(p || q) over the last axis; entries with p = 0 count 0, p > 0 with q = 0 gives +inf."""
    p = np.exp(logp)
    with np.errstate(invalid="ignore"):
        terms = np.where(p > 0, p * (logp - logq), 0.0)
    return terms.sum(-1)


def np_dual(log_eta: float, lq: np.ndarray, lo: np.ndarray, eps: float) -> float:
    """f(eta) = eta eps + (eta + 1) logsumexp((lq + eta lo) / (eta + 1)) over the common support."""
    both = np.isfinite(lq) & np.isfinite(lo)
    eta = math.exp(log_eta)
    return eta * eps + (eta + 1) * float(logsumexp((lq[both] + eta * lo[both]) / (eta + 1)))


def np_primal(lq: np.ndarray, lo: np.ndarray, eta: float) -> np.ndarray:
    """log p_eta (eq. 4) on the common support, -inf elsewhere."""
    both = np.isfinite(lq) & np.isfinite(lo)
    z = np.full(lq.shape, -INF)
    z[both] = (lq[both] + eta * lo[both]) / (eta + 1)
    return z - logsumexp(z[both])


def np_root(lq: np.ndarray, lo: np.ndarray, eps: float) -> float:
    """eta* > 0 with KL(p_eta || q_old) = eps, by brentq on log eta."""

    def gap(log_eta: float) -> float:
        return float(np_kl(np_primal(lq, lo, math.exp(log_eta)), lo)) - eps

    return math.exp(brentq(gap, -40.0, 40.0, xtol=1e-14, rtol=1e-15, maxiter=500))


def np_bracketing(lq, lo, eps, *, num_points=8, max_steps=20, tol=1e-5, eta_min=1e-7, eta_max=1e2):
    """Listing 3 (TROLL, arXiv 2510.03817): per row, evaluate the dual at num_points interior points of
    [l, u] (log eta), keep the argmin's two neighbours (the bracket end itself where the argmin is the
    first or last point), stop once every bracket is narrower than tol. Returns (eta, steps, converged)."""
    n = lq.shape[0]
    lower = np.full(n, math.log(eta_min))
    upper = np.full(n, math.log(eta_max))
    frac = np.arange(1, num_points + 1, dtype=np.float64) / (num_points + 1)
    steps = 0
    while steps < max_steps:
        steps += 1
        for r in range(n):
            x = lower[r] + (upper[r] - lower[r]) * frac
            b = int(np.argmin([np_dual(v, lq[r], lo[r], eps) for v in x]))
            lower[r] = lower[r] if b == 0 else x[b - 1]
            upper[r] = upper[r] if b == num_points - 1 else x[b + 1]
        if np.all(upper - lower < tol):
            break
    converged = (upper - lower < tol) & (upper < math.log(eta_max))
    return np.exp((lower + upper) / 2), steps, converged


def _pair(rows: int, vocab: int, seed: int, shift: float = 1.5) -> tuple[np.ndarray, np.ndarray]:
    """Random (log q_new, log q_old) [rows, V] float64: new = old + noise * shift."""
    rng = np.random.default_rng(seed)
    old = rng.normal(size=(rows, vocab)) * 2.0
    new = old + rng.normal(size=(rows, vocab)) * shift
    return np_log_softmax(new, -1), np_log_softmax(old, -1)


def _mixed_rows() -> tuple[np.ndarray, np.ndarray]:
    """Rows for the bracketing: two ordinary projections, one with eta* > 1e2 (KL(new || old) large, the
    bracket runs into eta_max), one inside the trust region (the dual increases: the bracket runs into
    eta_min) and one with zero-probability entries in both distributions (different ones)."""
    lq, lo = _pair(2, 7, seed=1)
    far_new = np_log_softmax(np.array([200.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]))
    far_old = np.full(7, -math.log(7.0))
    near_new, near_old = lo[0] + 1e-3 * np.arange(7), lo[0]
    near_new = near_new - logsumexp(near_new)
    zero_new = np_log_softmax(np.array([1.0, -INF, 4.0, 0.0, -1.0, 0.3, -INF]))
    zero_old = np_log_softmax(np.array([-INF, -4.0, 0.0, 2.5, -2.0, 0.7, -4.0]))
    lq = np.stack([lq[0], lq[1], far_new, near_new, zero_new])
    lo = np.stack([lo[0], lo[1], far_old, near_old, zero_old])
    return lq, lo


def _t(a: np.ndarray, dtype=torch.float64, requires_grad: bool = False) -> torch.Tensor:
    return torch.tensor(a, dtype=dtype, requires_grad=requires_grad)


# -- categorical_kl, log_normalize, dual_objective -------------------------------------------------


def test_categorical_kl_values_gradients_and_zero_mass_over_leading_dims():
    """KL over the last dim of a [2, 3, 4] batch against numpy; p(x) = 0 terms count 0 (also where
    q(x) = 0), p(x) > 0 with q(x) = 0 is +inf; the gradients are d/d log p = p (log p - log q + 1) and
    d/d log q = -p (0 where p = 0), without NaN."""
    rng = np.random.default_rng(0)
    raw_p, raw_q = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 3, 4))
    raw_p[0, 0, 1] = raw_q[0, 0, 1] = -INF  # zero in both
    raw_p[0, 1, 2] = -INF  # zero in p only
    raw_p[1, 2, 0] = raw_q[1, 2, 0] = -INF
    logp, logq = np_log_softmax(raw_p, -1), np_log_softmax(raw_q, -1)
    lp, lq = _t(logp, requires_grad=True), _t(logq, requires_grad=True)
    kl = categorical_kl(lp, lq)
    assert kl.shape == (2, 3)
    np.testing.assert_allclose(kl.detach().numpy(), np_kl(logp, logq), rtol=1e-13, atol=1e-15)
    weights = torch.tensor([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]], dtype=torch.float64)
    (kl * weights).sum().backward()
    p = np.exp(logp)
    w = weights.numpy()[..., None]
    grad_p = np.where(p > 0, p * (np.where(p > 0, logp, 0) - np.where(p > 0, logq, 0) + 1), 0.0) * w
    np.testing.assert_allclose(lp.grad.numpy(), grad_p, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(lq.grad.numpy(), -p * w, rtol=1e-12, atol=1e-15)
    # p > 0 where q = 0: +inf
    inf_case = categorical_kl(_t(np.array([[-math.log(2), -math.log(2)]])), _t(np.array([[0.0, -INF]])))
    assert inf_case.tolist() == [INF]


def test_log_normalize_is_log_softmax_over_the_last_dim_of_any_rank():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 3, 5)) * 3
    x[1, 0, :3] = -INF
    np.testing.assert_allclose(log_normalize(_t(x)).numpy(), np_log_softmax(x, -1), rtol=1e-13, atol=1e-13)
    v = rng.normal(size=6)
    np.testing.assert_allclose(log_normalize(_t(v)).numpy(), np_log_softmax(v), rtol=1e-13, atol=1e-13)


def test_dual_objective_matches_the_formula_of_appendix_a2():
    """N = 3 rows, P = 4 points, D = 6 entries (all different), zero-probability entries in one, the
    other or both distributions (left out of the logsumexp), eta from 1e-3 to 30."""
    lq, lo = _pair(3, 6, seed=2)
    lq[1] = np_log_softmax(np.where(np.arange(6) == 2, -INF, lq[1]))  # zero in new only
    lo[1] = np_log_softmax(np.where(np.arange(6) == 5, -INF, lo[1]))  # zero in old only
    lq[2] = np_log_softmax(np.where(np.arange(6) == 4, -INF, lq[2]))  # zero in both
    lo[2] = np_log_softmax(np.where(np.arange(6) == 4, -INF, lo[2]))
    log_eta = np.log(np.array([[1e-3, 0.2, 1.0, 30.0], [0.05, 0.5, 2.0, 7.0], [1e-2, 0.3, 3.0, 10.0]]))
    for eps in (EPS, 0.7):
        got = dual_objective(_t(log_eta), _t(lq), _t(lo), eps).numpy()
        ref = np.array([[np_dual(v, lq[r], lo[r], eps) for v in log_eta[r]] for r in range(3)])
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-14)
    one = dual_objective(_t(log_eta[:, :1]), _t(lq), _t(lo), EPS).numpy()  # a single point
    np.testing.assert_allclose(
        one[:, 0], [np_dual(log_eta[r, 0], lq[r], lo[r], EPS) for r in range(3)], rtol=1e-12, atol=1e-14
    )


def test_dual_objective_gradients_are_the_constraint_gap_and_the_projection():
    """Differentiating the dual (appendix A.2): d f / d log eta = eta (eps - KL(p_eta || q_old)) and
    d f / d lq = p_eta (the projection, eq. 4; 0 off the common support), finite with zero-probability
    entries in new, old or both."""
    lq, lo = _pair(3, 6, seed=2)
    lq[1] = np_log_softmax(np.where(np.arange(6) == 2, -INF, lq[1]))  # zero in new only
    lo[1] = np_log_softmax(np.where(np.arange(6) == 5, -INF, lo[1]))  # zero in old only
    lq[2] = np_log_softmax(np.where(np.arange(6) == 4, -INF, lq[2]))  # zero in both
    lo[2] = np_log_softmax(np.where(np.arange(6) == 4, -INF, lo[2]))
    for point in (0.3, 4.0):
        log_eta = _t(np.full((3, 1), math.log(point)), requires_grad=True)
        x = _t(lq, requires_grad=True)
        dual_objective(log_eta, x, _t(lo), EPS).sum().backward()
        primal = np.stack([np_primal(lq[r], lo[r], point) for r in range(3)])
        gap = np.array([point * (EPS - np_kl(primal[r], lo[r])) for r in range(3)])
        np.testing.assert_allclose(log_eta.grad.numpy()[:, 0], gap, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(x.grad.numpy(), np.exp(primal), rtol=1e-10, atol=1e-15)


# -- solve_dual: Listing 3 -------------------------------------------------------------------------


@pytest.mark.parametrize("max_steps", [1, 2, 3, 4])
def test_solve_dual_defaults_follow_listing_3_step_by_step(max_steps):
    """The defaults (8 points, eta in [1e-7, 1e2], tol 1e-5, no polish) against the numpy bracketing:
    every row's eta after 1-4 steps (the brackets are coarse enough there for the argmin to be exact),
    including rows whose argmin is the first or last point."""
    lq, lo = _mixed_rows()
    ref_eta, ref_steps, ref_conv = np_bracketing(lq, lo, EPS, max_steps=max_steps)
    sol = solve_dual(_t(lq), _t(lo), EPS, max_steps=max_steps)
    np.testing.assert_allclose(sol.eta.numpy(), ref_eta, rtol=1e-12)
    assert sol.steps == ref_steps == max_steps
    assert sol.converged.tolist() == ref_conv.tolist() == [False] * 5
    assert sol.eta.dtype == torch.float64


@pytest.mark.parametrize(
    "options",
    [
        dict(num_points=2, max_steps=6),
        dict(num_points=3, max_steps=5, eta_min=1e-3, eta_max=1e3),
        dict(num_points=5, max_steps=20, tol=1e-2, eta_min=1e-4, eta_max=10.0),
        dict(num_points=1, max_steps=3),
        dict(num_points=7, max_steps=20, tol=0.3),
    ],
    ids=["p2", "p3-range", "p5-converges", "p1-no-shrink", "p7-coarse"],
)
def test_solve_dual_options_follow_listing_3(options):
    """Other point counts, ranges and tolerances, against the numpy bracketing: eta, the step count
    (the stop test ends the runs with a coarse tol early) and the converged flags (bracket narrower than
    tol and below eta_max: rows that run into eta_max are not converged)."""
    lq, lo = _mixed_rows()
    ref_eta, ref_steps, ref_conv = np_bracketing(lq, lo, EPS, **options)
    sol = solve_dual(_t(lq), _t(lo), EPS, **options)
    np.testing.assert_allclose(sol.eta.numpy(), ref_eta, rtol=1e-12)
    assert sol.steps == ref_steps
    assert sol.converged.tolist() == ref_conv.tolist()


def test_solve_dual_converges_to_the_brentq_root_with_the_default_options():
    """Default options (20 steps at most, tol 1e-5): 10 steps, eta* within the bracket tolerance of the
    root, converged; with tol = 1e-12 the default cap of 20 steps ends the search."""
    lq, lo = _pair(4, 6, seed=7)
    sol = solve_dual(_t(lq), _t(lo), EPS)
    assert sol.steps == 10 and sol.converged.all()
    roots = np.array([np_root(lq[r], lo[r], EPS) for r in range(4)])
    np.testing.assert_allclose(sol.eta.numpy(), roots, rtol=2e-5)
    capped = solve_dual(_t(lq), _t(lo), EPS, tol=1e-12)
    assert capped.steps == 20 and not capped.converged.any()


def test_solve_dual_stop_test_and_converged_flag_are_strict():
    """Rows inside the trust region: the dual increases, every step keeps [l, x_2] (2 points). With
    tol exactly the width after one step, (u - l) < tol is false: no stop, not converged; a tol one ulp
    above it stops after one step and converges."""
    lq, lo = _pair(2, 5, seed=4, shift=0.05)
    assert (np_kl(lq, lo) < EPS).all()
    lower, upper = math.log(1e-7), math.log(1e2)
    width = (lower + (upper - lower) * (2.0 / 3.0)) - lower  # x_2 - l in float64, as Listing 3 computes it
    at = solve_dual(_t(lq), _t(lo), EPS, num_points=2, tol=width, max_steps=2)
    assert at.steps == 2 and at.converged.tolist() == [True, True]  # the second step narrows it below tol
    once = solve_dual(_t(lq), _t(lo), EPS, num_points=2, tol=width, max_steps=1)
    assert once.steps == 1 and once.converged.tolist() == [False, False]
    above = solve_dual(_t(lq), _t(lo), EPS, num_points=2, tol=math.nextafter(width, INF), max_steps=2)
    assert above.steps == 1 and above.converged.tolist() == [True, True]
    x_2 = lower + (upper - lower) * (2.0 / 3.0)
    np.testing.assert_allclose(above.eta.numpy(), math.exp((lower + x_2) / 2), rtol=1e-14)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(eps=0.0), "eps must be > 0"),
        (dict(eps=-0.1), "eps must be > 0"),
        (dict(eps=EPS, eta_min=0.0), "0 < eta_min < eta_max"),
        (dict(eps=EPS, eta_min=-1.0), "0 < eta_min < eta_max"),
        (dict(eps=EPS, eta_min=2.0, eta_max=2.0), "0 < eta_min < eta_max"),
        (dict(eps=EPS, eta_min=3.0, eta_max=2.0), "0 < eta_min < eta_max"),
        (dict(eps=EPS, num_points=0), "num_points >= 1 and max_steps >= 1"),
        (dict(eps=EPS, max_steps=0), "num_points >= 1 and max_steps >= 1"),
    ],
)
def test_solve_dual_rejects_bad_options(kwargs, match):
    lq, lo = _pair(1, 4, seed=5)
    with pytest.raises(ValueError, match=match):
        solve_dual(_t(lq), _t(lo), **kwargs)


def test_solve_dual_accepts_the_smallest_valid_options():
    """eps = 1.5 (> 1), eta_min = 0.5 (> 0 but < 1), one point, one step: valid, Listing 3 as usual."""
    lq, lo = _mixed_rows()
    for eps, options in ((1.5, dict(max_steps=3)), (EPS, dict(eta_min=0.5, max_steps=3)),
                         (EPS, dict(num_points=1, max_steps=1)), (EPS, dict(max_steps=1))):  # fmt: skip
        ref_eta, ref_steps, _ = np_bracketing(lq, lo, eps, **options)
        sol = solve_dual(_t(lq), _t(lo), eps, **options)
        np.testing.assert_allclose(sol.eta.numpy(), ref_eta, rtol=1e-12)
        assert sol.steps == ref_steps == options["max_steps"]


# -- polish ----------------------------------------------------------------------------------------


def test_polish_reaches_the_root_and_is_clamped_to_the_search_interval():
    """polish_steps Newton steps: 1 step already ends far closer to the brentq root than the bracket
    midpoint; 3 steps reach it to ~1e-12. A row whose root lies above eta_max ends exactly at eta_max,
    one whose root lies below eta_min exactly at eta_min."""
    lq, lo = _pair(4, 6, seed=6)
    roots = np.array([np_root(lq[r], lo[r], EPS) for r in range(4)])
    plain = np.abs(solve_dual(_t(lq), _t(lo), EPS).eta.numpy() / roots - 1)
    one = np.abs(solve_dual(_t(lq), _t(lo), EPS, polish_steps=1).eta.numpy() / roots - 1)
    three = solve_dual(_t(lq), _t(lo), EPS, polish_steps=3).eta.numpy()
    assert plain.max() > 1e-7 and one.max() < 1e-3 * plain.max()
    np.testing.assert_allclose(three, roots, rtol=1e-11)
    # roots outside [eta_min, eta_max]
    kl0 = float(np_kl(lq[0], lo[0]))
    tiny_eps = kl0 * (1 - 1e-10)  # KL(new || old) just above eps: eta* ~ 1e-10
    assert np_root(lq[0], lo[0], tiny_eps) < 1e-8
    low = solve_dual(_t(lq[:1]), _t(lo[:1]), tiny_eps, eta_min=1e-7, polish_steps=2)
    assert low.eta.item() == pytest.approx(1e-7, rel=1e-13)
    assert np_root(lq[1], lo[1], 1e-4) > 10.0
    high = solve_dual(_t(lq[1:2]), _t(lo[1:2]), 1e-4, eta_max=10.0, polish_steps=2)
    assert high.eta.item() == pytest.approx(10.0, rel=1e-13) and not high.converged.any()


def _flat_pair() -> tuple[np.ndarray, np.ndarray]:
    """new = old restricted to the first two entries: on the common support lq - lo = log 2 exactly,
    so p_eta = new for every eta, KL(p_eta || old) = log 2 whatever eta, and d KL / d eta = 0."""
    lq = np.array([[math.log(0.5), math.log(0.5), -INF]])
    lo = np.log(np.array([[0.25, 0.25, 0.5]]))
    return lq, lo


def test_polish_leaves_a_row_without_slope_at_the_bracket_midpoint():
    """d KL / d eta = 0 (``_flat_pair``): no Newton step is defined, the bracket midpoint stays (the
    dual eta (eps - log 2) decreases: the bracket runs into eta_max, not converged)."""
    lq, lo = _flat_pair()
    ref_eta, _, ref_conv = np_bracketing(lq, lo, EPS, max_steps=6)
    sol = solve_dual(_t(lq), _t(lo), EPS, max_steps=6, polish_steps=2)
    np.testing.assert_allclose(sol.eta.numpy(), ref_eta, rtol=1e-12)
    assert 50.0 < float(sol.eta[0]) < 1e2 and sol.converged.tolist() == ref_conv.tolist() == [False]


# -- ImplicitEta: appendix A.3 ---------------------------------------------------------------------


def test_implicit_eta_gradient_is_the_derivative_of_the_root():
    """d eta* / d lq by central differences of the brentq root, weighted by an upstream gradient
    (0.7, -1.3, 2.0); zero-probability entries (in new, in old) get zero gradient; rows flagged inactive
    get zero; a row with d KL / d eta = 0 gets zero (no NaN) even when flagged active."""
    lq, lo = _pair(3, 5, seed=7)
    lq[1] = np_log_softmax(np.where(np.arange(5) == 3, -INF, lq[1]))
    lo[2] = np_log_softmax(np.where(np.arange(5) == 0, -INF, lo[2]))
    roots = np.array([np_root(lq[r], lo[r], EPS) for r in range(3)])
    upstream = np.array([0.7, -1.3, 2.0])
    ref = np.zeros_like(lq)
    h = 1e-6
    for r in range(3):
        for v in range(5):
            if not (np.isfinite(lq[r, v]) and np.isfinite(lo[r, v])):
                continue
            plus, minus = lq[r].copy(), lq[r].copy()
            plus[v] += h
            minus[v] -= h
            ref[r, v] = upstream[r] * (np_root(plus, lo[r], EPS) - np_root(minus, lo[r], EPS)) / (2 * h)
    x = _t(lq, requires_grad=True)
    eta = ImplicitEta.apply(x, _t(lo), _t(roots), torch.tensor([True, True, True]))
    assert torch.equal(eta.detach(), _t(roots))
    (eta * _t(upstream)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), ref, rtol=1e-6, atol=1e-9)
    assert np.abs(ref).max() > 1e-2
    # inactive rows: zero
    x2 = _t(lq, requires_grad=True)
    eta2 = ImplicitEta.apply(x2, _t(lo), _t(roots), torch.tensor([True, False, True]))
    (eta2 * _t(upstream)).sum().backward()
    np.testing.assert_allclose(x2.grad.numpy()[[0, 2]], ref[[0, 2]], rtol=1e-6, atol=1e-9)
    assert torch.equal(x2.grad[1], torch.zeros(5, dtype=torch.float64))
    # no slope: zero, no NaN
    flat_q, flat_o = _flat_pair()
    x3 = _t(flat_q, requires_grad=True)
    ImplicitEta.apply(x3, _t(flat_o), _t(np.array([0.3])), torch.tensor([True])).sum().backward()
    assert torch.equal(x3.grad, torch.zeros(1, 3, dtype=torch.float64))


def test_projection_gradient_with_zero_probability_entries_matches_the_reference():
    """d/d lq of a weighted sum of the projected log-probs (their finite entries: the others are -inf
    whatever lq) against central differences of the brentq projection, on rows with zero-probability
    entries in either distribution; no NaN. The projection depends on lq only up to a constant (a
    softmax), so lq is perturbed as it is."""
    lq, lo = _mixed_rows()
    lq, lo = lq[[0, 1, 4]], lo[[0, 1, 4]]
    rng = np.random.default_rng(8)
    weights = rng.normal(size=lq.shape)
    finite = np.isfinite(lq) & np.isfinite(lo)

    def value(row_q: np.ndarray, r: int) -> float:
        lp = np_primal(row_q, lo[r], np_root(row_q, lo[r], EPS))
        return float(np.sum(weights[r][finite[r]] * lp[finite[r]]))

    ref = np.zeros_like(lq)
    h = 1e-6
    for r in range(3):
        for v in np.flatnonzero(finite[r]):
            plus, minus = lq[r].copy(), lq[r].copy()
            plus[v] += h
            minus[v] -= h
            ref[r, v] = (value(plus, r) - value(minus, r)) / (2 * h)
    x = _t(lq, requires_grad=True)
    lp, info = project_with_info(x, _t(lo), EPS, polish_steps=3)
    assert info.projected.all() and info.converged.all()
    assert torch.equal(torch.isfinite(lp.detach()), torch.from_numpy(finite))
    (torch.where(torch.from_numpy(finite), lp, torch.zeros_like(lp)) * _t(weights)).sum().backward()
    assert not torch.isnan(x.grad).any()
    np.testing.assert_allclose(x.grad.numpy(), ref, rtol=1e-5, atol=1e-7)
    assert np.abs(ref).max() > 0.1


# -- project_with_info -----------------------------------------------------------------------------


def test_project_with_info_mixed_rows_values_flags_and_dtypes():
    """A [2, 3, V] float32 batch: rows inside (unchanged, eta 0, converged), outside (on the boundary,
    eta* ~ root), with zero-probability entries, unreachable (eta_max = 10: not converged), and disjoint
    supports (the old distribution, not converged, eta still reported). dtypes: output float32,
    eta and KLs float64, flags bool; KLs before and after against numpy."""
    vocab = 7
    lq, lo = _mixed_rows()  # 0, 1 ordinary; 2 unreachable below eta_max 10; 3 inside; 4 zeros
    disjoint_q = np.array([math.log(0.6), math.log(0.4)] + [-INF] * 5)
    disjoint_o = np.array([-INF, -INF] + [math.log(0.2)] * 5)
    inside_q, inside_o = lo[0], lo[0]  # KL 0
    new = np.stack([lq[0], lq[3], lq[2], disjoint_q, lq[4], inside_q])
    old = np.stack([lo[0], lo[3], lo[2], disjoint_o, lo[4], inside_o])
    new32 = new.astype(np.float32)
    x = torch.tensor(new32).reshape(2, 3, vocab).requires_grad_()
    out, info = project_with_info(x, torch.tensor(old, dtype=torch.float32).reshape(2, 3, vocab), EPS,
                                  eta_max=10.0, polish_steps=3)  # fmt: skip
    assert out.shape == (2, 3, vocab) and out.dtype == torch.float32
    assert info.eta.dtype == torch.float64 and info.kl_before.dtype == torch.float64
    assert info.kl_after.dtype == torch.float64
    assert info.projected.dtype == torch.bool and info.converged.dtype == torch.bool
    new64, old64 = new32.astype(np.float64), old.astype(np.float32).astype(np.float64)
    kl_before = np_kl(new64, old64)
    np.testing.assert_allclose(info.kl_before.numpy(), kl_before, rtol=1e-12)
    expected_projected = [True, False, True, True, True, False]
    assert info.projected.tolist() == expected_projected
    assert info.converged.tolist() == [True, True, False, False, True, True]
    flat = out.detach().reshape(-1, vocab).double().numpy()
    assert np.array_equal(flat[[1, 5]], new32[[1, 5]].astype(np.float64))  # inside: unchanged
    assert np.array_equal(flat[3], old64[3])  # disjoint: the old distribution
    for r in (0, 4):
        ref = np_primal(new64[r], old64[r], np_root(new64[r], old64[r], EPS))
        np.testing.assert_allclose(flat[r], ref.astype(np.float32), rtol=2e-6, atol=2e-7)
        np.testing.assert_allclose(info.eta[r].item(), np_root(new64[r], old64[r], EPS), rtol=1e-9)
    assert info.eta[1].item() == info.eta[5].item() == 0.0
    assert info.eta[2].item() == pytest.approx(10.0, rel=1e-14)  # polished into the bound
    assert info.eta[3].item() > 0
    np.testing.assert_allclose(flat[2], np_primal(new64[2], old64[2], 10.0).astype(np.float32), rtol=2e-6, atol=1e-6)
    kl_after = kl_before.copy()
    for r in (0, 2, 3, 4):
        kl_after[r] = np_kl(np_primal(new64[r], old64[r], info.eta[r].item()) if r != 3 else old64[3], old64[r])
    np.testing.assert_allclose(info.kl_after.numpy(), kl_after, rtol=1e-9, atol=1e-12)
    assert info.kl_after[0].item() == pytest.approx(EPS, rel=1e-9)
    assert info.steps == 10
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_project_with_info_without_projected_rows_returns_the_input():
    """Every row inside the trust region: the input tensor itself, eta 0 (float64), converged, 0 steps,
    KL after = KL before (float64, against numpy)."""
    lq, lo = _pair(3, 5, seed=9, shift=0.05)
    x = torch.tensor(lq, dtype=torch.float32)
    out, info = project_with_info(x, torch.tensor(lo, dtype=torch.float32), EPS)
    assert out is x
    assert info.projected.tolist() == [False] * 3 and info.converged.tolist() == [True] * 3
    assert info.converged.dtype == torch.bool and info.eta.dtype == torch.float64
    assert torch.equal(info.eta, torch.zeros(3, dtype=torch.float64)) and info.steps == 0
    ref = np_kl(lq.astype(np.float32).astype(np.float64), lo.astype(np.float32).astype(np.float64))
    np.testing.assert_allclose(info.kl_before.numpy(), ref, rtol=1e-12)
    assert info.kl_after.dtype == torch.float64 and torch.equal(info.kl_after, info.kl_before)


def test_a_row_with_kl_exactly_eps_is_not_projected():
    """TROLL projects where KL(q_new || q_old) > eps: one-hot vs uniform over 2 has KL = log 2 exactly."""
    lq = torch.tensor([[0.0, -INF], [0.0, -INF]], dtype=torch.float64)
    lo = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.float64))
    out, info = project_with_info(lq, lo, math.log(2.0))
    assert info.projected.tolist() == [False, False] and out is lq and info.steps == 0
    _, below = project_with_info(lq, lo, math.log(2.0) * (1 - 1e-9))
    assert below.projected.tolist() == [True, True]


def test_project_with_info_on_an_empty_batch():
    x = torch.zeros(0, 4, dtype=torch.float32)
    out, info = project_with_info(x, x.clone(), EPS)
    assert out.shape == (0, 4)
    for field in (info.projected, info.eta, info.converged, info.kl_before, info.kl_after):
        assert field.shape == (0,)
    assert info.kl_before.dtype == info.kl_after.dtype == info.eta.dtype == torch.float64
    assert info.steps == 0


def test_project_with_info_rejects_different_shapes():
    with pytest.raises(ValueError, match=r"new_logp \(2, 3\) and old_logp \(2, 4\) differ in shape"):
        project_with_info(torch.zeros(2, 3), torch.zeros(2, 4), EPS)


def test_project_passes_solver_options_and_returns_the_projection():
    """``project`` is ``project_with_info``'s tensor with the same solver options: with polish_steps the
    rows reach the brentq projection to ~1e-12 (without, only to the bracket's ~1e-5)."""
    lq, lo = _pair(3, 6, seed=10)
    ref = np.stack([ref_project(lq[r], lo[r], EPS)[0] for r in range(3)])
    got = project(_t(lq), _t(lo), EPS, polish_steps=3)
    assert isinstance(got, torch.Tensor)
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-10, atol=1e-12)
    # eta_max = 1e-3 below every root: the brackets run into it (Listing 3 in numpy gives eta)
    ref_eta, _, _ = np_bracketing(lq, lo, EPS, eta_max=1e-3)
    assert (ref_eta < 1e-3).all() and (ref_eta > 0.99e-3).all()
    capped = project(_t(lq).reshape(3, 1, 6), _t(lo).reshape(3, 1, 6), EPS, eta_max=1e-3)
    expected = np.stack([np_primal(lq[r], lo[r], ref_eta[r]) for r in range(3)])
    np.testing.assert_allclose(capped.reshape(3, 6).numpy(), expected, rtol=1e-12, atol=1e-13)


# -- evaluation budgets ----------------------------------------------------------------------------


def test_dual_evaluations_stay_within_the_budget(monkeypatch):
    """solve_dual evaluates the dual in row blocks of at most _DUAL_EVAL_BUDGET (row, point, entry)
    values, as many rows per block as fit (at least one row when one row alone exceeds it); the
    blocks cover every row once, so eta is the unblocked one."""
    lq, lo = _mixed_rows()
    ref_eta, _, _ = np_bracketing(lq, lo, EPS, max_steps=2)
    seen = []
    original = troll_solver._dual_values

    def spy(log_eta, base, diff, eps):
        seen.append(log_eta.shape[0])
        return original(log_eta, base, diff, eps)

    monkeypatch.setattr(troll_solver, "_dual_values", spy)
    for budget, blocks in ((2 * 8 * 7, [2, 2, 1]), (8 * 7 - 1, [1, 1, 1, 1, 1]), (1 << 24, [5])):
        monkeypatch.setattr(troll_solver, "_DUAL_EVAL_BUDGET", budget)
        seen.clear()
        sol = solve_dual(_t(lq), _t(lo), EPS, max_steps=2)
        assert seen == blocks * 2, budget
        np.testing.assert_allclose(sol.eta.numpy(), ref_eta, rtol=1e-12)
    # one point and one entry per row: D = 1 (KL 0: eta* is eta_min), 4 rows per block of 4 values
    monkeypatch.setattr(troll_solver, "_DUAL_EVAL_BUDGET", 4)
    seen.clear()
    solve_dual(torch.zeros(9, 1, dtype=torch.float64), torch.zeros(9, 1, dtype=torch.float64), EPS,
               num_points=1, max_steps=1)  # fmt: skip
    assert seen == [4, 4, 1]


def test_kl_before_is_computed_in_blocks_of_at_most_2_22_values(monkeypatch):
    """project_with_info computes KL(q_new || q_old) in float64 blocks of at most 2^22 values (as many
    rows as fit, one row at least); rows inside the trust region (KL 0) return early."""
    seen = []
    original = troll_solver.categorical_kl

    def spy(logp, logq):
        seen.append(tuple(logp.shape))
        assert logp.dtype == logq.dtype == torch.float64
        return original(logp, logq)

    monkeypatch.setattr(troll_solver, "categorical_kl", spy)
    vocab = (1 << 20) + 1  # 3 rows per block
    x = torch.full((1, 7, vocab), -math.log(vocab), dtype=torch.float32)
    _, info = project_with_info(x, x, EPS)
    assert [s[0] for s in seen] == [3, 3, 1] and info.kl_before.shape == (7,)
    seen.clear()
    x = torch.full((2, (1 << 21) + 1), -math.log((1 << 21) + 1), dtype=torch.float32)  # one row per block
    project_with_info(x, x, EPS)
    assert [s[0] for s in seen] == [1, 1]
    seen.clear()
    x = torch.zeros((1 << 21) + 1, 1, dtype=torch.float32)  # V = 1: 2^22 rows per block
    project_with_info(x, x, EPS)
    assert [s[0] for s in seen] == [(1 << 21) + 1]
