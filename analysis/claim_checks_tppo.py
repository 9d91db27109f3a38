"""T-PPO's claim (arXiv 2506.15050), checked against PPO (``analysis.claim_checks``).

tppo_time (section 4.2, Figure 1): T-PPO matches PPO's final reward with 60% less wall-clock time, a ratio
of times to PPO's final reward of at most 0.4 (CPU time shown beside it, not counted), with the seconds
per step of each phase in the note.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from analysis.aggregate import effective_window, run_series, smooth
from analysis.arms import arm_table, counterpart, run_labels, select_arms
from analysis.claim_checks_common import is_troll
from analysis.claim_rules import CheckResult, Rule, not_checked
from analysis.frames import ExperimentData
from analysis.names import eval_metrics, find_eval
from analysis.skip import SkipItem
from analysis.tables.scaling import compute_at
from analysis.timing import cumulative_time, phase_times
from runners import metric_names


def time_to_reach(series: pd.Series, target: float, cum: pd.Series | None, window: int) -> tuple[float, bool]:
    """(seconds spent by the first step whose smoothed value reaches ``target``, reached?); the total
    time of the run (a lower bound) when it never does."""
    s = series.dropna().sort_index()
    smoothed = smooth(s.to_numpy(), effective_window(window, len(s)))
    hit = np.flatnonzero(smoothed >= target - 1e-12)
    step = s.index[hit[0]] if len(hit) else s.index[-1]
    return float(compute_at(cum, np.array([step]))[0]), bool(len(hit))


def _reward_metric(names: list[str], wanted: str | None) -> tuple[str, int]:
    """(reward metric, smoothing window): AIME24 or the first evaluation (unsmoothed), else training success (7)."""
    if wanted:
        return wanted, (7 if wanted == metric_names.SCORE_MEAN else 1)
    metric = find_eval(names, "aime24") or next(iter(eval_metrics(names).values()), None)
    return (metric, 1) if metric else (metric_names.SCORE_MEAN, 7)


def _time_ratios(data, arm, base, reward, window, last_n, clock) -> tuple[dict[int, float], list[int]]:
    labels = run_labels(data)
    rewards, cum = run_series(data, reward), cumulative_time(data, clock)
    runs = {(a, int(s)): str(r) for r, a, s in zip(labels["run_id"], labels["arm"], labels[metric_names.TAG_SEED])}
    ratios, censored = {}, []
    for seed in sorted({s for a, s in runs if a == arm} & {s for a, s in runs if a == base}):
        r_new, r_base = runs[(arm, seed)], runs[(base, seed)]
        if r_new not in rewards or r_base not in rewards or r_new not in cum or r_base not in cum:
            continue
        s_base = rewards[r_base].dropna().sort_index()
        target = float(smooth(s_base.to_numpy(), effective_window(window, len(s_base)))[-last_n:].mean())
        t_base, _ = time_to_reach(s_base, target, cum[r_base], window)
        t_new, reached = time_to_reach(rewards[r_new], target, cum[r_new], window)
        if t_base > 0:
            ratios[seed] = t_new / t_base
            if not reached:
                censored.append(seed)
    return ratios, censored


def _breakdown(data: ExperimentData, arms: list[str]) -> str:
    try:
        times = phase_times(data)
    except SkipItem:
        return ""
    parts = []
    for arm in arms:
        if arm not in times.index:
            continue
        row = times.loc[arm]
        cells = []
        for phase in dict.fromkeys(times.columns.get_level_values("phase")):
            cpu = f" / CPU {row[(phase, 'cpu')]:.2f}" if (phase, "cpu") in row.index else ""
            cells.append(f"{phase} {row[(phase, 'wall')]:.2f}{cpu}")
        parts.append(f"{arm}: " + ", ".join(cells))
    return "seconds per step (wall / CPU): " + "; ".join(parts) if parts else ""


def tppo_time(data: ExperimentData, opts: Mapping) -> list[CheckResult]:
    part = f"T-PPO reaches PPO's final reward in at most {opts['goal']:g} of PPO's time"
    arms, names = arm_table(data), data.metric_names()
    tppos = select_arms(arms, algorithm="tppo")
    if not tppos:
        return [
            not_checked(
                part, "not run in this sweep: sweeps/tppo_table1.yaml (GPU) and sweeps/tppo_table1_cpu.yaml run it"
            )
        ]
    if metric_names.TIMING_STEP not in names:
        return [not_checked(part, f"no run logs {metric_names.TIMING_STEP}")]
    reward, window = _reward_metric(names, opts.get("reward"))
    ppos = select_arms(arms, algorithm="ppo", objective=lambda o: not is_troll(o))
    checks = []
    for arm in tppos:
        ppo = counterpart(arms, arm, ppos, ())
        if ppo is None:
            checks.append(not_checked(part, "no PPO run in this sweep", arm))
            continue
        first = len(checks)
        clocks = [(metric_names.TIMING_STEP, "wall", True)]
        if metric_names.TIMING_CPU_STEP in names:
            clocks.append((metric_names.TIMING_CPU_STEP, "CPU", False))
        for clock, word, counts in clocks:
            ratios, censored = _time_ratios(data, arm, ppo, reward, window, int(opts["last_n"]), clock)
            note = f"target: PPO's final {reward} (mean of its last {opts['last_n']} smoothed points, window {window})"
            if censored:
                note += f"; seeds {censored} never reached it: their ratio is a lower bound (no pass possible)"
            stat = f"{word}-clock time to target, T-PPO / PPO (geometric mean)"
            name = part + ("" if counts else f" ({word} time, not counted)")
            rule = Rule("less", float(opts["goal"]))
            checks.append(
                CheckResult(
                    name,
                    f"{arm} / {ppo}",
                    stat,
                    ratios,
                    rule,
                    log=True,
                    counts=counts,
                    lower_bounds=bool(censored),
                    note=note,
                )
            )
        breakdown = _breakdown(data, [ppo, arm])
        if breakdown:
            checks[first].note += "; " + breakdown
    return checks
