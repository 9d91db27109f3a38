"""The papers' claims as checks on a sweep's runs (verdict rules: ``analysis.claims``).

Each function takes the data and the claim's options and returns its checks; runs are chosen by
their tags (``analysis.arms``), comparisons are paired by seed, and a check that cannot run says
which run or metric is missing. Thresholds are options with the defaults below, printed in the report.

- troll_kl_bound (arXiv 2510.03817 section 3, eq. 3): TROLL keeps the token KL(pi_new || pi_old) measured
  after the update at or below its eps on (nearly) every token, where Clip does not.
- trm_length (arXiv 2512.23075 section 5 and appendix D.1): under a sampler/trainer mismatch,
  TRM-Max rejects long sequences more than short ones, and the run's Adaptive bound (eq. 40) is
  below the classical TRPO bound (eq. 27).
- repo_r_entropy (arXiv 2603.11682 section 5): REPO-R keeps the policy entropy near its start while
  GRPO's drops.
- gtpo_conflict (arXiv 2508.03772 section 5): GTPO's conflict tokens keep their probability (GRPO's
  negative samples push them down).
- adapo_eps_high (arXiv 2603.11682 section 5.2): ADAPO moves eps_high and changes the clip fraction
  relative to DAPO.
- tppo_time (arXiv 2506.15050 section 4.2.2): T-PPO reaches PPO's final reward in at most half of
  PPO's wall-clock time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import pandas as pd

from analysis.aggregate import effective_window, run_series, smooth
from analysis.arms import arm_table, counterpart, per_seed, run_labels, run_params, select_arms
from analysis.claims import CheckResult, Claim, Rule, not_checked, register_claim
from analysis.frames import ExperimentData
from analysis.names import accept_rate_buckets, eval_metrics, find_eval, tv_position_buckets
from analysis.skip import SkipItem
from analysis.tables.scaling import compute_at
from analysis.timing import cumulative_time, phase_times
from runners import metric_names
from runners.algorithms.bounds import dbar_from_position_buckets, error_bounds

SAME_RECIPE = (
    metric_names.TAG_ALGORITHM,
    metric_names.TAG_ESTIMATOR,
    metric_names.TAG_MASK,
    metric_names.TAG_ENTROPY_CONTROL,
)


def _is_troll(objective: str) -> bool:
    return objective.startswith("troll")


def _grpo_arms(arms: pd.DataFrame) -> list[str]:
    return select_arms(arms, algorithm="grpo", objective="clip", mask="none", entropy_control="none")


def _either(arms: pd.DataFrame, **tags: str) -> list[str]:
    """Arms matching any one of the tag values (e.g. entropy_control=repo_r or algorithm=repo_r)."""
    return sorted({a for tag, value in tags.items() for a in select_arms(arms, **{tag: value})})


def _paired(a: Mapping[int, float], b: Mapping[int, float]) -> dict[int, float]:
    return {s: a[s] - b[s] for s in sorted(set(a) & set(b))}


def _per_run_seed(data: ExperimentData, arm: str, fn: Callable[[str], float]) -> dict[int, float]:
    """{seed: mean of ``fn(run_id)`` over the arm's runs of that seed} (non-finite results dropped)."""
    labels = run_labels(data)
    acc: dict[int, list[float]] = {}
    for rid, seed in zip(
        labels.loc[labels["arm"] == arm, "run_id"], labels.loc[labels["arm"] == arm, metric_names.TAG_SEED]
    ):
        value = fn(str(rid))
        if np.isfinite(value):
            acc.setdefault(int(seed), []).append(value)
    return {s: float(np.mean(v)) for s, v in acc.items()}


# -- TROLL -----------------------------------------------------------------------------------------
def _troll_eps(data: ExperimentData, runs: pd.Series, default: float) -> tuple[float, str]:
    """(eps of a TROLL arm's runs, a note when it had to be assumed)."""
    eps_by_run = {r: float(v) for r, v in run_params(data, "objective.eps").items()}
    values = [eps_by_run[r] for r in runs if r in eps_by_run]
    if values:
        return float(np.median(values)), ""
    return default, f"objective.eps not logged: eps = {default:g} (the TROLL default)"


def troll_kl_bound(data: ExperimentData, opts: Mapping) -> list[CheckResult]:
    """TROLL bounds the KL of every token (eq. 3), so the statistic is per token: the share of response
    tokens whose KL(pi_new || pi_old) after the update exceeds eps (``actor/post_update_kl_frac_above_<eps>``,
    mean over steps), at most ``tolerance`` for TROLL and above it for Clip with TROLL's eps. Shown beside
    them, not counted: TROLL's share minus Clip's, paired by seed (how much of Clip's excess TROLL removes).

    pi_old of the statistic is the policy before the update; TROLL's region is centred on the sampling
    policy. They are the same on-policy; with stale rollouts (``rollout.staleness`` > 0) the note says so."""
    tol = float(opts["tolerance"])
    part_troll = f"TROLL keeps the post-update token KL at or below eps (all but {tol:.0%} of tokens)"
    part_clip = f"Clip leaves eps on more than {tol:.0%} of tokens"
    arms, names = arm_table(data), set(data.metric_names())
    trolls = select_arms(arms, objective=_is_troll)
    if not trolls:
        return [not_checked(part_troll, "no TROLL run (objective troll*) in this sweep")]
    labels = run_labels(data)
    clips = select_arms(arms, objective=lambda o: not _is_troll(o))
    checks = []
    for arm in trolls:
        runs = labels.loc[labels["arm"] == arm, "run_id"].astype(str)
        eps, eps_note = _troll_eps(data, runs, float(opts["eps_default"]))
        metric = metric_names.post_update_kl_frac_above(eps)
        stat = f"share of tokens with KL(π_new ‖ π_old) > eps = {eps:g} after the update ({metric}), mean over steps"
        clip = counterpart(arms, arm, clips, SAME_RECIPE)
        if metric not in names:
            logged = ", ".join(f"{e:g}" for e in metric_names.POST_UPDATE_KL_THRESHOLDS)
            why = f"no run logs {metric} (thresholds logged: {logged}; runs from before the metric existed lack it)"
            checks += [not_checked(part_troll, why, arm), not_checked(part_clip, why, clip or "–")]
            continue
        share = per_seed(data, metric, "mean", labels=labels)
        note = "; ".join(filter(None, [eps_note, _stale_note(data, runs)]))
        checks.append(CheckResult(part_troll, arm, stat, share.get(arm, {}), Rule("less", tol), note=note))
        if clip is None:
            checks.append(not_checked(part_clip, f"no Clip run with the recipe of {arm}"))
            continue
        checks.append(CheckResult(part_clip, clip, stat, share.get(clip, {}), Rule("greater", tol)))
        diff = _paired(share.get(arm, {}), share.get(clip, {}))
        checks.append(
            CheckResult(
                "TROLL leaves eps on fewer tokens than Clip (not counted)",
                f"{arm} − {clip}",
                "difference of the shares above, paired by seed",
                diff,
                Rule("less", 0.0),
                counts=False,
            )
        )
    return checks


def _stale_note(data: ExperimentData, runs: pd.Series) -> str:
    stale = {r: v for r, v in run_params(data, "rollout.staleness").items() if r in set(runs)}
    k = max((int(float(v)) for v in stale.values()), default=0)
    if k <= 0:
        return ""
    return (
        f"rollouts {k} iteration(s) stale: TROLL's region is centred on the sampling policy, the statistic's "
        "pi_old is the policy before the update"
    )


# -- TRM -------------------------------------------------------------------------------------------
def _bound_ratio(data: ExperimentData, rid: str, tv: list, series: dict) -> float:
    kl = series["max_kl"].get(rid)
    if kl is None or not kl.notna().any():
        return float("nan")
    buckets = {(lo, hi): float(series[m][rid].mean()) for lo, hi, m in tv if rid in series[m]}
    if len(buckets) != len(tv) or not all(np.isfinite(v) for v in buckets.values()):
        return float("nan")
    T = max(hi for _, hi, _ in tv)
    b = error_bounds(T, float(kl.max()), dbar=dbar_from_position_buckets(buckets, T))
    return float(np.log10(b["adaptive"] / b["classical"])) if b["classical"] > 0 else float("nan")


def trm_length(data: ExperimentData, opts: Mapping) -> list[CheckResult]:
    part_len, part_bound = (
        "TRM-Max rejects long sequences more than short ones",
        "Adaptive bound below the classical bound",
    )
    arms, names = arm_table(data), data.metric_names()
    trms = select_arms(arms, mask="trm_max")
    if not trms:
        return [not_checked(part_len, "no TRM-Max run (mask trm_max) in this sweep")]
    buckets, tv = accept_rate_buckets(names), tv_position_buckets(names)
    checks = []
    for arm in trms:
        if len(buckets) < 2:
            checks.append(
                not_checked(
                    part_len, f"fewer than two {metric_names.trm_accept_rate_bucket(0, 256)}-style buckets", arm
                )
            )
        else:
            acc = {(lo, hi): per_seed(data, m, "mean").get(arm, {}) for lo, hi, m in buckets}
            vals, used = {}, set()
            for seed in sorted(set().union(*(set(v) for v in acc.values()))):
                have = [(k, v[seed]) for k, v in acc.items() if seed in v and np.isfinite(v[seed])]
                if len(have) >= 2:
                    vals[seed] = have[0][1] - have[-1][1]
                    used.add((have[0][0], have[-1][0]))
            (short, long_), *_ = sorted(used) or [((0, 0), (0, 0))]
            stat = f"acceptance of lengths [{short[0]}, {short[1]}) minus [{long_[0]}, {long_[1]}) (mean over steps)"
            checks.append(CheckResult(part_len, arm, stat, vals, Rule("greater", 0.0, opts["accept_margin"])))
        if metric_names.TRM_MAX_KL not in names or not tv:
            checks.append(
                not_checked(
                    part_bound,
                    f"needs {metric_names.TRM_MAX_KL} and {metric_names.trm_tv_position_bucket(0, 64)}-style buckets",
                    arm,
                )
            )
            continue
        series = {"max_kl": run_series(data, metric_names.TRM_MAX_KL), **{m: run_series(data, m) for _, _, m in tv}}
        vals = _per_run_seed(data, arm, lambda rid, series=series: _bound_ratio(data, rid, tv, series))
        stat = f"log10(Adaptive / Classical) at the run's max {metric_names.TRM_MAX_KL} and per-position TV, T = {max(h for _, h, _ in tv)}"
        checks.append(CheckResult(part_bound, arm, stat, vals, Rule("less", 0.0)))
    return checks


# -- REPO-R ----------------------------------------------------------------------------------------
def relative_change(s: pd.Series) -> float:
    """(mean of the last k points - mean of the first k) / mean of the first k, k = a tenth of the run (>= 1)."""
    s = s.dropna().sort_index()
    k = max(1, len(s) // 10)
    h0 = float(s.iloc[:k].mean())
    return (float(s.iloc[-k:].mean()) - h0) / h0 if h0 != 0 else float("nan")


def repo_r_entropy(data: ExperimentData, opts: Mapping) -> list[CheckResult]:
    part_repo, part_grpo = "REPO-R keeps entropy near its start", "GRPO's entropy drops"
    arms = arm_table(data)
    repos = _either(arms, entropy_control="repo_r", algorithm="repo_r")
    if not repos:
        return [not_checked(part_repo, "no REPO-R run in this sweep")]
    if metric_names.ENTROPY not in data.metric_names():
        return [not_checked(part_repo, f"no run logs {metric_names.ENTROPY}")]
    change = per_seed(data, metric_names.ENTROPY, relative_change)
    stat = f"relative change of {metric_names.ENTROPY}, last vs first tenth of the run"
    margin = float(opts["entropy_band"])
    checks = []
    for arm in repos:
        checks.append(CheckResult(part_repo, arm, stat, change.get(arm, {}), Rule("within", 0.0, margin)))
        grpo = counterpart(arms, arm, _grpo_arms(arms), ())
        if grpo is None:
            checks.append(not_checked(part_grpo, "no GRPO run (Clip, no mask, no entropy control) in this sweep"))
        else:
            checks.append(CheckResult(part_grpo, grpo, stat, change.get(grpo, {}), Rule("less", 0.0)))
    return checks


# -- GTPO ------------------------------------------------------------------------------------------
def gtpo_conflict(data: ExperimentData, opts: Mapping) -> list[CheckResult]:
    part_keep, part_vs = "GTPO's conflict tokens keep their probability", "GTPO protects them better than GRPO"
    arms = arm_table(data)
    gtpos = _either(arms, algorithm="gtpo", objective="gtpo")
    if not gtpos:
        return [not_checked(part_keep, "no GTPO run in this sweep")]
    metric = metric_names.GTPO_CONFLICT_PROB_DELTA
    if metric not in data.metric_names():
        return [not_checked(part_keep, f"no run logs {metric} (backends must log it)")]
    delta = per_seed(data, metric, "mean")
    tol = float(opts["logprob_tolerance"])
    checks = []
    for arm in gtpos:
        stat = f"mean over steps of {metric} (nats)"
        checks.append(CheckResult(part_keep, arm, stat, delta.get(arm, {}), Rule("greater", -tol)))
        grpo = counterpart(arms, arm, _grpo_arms(arms), ())
        if grpo is None or not delta.get(grpo):
            why = "no GRPO run" if grpo is None else f"{grpo} does not log {metric}"
            checks.append(not_checked(part_vs, why, arm))
            continue
        diff = _paired(delta.get(arm, {}), delta[grpo])
        checks.append(
            CheckResult(part_vs, f"{arm} − {grpo}", f"{stat}, paired by seed", diff, Rule("greater", 0.0, tol))
        )
    return checks


# -- ADAPO -----------------------------------------------------------------------------------------
def adapo_eps_high(data: ExperimentData, opts: Mapping) -> list[CheckResult]:
    part_eps, part_clip = "ADAPO moves eps_high", "ADAPO changes the clip fraction relative to DAPO"
    arms, names = arm_table(data), data.metric_names()
    adapos = _either(arms, entropy_control="adapo", algorithm="adapo")
    if not adapos:
        return [not_checked(part_eps, "no ADAPO run in this sweep")]
    dapos = select_arms(arms, algorithm="dapo", entropy_control="none")
    moved = per_seed(data, metric_names.ENTROPY_EPS_HIGH, lambda s: float(s.max() - s.min()))
    clip = per_seed(data, metric_names.PG_CLIPFRAC, "mean")
    checks = []
    for arm in adapos:
        if metric_names.ENTROPY_EPS_HIGH not in names:
            checks.append(not_checked(part_eps, f"no run logs {metric_names.ENTROPY_EPS_HIGH}", arm))
        else:
            stat = f"range (max − min) of {metric_names.ENTROPY_EPS_HIGH} over the run"
            checks.append(
                CheckResult(part_eps, arm, stat, moved.get(arm, {}), Rule("greater", float(opts["eps_high_move"])))
            )
        dapo = counterpart(arms, arm, dapos, ())
        if dapo is None or metric_names.PG_CLIPFRAC not in names:
            checks.append(
                not_checked(
                    part_clip, "no DAPO run" if dapo is None else f"no run logs {metric_names.PG_CLIPFRAC}", arm
                )
            )
            continue
        a, d = clip.get(arm, {}), clip.get(dapo, {})
        rel = {s: (a[s] - d[s]) / d[s] for s in sorted(set(a) & set(d)) if d[s] > 0}
        stat = f"(ADAPO − DAPO) / DAPO of the mean {metric_names.PG_CLIPFRAC}, paired by seed"
        checks.append(
            CheckResult(part_clip, f"{arm} vs {dapo}", stat, rel, Rule("differs", 0.0, float(opts["clipfrac_band"])))
        )
    return checks


# -- T-PPO -----------------------------------------------------------------------------------------
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
        return [not_checked(part, "no T-PPO run in this sweep")]
    if metric_names.TIMING_STEP not in names:
        return [not_checked(part, f"no run logs {metric_names.TIMING_STEP}")]
    reward, window = _reward_metric(names, opts.get("reward"))
    ppos = select_arms(arms, algorithm="ppo", objective=lambda o: not _is_troll(o))
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


for _claim in (
    Claim("troll_kl_bound", "TROLL trust region", "arXiv 2510.03817 §3, eq. 3",
          "TROLL keeps the KL(π_new ‖ π_old) of each token after the update at or below eps, where Clip does not.",
          troll_kl_bound, {"eps_default": 0.05, "tolerance": 0.01}),
    Claim("trm_length", "TRM length bias and bounds", "arXiv 2512.23075 §4, App. D.1",
          "Under mismatch TRM-Max rejects long sequences more than short ones, and the Adaptive bound at the run's "
          "measured divergence is below the classical bound.", trm_length, {"accept_margin": 0.02}),
    Claim("repo_r_entropy", "REPO-R preserves entropy", "arXiv 2603.11682 §5",
          "REPO-R holds the policy entropy near its starting value where GRPO's entropy drops.",
          repo_r_entropy, {"entropy_band": 0.2}),
    Claim("gtpo_conflict", "GTPO protects conflict tokens", "arXiv 2508.03772 §5",
          "Tokens shared by positive and negative responses keep their probability under GTPO (GRPO's negative "
          "samples push them down).", gtpo_conflict, {"logprob_tolerance": 0.005}),
    Claim("adapo_eps_high", "ADAPO adapts the clip range", "arXiv 2603.11682 §5.2",
          "ADAPO moves eps_high during training and so changes the clip fraction relative to DAPO.",
          adapo_eps_high, {"eps_high_move": 0.01, "clipfrac_band": 0.1}),
    Claim("tppo_time", "T-PPO efficiency", "arXiv 2506.15050 §4.2.2",
          "T-PPO reaches PPO's final reward in at most half of PPO's wall-clock time.",
          tppo_time, {"goal": 0.5, "last_n": 3, "reward": None}),
):  # fmt: skip
    register_claim(_claim)
