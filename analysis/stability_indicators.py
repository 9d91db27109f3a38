"""The stability indicators of the stability map (``analysis.stability``): each a function of one run's
logged series that answers True (the run became unstable that way), False, or None (cannot be evaluated:
too few points, not logged, caps unknown), with the thresholds the captions print.

- entropy collapse (arXiv 2603.11682, section 1 and Figure 1): the last quarter's mean entropy below half
  its first value;
- reward collapse: the training reward's last-quarter mean below half its best quarter-run mean;
- training-inference gap blow-up (arXiv 2512.23075, section 5): the sampler's per-token KL from the trained
  policy grown tenfold and above 0.01 nats per token;
- controller pinned at a cap: ADAPO's eps_high or REPO-R's |zeta| (arXiv 2603.11682) at one of its caps over
  the whole last quarter (also flagged by the entropy-preserving claims, ``analysis.claim_checks``).

``analysis.stability.run_indicators`` applies them to every run of a sweep and ``stability`` counts them per arm.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from runners import metric_names

WINDOW_FRACTION = 0.25  # "first"/"last"/"best" windows: a quarter of the run's logged points
ENTROPY_COLLAPSE_FRACTION = 0.5
REWARD_COLLAPSE_FRACTION = 0.5
REWARD_FLOOR = 0.1
GAP_FACTOR = 10.0
GAP_FLOOR = 0.01  # nats per token
PIN_RTOL = 1e-6
MIN_POINTS = 4  # fewer logged points: a quarter of the run is not a window, the indicator is n/a


def _window(n: int) -> int:
    return max(1, int(np.floor(WINDOW_FRACTION * n)))


def _clean(series: pd.Series | None) -> pd.Series | None:
    if series is None:
        return None
    s = series.dropna().sort_index()
    return s if len(s) >= MIN_POINTS else None


def entropy_collapse(entropy: pd.Series | None) -> bool | None:
    """Entropy collapse: the mean of the last quarter of ``actor/entropy`` is below ENTROPY_COLLAPSE_FRACTION (0.5)
    of its first logged value. Entropy-preserving RL (arXiv 2603.11682, section 1 and Figure 1) names this
    failure of GRPO: training narrows the policy around already likely solutions, and runs that collapse their
    entropy early end worse; halving the entropy within one run is far outside step noise (a few percent).
    n/a: not logged or fewer than MIN_POINTS points."""
    s = _clean(entropy)
    if s is None or not s.iloc[0] > 0:
        return None
    return bool(s.iloc[-_window(len(s)) :].mean() < ENTROPY_COLLAPSE_FRACTION * s.iloc[0])


def reward_collapse(score: pd.Series | None) -> bool | None:
    """Reward collapse: the training reward's (``critic/score/mean``) last-window mean is below
    REWARD_COLLAPSE_FRACTION (0.5) of its best window mean (windows: a quarter of the run, sliding), counted
    only when that best is above REWARD_FLOOR (0.1 success): a run that never learned cannot collapse, and a
    window mean of 0.1 over a quarter of the 40-step CPU run rests on ~130 successes, so halving it is not
    sampling noise. n/a: not logged or fewer than MIN_POINTS points."""
    s = _clean(score)
    if s is None:
        return None
    w = _window(len(s))
    best = float(s.rolling(w).mean().max())
    if not best > REWARD_FLOOR:
        return False
    return bool(s.iloc[-w:].mean() < REWARD_COLLAPSE_FRACTION * best)


def gap_blowup(kl: pd.Series | None) -> bool | None:
    """Training-inference gap blow-up: the last-window mean of ``rollout_corr/kl`` (per-token KL of the sampler
    from the trained policy) is above GAP_FACTOR (10) times its first-window mean (windows: a quarter of the
    run) and above GAP_FLOOR (0.01 nats per token: summed over a 100-token response, a sequence log-ratio of
    about 1, importance weights off by a factor of e; TRM (arXiv 2512.23075, section 5) bounds the error of the
    surrogate by such sequence-level divergence and ties training collapse to it). The factor asks for an
    order-of-magnitude growth, not drift; a negative first window counts as 0. n/a: not logged (sampler and
    trainer the same)."""
    s = _clean(kl)
    if s is None:
        return None
    w = _window(len(s))
    first, last = float(s.iloc[:w].mean()), float(s.iloc[-w:].mean())
    return bool(last > GAP_FACTOR * max(first, 0.0) and last > GAP_FLOOR)


def controller_pinned(values: pd.Series | None, lo: float | None, hi: float | None) -> bool | None:
    """Controller pinned at a cap: every logged value of the controller over the last quarter of the run
    equals (relative tolerance PIN_RTOL) its min cap, or every one its max cap: the controller no longer
    steers entropy. Magnitudes are compared (REPO-R's zeta changes sign, arXiv 2603.11682 appendix D.2).
    n/a: not logged or caps unknown."""
    s = _clean(values)
    if s is None or lo is None or hi is None or not (np.isfinite(lo) and np.isfinite(hi)):
        return None
    tail = np.abs(s.iloc[-_window(len(s)) :].to_numpy(dtype=float))
    return bool(any(np.allclose(tail, cap, rtol=PIN_RTOL, atol=0.0) for cap in (abs(lo), abs(hi))))


@dataclass(frozen=True)
class Indicator:
    key: str
    letter: str  # the mark in the stability figure
    name: str
    rule: str  # for captions


INDICATORS = (
    Indicator("entropy", "E", "entropy collapse",
              f"mean of the last quarter of {metric_names.ENTROPY} < {ENTROPY_COLLAPSE_FRACTION:g} x its first value"),
    Indicator("reward", "R", "reward collapse",
              f"last-quarter mean of {metric_names.SCORE_MEAN} < {REWARD_COLLAPSE_FRACTION:g} x its best sliding "
              f"quarter-run mean, when that best > {REWARD_FLOOR:g}"),
    Indicator("gap", "G", "training-inference gap blow-up",
              f"last-quarter mean of {metric_names.ROLLOUT_CORR_KL} > {GAP_FACTOR:g} x its first-quarter mean and > {GAP_FLOOR:g} "
              "nats/token; n/a when not logged"),
    Indicator("pinned", "P", "controller pinned at a cap",
              f"ADAPO's {metric_names.ENTROPY_EPS_HIGH} (caps entropy_control.eps_high_min/max) or REPO-R's "
              f"|{metric_names.ENTROPY_ZETA}| (caps entropy_control.zeta_min/max) at one cap over the whole last "
              "quarter; n/a for other methods"),
)  # fmt: skip
CONTROLLERS = {  # entropy_control tag -> (metric, min-cap param, max-cap param)
    "adapo": (metric_names.ENTROPY_EPS_HIGH, "entropy_control.eps_high_min", "entropy_control.eps_high_max"),
    "repo_r": (metric_names.ENTROPY_ZETA, "entropy_control.zeta_min", "entropy_control.zeta_max"),
}
