"""TRM error bounds on |J(theta) - J(roll) - L(theta)| (TRM, arXiv 2512.23075, section 4, appendices C-D).

Design: pure math/numpy, no torch, so ``analysis`` (bound plots, tables) imports it without pulling
in the trainer. Every function broadcasts over ``T`` and ``delta`` (numpy arrays in, arrays out;
Python scalars in, floats out). The sums over positions use the exact sum for short horizons and
the Euler-Maclaurin expansion of ``sum_k sqrt(k)`` beyond (error < 1e-12 relative), so a curve
over T = 1..1e6 costs O(len(T)), not O(T^2).

Formulas (TRM, arXiv 2512.23075, sections 4-5; T = sequence length, delta = max token KL,
D_seq = sequence KL, rewards in [0, 1]; ``c(x) = min(1, sqrt(x / 2))``):

- classical (TRPO, eq. 27): ``T (T - 1) delta``
- linear: ``4 T c(delta)``
- pinsker_marginal (eq. 28): ``4 c(delta) sum_{t=1..T} min(1, sqrt((t - 1) delta / 2))``
- mixed (eq. 35): ``4 T c(delta) c(D_seq)``
- adaptive (eq. 40): ``4 sum_{t=1..T} Dbar_t min(1, sqrt((T - t) delta / 2))``
- best: the unified bound, min of the available pinsker_marginal, mixed, adaptive (eq. 42)

``cap=False`` drops the ``min(1, .)`` caps of linear, pinsker_marginal and mixed (the paper's
"no cap" column, e.g. PM = 3.49e5 instead of 11582 at T = 4096, delta = 1). The classical bound is
always uncapped and the adaptive bound always capped, as in the paper's table.

Run the checks against the paper's numbers with ``pytest tests/algorithms/test_bounds.py``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from runners.metric_names import trm_tv_position_bucket

# zeta(-1/2), the constant term of sum_{k=1..N} sqrt(k) (Euler-Maclaurin)
_ZETA_MINUS_HALF = -0.20788622497735456601
# below this N the sum of square roots is computed exactly
_EXACT_SUM_MAX = 256
_SQRT_PREFIX = np.concatenate([[0.0], np.cumsum(np.sqrt(np.arange(1, _EXACT_SUM_MAX + 1, dtype=np.float64)))])

BOUND_KEYS = ("classical", "linear", "pinsker_marginal", "mixed", "adaptive", "best")


def _out(x: np.ndarray) -> Any:
    """Return a Python float for 0-d results, the array otherwise."""
    return float(x) if np.ndim(x) == 0 else x


def _as_length(T: Any, name: str = "T") -> np.ndarray:
    arr = np.asarray(T)
    if arr.dtype.kind not in "iuf" or np.any(~np.isfinite(arr)) or np.any(arr < 0) or np.any(arr != np.floor(arr)):
        raise ValueError(f"{name} must be a non-negative integer (or an array of them), got {T!r}")
    return arr.astype(np.int64)


def _as_divergence(x: Any, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if np.any(~np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{name} must be a finite non-negative divergence, got {x!r}")
    return arr


def _sum_sqrt(n: np.ndarray) -> np.ndarray:
    """``sum_{k=1..n} sqrt(k)`` for integer n >= 0 (exact below 256, Euler-Maclaurin above)."""
    n = np.asarray(n, dtype=np.int64)
    small = np.minimum(n, _EXACT_SUM_MAX)
    exact = _SQRT_PREFIX[small]
    x = np.maximum(n, 1).astype(np.float64)
    asym = (2.0 / 3.0) * x**1.5 + 0.5 * np.sqrt(x) + _ZETA_MINUS_HALF + x**-0.5 / 24.0 - x**-2.5 / 1920.0
    return np.where(n <= _EXACT_SUM_MAX, exact, asym)


def _sum_min1_sqrt(n: np.ndarray, a: np.ndarray, cap: bool = True) -> np.ndarray:
    """``sum_{k=0..n-1} min(1, sqrt(k a))`` (``sqrt(k a)`` when ``cap`` is False), broadcast."""
    n, a = np.broadcast_arrays(np.asarray(n, dtype=np.int64), np.asarray(a, dtype=np.float64))
    if not cap:
        return np.sqrt(a) * _sum_sqrt(np.maximum(n - 1, 0))
    with np.errstate(divide="ignore", over="ignore"):  # 1/a is inf for subnormal a: k_max = inf is right
        k_max = np.where(a > 0, np.floor(1.0 / np.where(a > 0, a, 1.0)), np.inf)  # sqrt(k a) <= 1 iff k <= 1/a
    m = np.minimum(n, k_max + 1).astype(np.int64)  # number of terms on the sqrt branch
    return np.sqrt(a) * _sum_sqrt(np.maximum(m - 1, 0)) + (n - m)


def _pinsker_tv(x: np.ndarray, cap: bool = True) -> np.ndarray:
    """``min(1, sqrt(x / 2))``: Pinsker's bound on a TV distance from a KL (TRM, arXiv 2512.23075, eq. 17)."""
    tv = np.sqrt(x / 2.0)
    return np.minimum(1.0, tv) if cap else tv


def ln_trm_normaliser(T: Any, delta: Any) -> Any:
    """LN-TRM normaliser ``Z(T) = sum_{t=1..T} min(1, sqrt((T - t) delta / 2))`` (TRM, arXiv 2512.23075, eq. 77).

    Z(1) = 0 (a length-1 sequence has no future to perturb). Check values at delta = 1e-4:
    Z(256) = 19.25, Z(1024) = 154.36, Z(4096) = 1235.5.
    """
    return _out(_sum_min1_sqrt(_as_length(T), _as_divergence(delta, "delta") / 2.0))


def trm_max_acceptance(p: Any, T: Any) -> Any:
    """Acceptance probability ``(1 - p)^T`` of TRM-Max with i.i.d. per-token violation probability p
    (TRM, arXiv 2512.23075, eq. 75, table D.1)."""
    p_arr = np.asarray(p, dtype=np.float64)
    if np.any(~((p_arr >= 0) & (p_arr <= 1))):
        raise ValueError(f"p must be a probability in [0, 1], got {p!r}")
    return _out(np.power(1.0 - p_arr, _as_length(T)))


def adaptive_worst_case(T: Any, delta: Any) -> Any:
    """Adaptive bound with every ``Dbar_t`` at its cap ``min(1, sqrt(delta / 2))`` (TRM, arXiv 2512.23075, eq. 72).

    Equals the capped Pinsker-Marginal bound (remark 4.7); ~1139 at T = 4096, delta = 0.01.
    """
    d = _as_divergence(delta, "delta")
    return _out(4.0 * _pinsker_tv(d) * _sum_min1_sqrt(_as_length(T), d / 2.0))


def adaptive_bound(dbar: Sequence[float] | np.ndarray, delta: float) -> float:
    """Adaptive bound ``4 sum_{t=1..T} Dbar_t min(1, sqrt((T - t) delta / 2))`` (TRM, arXiv 2512.23075, eq. 40).

    ``dbar``: [T] expected token TV distance at positions t = 1..T under the rollout distribution
    (``dbar[0]`` is position 1). Must be finite and in [0, 1].
    """
    d = np.asarray(dbar, dtype=np.float64)
    if d.ndim != 1 or np.any(~np.isfinite(d)) or np.any(d < 0) or np.any(d > 1):
        raise ValueError(f"dbar must be a 1-D sequence of TV distances in [0, 1], got shape {d.shape}")
    delta_arr = _as_divergence(delta, "delta")
    if delta_arr.ndim != 0:
        raise ValueError(f"delta must be a scalar when dbar is given, got shape {delta_arr.shape}")
    T = d.shape[0]
    future = np.minimum(1.0, np.sqrt((T - np.arange(1, T + 1)) * float(delta_arr) / 2.0))
    return float(4.0 * np.dot(d, future))


def error_bounds(
    T: Any,
    delta: Any,
    d_seq: Any = None,
    dbar: Sequence[float] | np.ndarray | None = None,
    *,
    cap: bool = True,
) -> dict[str, Any]:
    """All TRM error bounds for sequence length ``T`` and max token KL ``delta`` (TRM, arXiv 2512.23075, eq. 42-45).

    Returns a dict with every key of ``BOUND_KEYS``. ``mixed`` is NaN unless ``d_seq`` (sequence-level
    KL) is given; ``adaptive`` is NaN unless ``dbar`` ([T] expected token TV per position) is given;
    ``best`` is the minimum of the available pinsker_marginal, mixed and adaptive (NaN-aware), the
    paper's unified bound. Keys are always present so results stack into a tidy frame.

    ``T``, ``delta`` and ``d_seq`` broadcast (arrays in, arrays out); with ``dbar``, ``T`` and
    ``delta`` must be scalars and ``len(dbar) == T``. ``cap=False`` gives the uncapped forms.
    Paper's check (T = 4096, delta = 1e-4, D_seq = 0.01): classical 1677, linear 115.9,
    pinsker_marginal 35.0, mixed 8.2.
    """
    T_arr = _as_length(T)
    delta_arr = _as_divergence(delta, "delta")
    T_b, delta_b = np.broadcast_arrays(T_arr, delta_arr)
    Tf = T_b.astype(np.float64)
    c_delta = _pinsker_tv(delta_b, cap)
    nan = np.full(np.shape(Tf), np.nan)
    out = {
        "classical": Tf * (Tf - 1.0) * delta_b,
        "linear": 4.0 * Tf * c_delta,
        "pinsker_marginal": 4.0 * c_delta * _sum_min1_sqrt(T_b, delta_b / 2.0, cap),
        "mixed": nan,
        "adaptive": nan,
    }
    if d_seq is not None:
        out["mixed"] = 4.0 * Tf * c_delta * _pinsker_tv(_as_divergence(d_seq, "d_seq"), cap)
    if dbar is not None:
        if T_arr.ndim != 0:
            raise ValueError(f"T must be a scalar when dbar is given, got shape {T_arr.shape}")
        if len(dbar) != int(T_arr):
            raise ValueError(f"dbar must have length T = {int(T_arr)}, got {len(dbar)}")
        out["adaptive"] = np.asarray(adaptive_bound(dbar, delta))
    stacked = np.stack(np.broadcast_arrays(out["pinsker_marginal"], out["mixed"], out["adaptive"]))
    out["best"] = np.nanmin(stacked, axis=0)  # pinsker_marginal is always finite
    return {k: _out(np.asarray(out[k], dtype=np.float64)) for k in BOUND_KEYS}


# the metric-name pattern, derived from the schema (sentinel numbers replaced by groups)
_TV_BUCKET = re.compile(
    "^"
    + re.escape(trm_tv_position_bucket(314159, 271828)).replace("314159", r"(\d+)").replace("271828", r"(\d+)")
    + "$"
)


def dbar_from_position_buckets(buckets: Mapping[tuple[int, int], float] | Mapping[str, float], T: int) -> np.ndarray:
    """Piecewise-constant ``Dbar`` [T] from per-bucket mean TV (the ``trm/tv/pos_{lo}_{hi}`` metrics).

    ``buckets`` maps ``(lo, hi)`` (0-based response positions, lo <= k < hi) or the metric names of
    ``runners.metric_names.trm_tv_position_bucket`` to the bucket's mean; other keys are ignored. Position
    k (0-based) is the bound's t = k + 1. Raises when the buckets do not cover positions 0..T-1.
    """
    T = int(_as_length(T))
    dbar = np.full(T, np.nan)
    for key, value in buckets.items():
        if isinstance(key, str):
            match = _TV_BUCKET.match(key)
            if match is None:
                continue
            lo, hi = int(match.group(1)), int(match.group(2))
        else:
            lo, hi = int(key[0]), int(key[1])
        if not (0 <= lo < hi):
            raise ValueError(f"position bucket must satisfy 0 <= lo < hi, got ({lo}, {hi})")
        dbar[lo : min(hi, T)] = float(value)
    missing = np.flatnonzero(np.isnan(dbar))
    if missing.size:
        raise ValueError(f"position buckets do not cover positions {missing[0]}..{missing[-1]} of T = {T}")
    return dbar


__all__ = [
    "BOUND_KEYS",
    "adaptive_bound",
    "adaptive_worst_case",
    "dbar_from_position_buckets",
    "error_bounds",
    "ln_trm_normaliser",
    "trm_max_acceptance",
]
