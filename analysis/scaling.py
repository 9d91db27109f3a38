"""Reward-vs-compute sigmoid fits per run, as in ScaleRL (arXiv 2510.13786, section 2):

    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)

A is the asymptotic reward, B the scaling exponent (efficiency: how fast the gain arrives), C_mid
the compute at which half of the gain A - R0 is reached, R0 the reward before training (fixed to the
reward at the smallest compute of the run, C = 0 for the evaluation before any update). A method
with a higher A ends higher; one with a higher B (or lower C_mid) gets there with less compute.

How: R is linear in A for fixed (B, C_mid), so a grid over (B, log C_mid) with A solved by least
squares gives a start that cannot miss the basin; scipy's bounded least squares then refines
(A, B, log C_mid). A fit is refused, with the reason, when a run has fewer than ``MIN_POINTS`` points
of positive compute, when the optimiser fails, or when the curve shows no gain (A ~ R0: B and
C_mid undetermined); a fitted C_mid beyond the observed compute is kept but flagged (A is then an
extrapolation).

    from analysis.scaling import fit_sigmoid, sigmoid_reward
    fit = fit_sigmoid(compute, reward)      # SigmoidFit(ok, A, B, C_mid, R0, rmse, n_points, reason, note)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_POINTS = 6
B_RANGE = (0.05, 20.0)


def sigmoid_reward(C: np.ndarray | float, R0: float, A: float, B: float, C_mid: float) -> np.ndarray:
    """``R0 + (A - R0) / (1 + (C_mid / C)^B)``; equals R0 at C = 0 (B > 0)."""
    C = np.asarray(C, dtype=float)
    with np.errstate(divide="ignore", over="ignore"):
        ratio = np.where(C > 0, (C_mid / np.where(C > 0, C, 1.0)) ** B, np.inf)
    return R0 + (A - R0) / (1.0 + ratio)


@dataclass(frozen=True)
class SigmoidFit:
    ok: bool
    A: float = float("nan")
    B: float = float("nan")
    C_mid: float = float("nan")
    R0: float = float("nan")
    rmse: float = float("nan")
    n_points: int = 0
    reason: str = ""  # why no fit (ok False)
    note: str = ""  # caveat of an accepted fit (e.g. C_mid beyond the observed compute)


def _solve_a(g: np.ndarray, y: np.ndarray) -> float:
    """Least-squares gain (A - R0) of y ~ gain * g."""
    gg = float(g @ g)
    return float(g @ y / gg) if gg > 0 else 0.0


def fit_sigmoid(
    compute: np.ndarray,
    reward: np.ndarray,
    r0: float | None = None,
    a_bounds: tuple[float, float] = (-np.inf, np.inf),
    min_points: int = MIN_POINTS,
) -> SigmoidFit:
    """Fit A, B, C_mid of ``sigmoid_reward`` to (compute, reward) points with R0 fixed.

    compute, reward: [N]; NaNs are dropped. ``r0`` defaults to the reward at the smallest compute.
    ``a_bounds`` bounds the asymptote (e.g. (0, 1) for success rates).
    """
    from scipy.optimize import least_squares

    C = np.asarray(compute, dtype=float)
    R = np.asarray(reward, dtype=float)
    keep = np.isfinite(C) & np.isfinite(R) & (C >= 0)
    C, R = C[keep], R[keep]
    if not len(C):
        return SigmoidFit(False, reason="no points")
    order = np.argsort(C, kind="stable")
    C, R = C[order], R[order]
    R0 = float(R[0]) if r0 is None else float(r0)
    pos = C > 0
    Cp, y = C[pos], R[pos] - R0
    if len(Cp) < min_points:
        return SigmoidFit(
            False, R0=R0, n_points=len(Cp), reason=f"{len(Cp)} points of positive compute (< {min_points})"
        )
    lo_c, hi_c = float(np.log(Cp.min())) - np.log(100.0), float(np.log(Cp.max())) + np.log(100.0)
    best = (np.inf, 0.0, 1.0, 0.0)
    for B in (0.25, 0.5, 1.0, 2.0, 4.0, 8.0):
        for log_mid in np.linspace(lo_c + np.log(10.0), hi_c - np.log(10.0), 25):
            g = 1.0 / (1.0 + np.exp(B * (log_mid - np.log(Cp))))
            gain = float(np.clip(_solve_a(g, y) + R0, *a_bounds)) - R0
            sse = float(np.sum((y - gain * g) ** 2))
            if sse < best[0]:
                best = (sse, gain + R0, B, log_mid)

    def residual(theta: np.ndarray) -> np.ndarray:
        A, B, log_mid = theta
        return sigmoid_reward(Cp, R0, A, B, float(np.exp(log_mid))) - R0 - y

    a_lo, a_hi = a_bounds
    x0 = np.array([np.clip(best[1], a_lo, a_hi), best[2], best[3]])
    try:
        sol = least_squares(
            residual, x0, bounds=([a_lo, B_RANGE[0], lo_c], [a_hi, B_RANGE[1], hi_c]), x_scale="jac", max_nfev=2000
        )
    except (ValueError, np.linalg.LinAlgError) as exc:
        return SigmoidFit(False, R0=R0, n_points=len(Cp), reason=f"fit failed: {exc}")
    if not sol.success:
        return SigmoidFit(False, R0=R0, n_points=len(Cp), reason=f"fit did not converge: {sol.message}")
    A, B, log_mid = (float(v) for v in sol.x)
    rmse = float(np.sqrt(np.mean(sol.fun**2)))
    spread = float(np.std(R[pos]))
    if abs(A - R0) <= max(2.0 * rmse, 1e-12) or spread == 0.0:
        return SigmoidFit(
            False, A, B, float(np.exp(log_mid)), R0, rmse, len(Cp), reason="no gain over R0: B and C_mid undetermined"
        )
    C_mid = float(np.exp(log_mid))
    note = ""
    if C_mid > Cp.max():
        note = "C_mid beyond the observed compute: A is an extrapolation"
    elif B in B_RANGE or np.isclose(log_mid, lo_c) or np.isclose(log_mid, hi_c):
        note = "a parameter sits on its bound"
    return SigmoidFit(True, A, B, C_mid, R0, rmse, len(Cp), note=note)
