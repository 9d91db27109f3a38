"""TROLL's trust-region projection of categorical distributions (TROLL, arXiv 2510.03817, section 3.1, appendix A).

Design: the projection is ordinary autograd code (TROLL, arXiv 2510.03817, Listing 1) around one scalar per token,
the dual step size eta*. eta* comes from a gradient-free batched n-ary bracketing search on the
convex dual (Listing 3, with its stop test corrected: the printed test is always true) and enters the
graph through ``ImplicitEta``, an ``autograd.Function`` whose backward is the closed-form implicit
gradient of appendix A.3, so no gradient ever flows through the search itself. Only tokens outside
the trust region are solved for; the rest are returned unchanged (eta* = 0, zero gradient through
eta). Solved rows are computed in float64: the dual is flat near its minimum, and in float32 the
argmin of 8 nearly equal values is noise. eta* is the midpoint of the last bracket (Listing 3), so
a projected row ends within about 1e-4 * eps of the boundary (the tests check KL <= eps (1 + 1e-4));
``polish_steps`` adds Newton steps for machine precision. A row counts as converged when its
bracket is narrower than ``tol`` and below eta_max (otherwise the constraint is not reached).

-inf log-probabilities (zero probability) are handled with masked arithmetic so that neither the
forward nor the backward produces NaN: a token that has zero mass under the old policy gets zero
mass after projection (for eta* > 0), and a row whose new and old supports are disjoint has no
feasible projection; it is returned as the old distribution and flagged as not converged.

    from runners.algorithms.troll_solver import project
    lp = project(torch.log_softmax(logits, -1), old_logp, 0.05)   # [..., V] -> [..., V]

Tests: ``pytest tests/algorithms/test_troll.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "DualSolution",
    "ImplicitEta",
    "ProjectionInfo",
    "bracket_steps",
    "categorical_kl",
    "dual_objective",
    "log_normalize",
    "project",
    "project_with_info",
    "solve_dual",
]

# evaluate at most this many (row, point, entry) values of the dual at once (float64: 128 MiB)
_DUAL_EVAL_BUDGET = 1 << 24


@dataclass
class DualSolution:
    """Result of ``solve_dual`` for N rows."""

    eta: Tensor  # [N] eta*, float64
    steps: int  # bracketing steps used (the same for every row)
    converged: Tensor  # [N] bool: bracket narrower than tol and eta* below eta_max (constraint met)


@dataclass
class ProjectionInfo:
    """Diagnostics of ``project_with_info`` for N = prod(leading shape) rows."""

    projected: Tensor  # [N] bool, KL(q_new || q_old) > eps
    eta: Tensor  # [N] eta* (0 where not projected)
    converged: Tensor  # [N] bool (True where not projected)
    steps: int  # bracketing steps of the solve (0 if no row was projected)
    kl_before: Tensor  # [N] KL(q_new || q_old), detached
    kl_after: Tensor  # [N] KL(q_proj || q_old), detached


def categorical_kl(logp: Tensor, logq: Tensor) -> Tensor:
    """KL(p || q) = sum_x p(x) (log p(x) - log q(x)) over the last dim; [..., V] -> [...].

    Terms with p(x) = 0 count 0 (also when log q(x) = -inf); p(x) > 0 with q(x) = 0 gives +inf.
    Differentiable in both arguments without NaN where p(x) = 0.
    """
    support = logp > -math.inf
    lp = torch.where(support, logp, torch.zeros_like(logp))
    lq = torch.where(support, logq, torch.zeros_like(logq))
    return torch.where(support, lp.exp() * (lp - lq), torch.zeros_like(lp)).sum(-1)


def log_normalize(x: Tensor) -> Tensor:
    """x - logsumexp(x) over the last dim: log_softmax's values, used on the small [N, K+2] rows.

    ATen's log_softmax kernel took ~10 ms per call on a [8, 24] tensor on the loaded 2-core test
    machine (OpenMP threads contended) against ~20 us for this form. Rows must have a finite entry.
    """
    return x - torch.logsumexp(x, dim=-1, keepdim=True)


def _primal(lq: Tensor, lo: Tensor, eta: Tensor) -> Tensor:
    """Projected log-probs log_softmax((eta lo + lq) / (eta + 1)), TROLL (arXiv 2510.03817) eq. 4 / eq. 17.

    lq, lo [N,D]; eta [N] (> 0). Entries where either input is -inf are -inf (no NaN in backward).
    """
    both = (lq > -math.inf) & (lo > -math.inf)
    zero = torch.zeros_like(lq)
    e = eta.unsqueeze(-1)
    inner = (e * torch.where(both, lo, zero) + torch.where(both, lq, zero)) / (e + 1)
    inner = torch.where(both, inner, torch.full_like(inner, -math.inf))
    return log_normalize(inner)


def dual_objective(log_eta: Tensor, lq: Tensor, lo: Tensor, eps: float) -> Tensor:
    """Negated dual of the projection, to minimise (TROLL, arXiv 2510.03817, appendix A.2, Listing 2 ``dual``).

    f(eta) = eta * eps + (eta + 1) * logsumexp((lq + eta lo) / (eta + 1)), eta = exp(log_eta).
    log_eta [N,P] evaluation points, lq/lo [N,D] -> [N,P].
    """
    return _dual_values(log_eta, *_dual_terms(lq, lo), eps)


def _dual_terms(lq: Tensor, lo: Tensor) -> tuple[Tensor, Tensor]:
    """(lq + eta lo) / (eta + 1) = base + diff / (eta + 1): base = lo on the common support
    (-inf elsewhere), diff = lq - lo there (0 elsewhere). Computed once per solve; [N,D] each."""
    both = (lq > -math.inf) & (lo > -math.inf)
    lo0 = torch.where(both, lo, torch.zeros_like(lo))
    diff = torch.where(both, lq, torch.zeros_like(lq)) - lo0
    return torch.where(both, lo0, torch.full_like(lo0, -math.inf)), diff


def _dual_values(log_eta: Tensor, base: Tensor, diff: Tensor, eps: float) -> Tensor:
    """f at log_eta [N,P] from ``_dual_terms`` -> [N,P]."""
    eta = log_eta.exp()
    inner = base.unsqueeze(1) + diff.unsqueeze(1) * (1 / (eta + 1)).unsqueeze(-1)
    return eta * eps + (eta + 1) * torch.logsumexp(inner, dim=-1)


def _kl_and_slope(lq: Tensor, lo: Tensor, eta: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """KL(q_eta || old), d KL / d eta and the pieces of appendix A.3 at eta [N].

    Returns (kl [N], dkl_deta [N], q [N,D], c [N,D]) with q = projected probs and
    c = 1 + log q - lo (0 off the support). dkl_deta = <c, dq/deta>, dq/deta = q (d - <q,d>) / (eta+1)^2
    with d = lo - lq (appendix A.3).
    """
    lp = _primal(lq, lo, eta)
    q = lp.exp()
    support = q > 0
    zero = torch.zeros_like(lp)
    c = torch.where(support, 1 + lp - torch.where(support, lo, zero), zero)
    d = torch.where(support, torch.where(support, lo, zero) - torch.where(support, lq, zero), zero)
    dq_deta = q * (d - (q * d).sum(-1, keepdim=True)) / (eta.unsqueeze(-1) + 1) ** 2
    kl = (q * (c - 1)).sum(-1)
    return kl, (c * dq_deta).sum(-1), q, c


def bracket_steps(num_points: int, max_steps: int, tol: float, width: float) -> int:
    """Steps of ``solve_dual``'s search until every bracket is narrower than ``tol`` (at most ``max_steps``).

    Each step keeps the two grid neighbours of a bracket's argmin among ``num_points`` evenly spaced
    interior points (or an end and its neighbour when the argmin is an end point): 2 of the P + 1 gaps,
    whatever the values. Every bracket thus has width ``width * (2 / (P + 1)) ** s`` after s steps, the
    same for all rows, and the step at which all are below ``tol`` follows from the constants alone (a
    single point, P = 1, never narrows a bracket: ``max_steps``).
    """
    shrink = 2 / (num_points + 1)
    for step in range(1, max_steps + 1):
        width *= shrink
        if width < tol:
            return step
    return max_steps


def solve_dual(
    lq: Tensor,
    lo: Tensor,
    eps: float,
    *,
    num_points: int = 8,
    max_steps: int = 20,
    tol: float = 1e-5,
    eta_min: float = 1e-7,
    eta_max: float = 1e2,
    polish_steps: int = 0,
) -> DualSolution:
    """Batched n-ary bracketing for eta* over log eta in [log eta_min, log eta_max] (Listing 3).

    lq, lo: [N,D] log-probs of the new and old distributions (no grad needed). Each step evaluates
    ``num_points`` interior points of every bracket [l, u] and keeps the two neighbours of the
    argmin; stops when all (u - l) < tol (the corrected stop test; Listing 3's printed one is always true) or after
    ``max_steps``: every bracket shrinks by the same factor at each step, so that step is known before the
    search (``bracket_steps``) and the loop never reads the device. Returns eta* = exp((l + u) / 2).

    ``polish_steps`` > 0 adds safeguarded Newton steps on the stationarity condition
    KL(q_eta || old) = eps inside the final bracket (not in the paper; off by default). It gives
    eta* to machine precision, which finite-difference gradient checks need.
    """
    if eps <= 0:
        raise ValueError(f"troll eps must be > 0, got {eps!r}")
    if not 0 < eta_min < eta_max:
        raise ValueError(f"need 0 < eta_min < eta_max, got eta_min={eta_min!r}, eta_max={eta_max!r}")
    if num_points < 1 or max_steps < 1:
        raise ValueError(f"need num_points >= 1 and max_steps >= 1, got {num_points!r}, {max_steps!r}")
    lq = lq.detach().double()
    lo = lo.detach().double()
    n, dim = lq.shape
    lo_bound, hi_bound = math.log(eta_min), math.log(eta_max)
    lower = torch.full((n,), lo_bound, dtype=torch.float64, device=lq.device)
    upper = torch.full((n,), hi_bound, dtype=torch.float64, device=lq.device)
    frac = torch.arange(1, num_points + 1, dtype=torch.float64, device=lq.device) / (num_points + 1)
    rows = max(1, _DUAL_EVAL_BUDGET // max(1, num_points * dim))  # rows per dual evaluation
    starts = range(0, n, rows)
    base, diff = _dual_terms(lq, lo)
    steps = bracket_steps(num_points, max_steps, tol, hi_bound - lo_bound)  # known before the loop: no host read
    for _ in range(steps):
        x = lower.unsqueeze(-1) + (upper - lower).unsqueeze(-1) * frac  # [N,P]
        y = torch.cat([_dual_values(x[i : i + rows], base[i : i + rows], diff[i : i + rows], eps) for i in starts])
        best = y.argmin(dim=-1, keepdim=True)
        left = x.gather(-1, (best - 1).clamp(min=0)).squeeze(-1)
        right = x.gather(-1, (best + 1).clamp(max=num_points - 1)).squeeze(-1)
        best = best.squeeze(-1)
        lower = torch.where(best == 0, lower, left)
        upper = torch.where(best == num_points - 1, upper, right)
    log_eta = (lower + upper) / 2
    if polish_steps > 0:
        log_eta = _polish(lq, lo, eps, log_eta, lo_bound, hi_bound, polish_steps)
    converged = ((upper - lower) < tol) & (upper < hi_bound)
    return DualSolution(eta=log_eta.exp(), steps=steps, converged=converged)


def _polish(lq: Tensor, lo: Tensor, eps: float, log_eta: Tensor, lo_bound: float, hi_bound: float, n: int) -> Tensor:
    """Newton steps on KL(q_eta || old) - eps = 0 in log eta, clamped to the search interval.

    Not clamped to the final bracket: in floating point the bracket's argmin among nearly equal
    dual values is noise, so the last bracket need not contain eta*.
    """
    for _ in range(n):
        eta = log_eta.exp()
        kl, slope, _, _ = _kl_and_slope(lq, lo, eta)
        ok = slope < 0  # d KL / d log eta = eta * slope
        step = torch.where(ok, (kl - eps) / torch.where(ok, eta * slope, -torch.ones_like(slope)), torch.zeros_like(kl))
        log_eta = (log_eta - step).clamp(lo_bound, hi_bound)
    return log_eta


class ImplicitEta(torch.autograd.Function):
    """Identity on eta* in the forward; implicit gradient d eta*/d lq in the backward.

    TROLL (arXiv 2510.03817) appendix A.3 / Listing 2 ``DualSolver.backward``, in this module's notation:
    d eta*/d lq = -[q (c - <q,c>) / (eta+1)] / <c, dq/deta>. Zero for rows flagged ``active=False``
    (not converged, or degenerate with <c, dq/deta> = 0). ``lo`` is a constant (no gradient).
    Shapes: lq, lo [N,D]; eta, active [N].
    """

    @staticmethod
    def forward(ctx, lq: Tensor, lo: Tensor, eta: Tensor, active: Tensor) -> Tensor:
        ctx.save_for_backward(lq.detach(), lo.detach(), eta.detach(), active)
        return eta.detach().clone()

    @staticmethod
    def backward(ctx, grad_eta: Tensor):
        lq, lo, eta, active = ctx.saved_tensors
        _, slope, q, c = _kl_and_slope(lq, lo, eta)
        numerator = q * (c - (q * c).sum(-1, keepdim=True)) / (eta.unsqueeze(-1) + 1)
        ok = active & (slope < 0)
        scale = torch.where(ok, -grad_eta / torch.where(ok, slope, torch.ones_like(slope)), torch.zeros_like(slope))
        return numerator * scale.unsqueeze(-1), None, None, None


def project_with_info(
    new_logp: Tensor,
    old_logp: Tensor,
    eps: float,
    **solver_options,
) -> tuple[Tensor, ProjectionInfo]:
    """Project q_new onto {p : KL(p || q_old) <= eps} per row (TROLL, arXiv 2510.03817, eq. 3, 4, 13).

    new_logp [..., V] (differentiable), old_logp [..., V] (treated as a constant: it is detached).
    Returns projected log-probs [..., V] (dtype of ``new_logp``; rows inside the trust region are
    ``new_logp`` itself) and a ``ProjectionInfo`` over the flattened rows. ``solver_options`` go to
    ``solve_dual``.
    """
    if new_logp.shape != old_logp.shape:
        raise ValueError(f"new_logp {tuple(new_logp.shape)} and old_logp {tuple(old_logp.shape)} differ in shape")
    shape = new_logp.shape
    lq = new_logp.reshape(-1, shape[-1])
    lo = old_logp.detach().reshape(-1, shape[-1])
    n = lq.shape[0]
    with torch.no_grad():  # float64 in row chunks of at most 2^22 values
        step = max(1, (1 << 22) // max(1, shape[-1]))
        kl_before = torch.cat(
            [categorical_kl(lq[i : i + step].detach().double(), lo[i : i + step].double()) for i in range(0, n, step)]
            or [lq.new_zeros(0, dtype=torch.float64)]
        )
    projected = kl_before > eps
    eta_all = torch.zeros(n, dtype=torch.float64, device=lq.device)
    converged = torch.ones(n, dtype=torch.bool, device=lq.device)
    kl_after = kl_before.clone()
    rows = projected.nonzero().squeeze(-1)
    if rows.numel() == 0:
        return new_logp, ProjectionInfo(projected, eta_all, converged, 0, kl_before, kl_after)
    lq_p = lq.index_select(0, rows).double()
    lo_p = lo.index_select(0, rows).double()
    # rows whose supports are disjoint have no feasible projection: they fall back to the old
    # distribution; placeholder inputs keep them from producing NaN in the solver and backward
    feasible = ((lq_p > -math.inf) & (lo_p > -math.inf)).any(-1, keepdim=True)
    safe_lq = torch.where(feasible, lq_p, torch.zeros_like(lq_p))
    safe_lo = torch.where(feasible, lo_p, torch.zeros_like(lo_p))
    sol = solve_dual(safe_lq, safe_lo, eps, **solver_options)
    converged_p = sol.converged & feasible.squeeze(-1)
    eta = ImplicitEta.apply(safe_lq, safe_lo, sol.eta, converged_p)
    proj = torch.where(feasible, _primal(safe_lq, safe_lo, eta), lo_p)
    out = lq.index_copy(0, rows, proj.to(lq.dtype))
    eta_all = eta_all.index_copy(0, rows, sol.eta)
    converged = converged.index_copy(0, rows, converged_p)
    with torch.no_grad():
        kl_after = kl_after.index_copy(0, rows, categorical_kl(proj.detach(), lo_p))
    info = ProjectionInfo(projected, eta_all, converged, sol.steps, kl_before, kl_after)
    return out.reshape(shape), info


def project(new_logp: Tensor, old_logp: Tensor, eps: float, **solver_options) -> Tensor:
    """Projected log-probs [..., V]: the stable entry point (see ``project_with_info``).

    Dense, last dim = vocabulary, any leading shape; differentiable in ``new_logp`` with the
    implicit gradient through eta* (TROLL, arXiv 2510.03817, appendix A.3). Tokens with
    KL(q_new || q_old) <= eps are returned unchanged.
    """
    return project_with_info(new_logp, old_logp, eps, **solver_options)[0]
