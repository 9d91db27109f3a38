"""Reward-vs-compute fits per method (ScaleRL, arXiv 2510.13786 section 2): asymptote A and efficiency B.

Each run's reward curve is fitted on its own (``analysis.scaling.fit_sigmoid``); the table gives the
mean and 95% t interval over seeds of A and B, the median C_mid, and for runs that could not be
fitted, why. Compute is the cumulative wall time of the training steps (``timing_s/step``, ScaleRL's
GPU-hours at our scale) when logged, else cumulative tokens (``perf/total_num_tokens``), else steps.
Reward is the in-domain evaluation (every evaluation, the one before training at compute 0 gives R0)
when a run has enough evaluations, else the training success ``critic/score/mean``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.aggregate import run_series
from analysis.arms import arm_table, run_labels
from analysis.frames import ExperimentData
from analysis.names import eval_metrics
from analysis.scaling import MIN_POINTS, SigmoidFit, fit_sigmoid
from analysis.skip import SkipItem
from analysis.stats import t_interval
from analysis.tables.base import MISSING, Table
from runners import metric_names

COMPUTE_AXES = {
    "time": (metric_names.TIMING_STEP, "cumulative wall time of the training steps (s)"),
    "cpu_time": (metric_names.TIMING_CPU_STEP, "cumulative CPU time of the training steps (s)"),
    "tokens": (metric_names.TOTAL_NUM_TOKENS, "cumulative tokens processed"),
    "steps": (None, "training steps"),
}


def cumulative_compute(data: ExperimentData, compute: str) -> dict[str, pd.Series]:
    """{run_id: compute spent by the end of each step (index step; step 0 -> 0)}."""
    metric, _ = COMPUTE_AXES[compute]
    if metric is None:
        return {}
    return {rid: s.sort_index().cumsum() for rid, s in run_series(data, metric).items()}


def compute_at(cum: pd.Series | None, steps: np.ndarray) -> np.ndarray:
    """Compute spent by the end of each of ``steps`` (0 at step 0; the step count itself without ``cum``)."""
    steps = np.asarray(steps)
    if cum is None:
        return steps.astype(float)
    idx = cum.index.to_numpy()
    pos = np.searchsorted(idx, steps, side="right") - 1
    vals = np.where(pos >= 0, cum.to_numpy()[np.clip(pos, 0, None)], 0.0)
    return np.where(steps <= 0, 0.0, vals)


def pick_axes(names: list[str], reward: str | None, compute: str | None) -> tuple[str, str]:
    if compute is None:
        compute = next((k for k in ("time", "tokens") if COMPUTE_AXES[k][0] in names), "steps")
    if compute not in COMPUTE_AXES:
        raise ValueError(f"compute must be one of {sorted(COMPUTE_AXES)}, got {compute!r}")
    if reward is None:
        evals = list(eval_metrics(names).values())
        reward = evals[0] if evals else metric_names.SCORE_MEAN
    return reward, compute


def fit_runs(data: ExperimentData, reward: str, compute: str) -> pd.DataFrame:
    """One row per run: run_id, arm, seed, the SigmoidFit fields."""
    labels = run_labels(data)
    rewards = run_series(data, reward)
    cums = cumulative_compute(data, compute)
    rows = []
    for rid, arm, seed in zip(labels["run_id"], labels["arm"], labels[metric_names.TAG_SEED]):
        s = rewards.get(str(rid))
        if s is None:
            continue
        s = s.dropna().sort_index()
        C = compute_at(cums.get(str(rid)) if compute != "steps" else None, s.index.to_numpy())
        if compute != "steps" and str(rid) not in cums:
            fit = SigmoidFit(False, reason=f"no {COMPUTE_AXES[compute][0]} logged")
        else:
            fit = fit_sigmoid(
                C,
                s.to_numpy(),
                a_bounds=(0.0, 1.0) if reward.startswith(("val-core/", "critic/score")) else (-np.inf, np.inf),
            )
        rows.append({"run_id": str(rid), "arm": arm, "seed": int(seed), **fit.__dict__})
    return pd.DataFrame(rows)


def scaling_table(data: ExperimentData, reward: str | None = None, compute: str | None = None) -> Table:
    names = data.metric_names()
    reward, compute = pick_axes(names, reward, compute)
    if reward not in names:
        raise SkipItem(f"no run logs {reward}")
    fits = fit_runs(data, reward, compute)
    if not len(fits):
        raise SkipItem(f"no run logs {reward}")
    if not fits["ok"].any():  # an all-empty table says nothing: one line with why
        reasons = fits["reason"].value_counts()
        why = "; ".join(f"{n} run(s): {reason}" for reason, n in reasons.items())
        raise SkipItem(f"no run's {reward} against {COMPUTE_AXES[compute][1]} could be fitted ({why})")
    cols = ["runs fitted", "A (asymptote) [95% CI]", "B (efficiency) [95% CI]", "C_mid (median)", "R0 (mean)"]
    order = [a for a in arm_table(data).index if a in set(fits["arm"])]
    index = pd.Index(order, name="Method")
    values = pd.DataFrame(np.nan, index=index, columns=pd.Index(cols), dtype=object)
    display = pd.DataFrame(MISSING, index=index, columns=values.columns)
    notes = []
    for arm in order:
        g = fits[fits["arm"] == arm]
        ok = g[g["ok"]]
        a, b = t_interval(ok["A"]), t_interval(ok["B"])
        c_mid = float(ok["C_mid"].median()) if len(ok) else np.nan
        r0 = float(g["R0"].mean()) if g["R0"].notna().any() else np.nan
        values.loc[arm] = [len(ok), a.mean, b.mean, c_mid, r0]
        display.loc[arm] = [f"{len(ok)} / {len(g)}", a.text(3), b.text(2), f"{c_mid:.4g}" if len(ok) else MISSING,
                            f"{r0:.3f}" if np.isfinite(r0) else MISSING]  # fmt: skip
        for reason in sorted(set(g.loc[~g["ok"], "reason"])):
            seeds = ", ".join(str(s) for s in sorted(g.loc[(~g["ok"]) & (g["reason"] == reason), "seed"]))
            notes.append(f"{arm}: not fitted (seeds {seeds}): {reason}")
        for note in sorted(set(ok["note"]) - {""}):
            notes.append(f"{arm}: {note}")
    return Table(
        key="scaling_fit",
        title="Reward-vs-compute sigmoid fit per method",
        caption=(
            "Fit of R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B) (ScaleRL, arXiv 2510.13786 section 2) to each run's "
            f"{reward} against {COMPUTE_AXES[compute][1]}; R0 fixed to the reward at the smallest compute. A: asymptotic "
            "reward; B: scaling exponent (higher = the gain arrives with less compute); C_mid: compute at half the gain. "
            f"Mean [95% t interval] over the seeds whose fit succeeded (a fit needs {MIN_POINTS} points of positive "
            "compute and a visible gain)."
        ),
        values=values,
        display=display,
        notes=notes,
    )
