"""The papers' claims as checks on a sweep's runs (verdict rules: ``analysis.claims``).

Each claim quotes its paper and uses the paper's own metric; runs are chosen by their tags
(``analysis.arms``), comparisons are paired by seed, "final" is each run's last evaluation
(``analysis.aggregate.final_evals``), and a check that cannot run says which run or metric is missing.
A check on one method's own numbers is run on its baseline too (``CheckResult.baseline_values``).

- troll_success (arXiv 2510.03817 abstract, Table 1; section 4 and Figures 5, 17): TROLL's final success
  rate above Clip's, and more entropy kept.
- troll_kl_bound (arXiv 2510.03817 section 3, eq. 3): fewer tokens beyond the KL radius eps after the update
  than Clip leaves.
- trm_bound (arXiv 2512.23075 abstract, section 6, section 7; appendix D.1): the error bound at the runs'
  real response lengths and measured divergence is non-vacuous (below 1, the largest reward, section 4.1),
  training is stable (final success not below GRPO's); the length bias TRM concedes is shown, not counted.
- gtpo_conflict (arXiv 2508.03772 abstract, section 5): conflict tokens keep their probability (run on
  GRPO too), better than under GRPO, and a better final success rate.
- repo_r_entropy, adapo_success (arXiv 2603.11682 abstract, section 5): entropy kept better than the
  baseline's and a better final success rate; a controller pinned at its cap is flagged.
- tppo_time (arXiv 2506.15050 section 4.2, Figure 1): T-PPO matches PPO's final reward with 60% less
  wall-clock time (a ratio at most 0.4).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import numpy as np
import pandas as pd

from analysis.aggregate import effective_window, final_eval_label, run_series, smooth
from analysis.arms import arm_table, counterpart, per_seed, per_seed_final_eval, run_labels, run_params, select_arms
from analysis.claims import CheckResult, Claim, Rule, not_checked, register_claim
from analysis.frames import ExperimentData
from analysis.names import accept_rate_buckets, eval_metrics, find_eval, tv_position_buckets
from analysis.skip import SkipItem
from analysis.stability import CONTROLLERS, controller_pinned
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
PINNED, SHOWN = "pinned at a cap", "shown"


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


# -- shared checks ---------------------------------------------------------------------------------
def _eval_metric(data: ExperimentData, opts: Mapping) -> str | None:
    """The held-out pass@1 the papers report: ``opts["eval"]`` or the first evaluation set logged."""
    wanted = opts.get("eval")
    if wanted:
        return wanted if wanted in data.metric_names() else None
    return next(iter(eval_metrics(data.metric_names()).values()), None)


def final_success(data: ExperimentData, opts: Mapping, part: str, arm: str, base: str | None, base_what: str):
    """Final held-out pass@1 (each run's last evaluation), ``arm`` − ``base`` paired by seed, claimed > 0."""
    if base is None:
        return not_checked(part, f"no {base_what} run in this sweep", arm)
    metric = _eval_metric(data, opts)
    if metric is None:
        return not_checked(part, "no held-out evaluation logged (trainer.eval_every = 0?)", f"{arm} − {base}")
    finals, steps = per_seed_final_eval(data, metric)
    diff = _paired(finals.get(arm, {}), finals.get(base, {}))
    stat = f"{final_eval_label(steps)} of {metric}, paired by seed"
    return CheckResult(part, f"{arm} − {base}", stat, diff, Rule("greater", 0.0))


def final_tenth(s: pd.Series) -> float:
    """Mean of the last tenth of a run's steps (at least one point)."""
    s = s.dropna().sort_index()
    return float(s.iloc[-max(1, len(s) // 10) :].mean())


def entropy_kept(data: ExperimentData, part: str, arm: str, base: str | None, base_what: str) -> CheckResult:
    """Entropy at the end of the run (mean of its last tenth of steps), ``arm`` − ``base`` by seed, claimed > 0."""
    if base is None:
        return not_checked(part, f"no {base_what} run in this sweep", arm)
    if metric_names.ENTROPY not in data.metric_names():
        return not_checked(part, f"no run logs {metric_names.ENTROPY}", arm)
    ent = per_seed(data, metric_names.ENTROPY, final_tenth)
    stat = f"{metric_names.ENTROPY} over the last tenth of the steps (nats), paired by seed"
    return CheckResult(
        part, f"{arm} − {base}", stat, _paired(ent.get(arm, {}), ent.get(base, {})), Rule("greater", 0.0)
    )


def pinned_check(data: ExperimentData, arm: str, controller: str) -> CheckResult:
    """Shown, not counted: the share of the arm's seeds whose controller sat at one cap over the whole last
    quarter of the run (``analysis.stability.controller_pinned``): such a run is its baseline with a fixed
    setting, not the adaptive method the paper describes."""
    metric, lo_key, hi_key = CONTROLLERS[controller]
    part = f"{controller} controller off its caps ({metric})"
    if metric not in data.metric_names():
        return not_checked(part, f"no run logs {metric}", arm, counts=False)
    labels, series = run_labels(data), run_series(data, metric)
    lows, highs = run_params(data, lo_key), run_params(data, hi_key)
    pinned: dict[int, float] = {}
    for rid, seed in zip(
        labels.loc[labels["arm"] == arm, "run_id"], labels.loc[labels["arm"] == arm, metric_names.TAG_SEED]
    ):
        rid = str(rid)
        if rid not in lows or rid not in highs:
            continue
        flag = controller_pinned(series.get(rid), float(lows[rid]), float(highs[rid]))
        if flag is not None:
            pinned[int(seed)] = float(flag)
    if not pinned:
        return not_checked(part, f"caps {lo_key} / {hi_key} not logged", arm, counts=False)
    k = int(sum(pinned.values()))
    check = CheckResult(part, arm, f"seeds with {metric} at one cap over the whole last quarter: {k} of {len(pinned)}",
                        pinned, counts=False, interval=False)  # fmt: skip
    check.verdict = PINNED if k else SHOWN
    if k:
        check.note = (f"{metric} sat at a cap ({lo_key} or {hi_key}) on {k} of {len(pinned)} seeds: those runs are "
                      "their baseline with a fixed setting, not the adaptive method")  # fmt: skip
    return check


# -- TROLL -----------------------------------------------------------------------------------------
def _troll_pairs(data: ExperimentData) -> tuple[pd.DataFrame, list[tuple[str, str | None]]]:
    """(arm table, [(TROLL arm, its Clip counterpart of the same recipe or None)])."""
    arms = arm_table(data)
    clips = select_arms(arms, objective=lambda o: not _is_troll(o))
    return arms, [(a, counterpart(arms, a, clips, SAME_RECIPE)) for a in select_arms(arms, objective=_is_troll)]


def troll_success(data: ExperimentData, opts: Mapping) -> list[CheckResult]:
    part_success, part_entropy = "TROLL's final success rate above Clip's", "TROLL keeps more entropy than Clip"
    _, pairs = _troll_pairs(data)
    if not pairs:
        return [not_checked(part_success, "no TROLL run (objective troll*) in this sweep")]
    checks = []
    for arm, clip in pairs:
        checks.append(final_success(data, opts, part_success, arm, clip, f"Clip run with the recipe of {arm}"))
        checks.append(entropy_kept(data, part_entropy, arm, clip, f"Clip run with the recipe of {arm}"))
    return checks


def _troll_eps(data: ExperimentData, runs: pd.Series, default: float) -> tuple[float, str]:
    """(eps of a TROLL arm's runs, a note when it had to be assumed)."""
    eps_by_run = {r: float(v) for r, v in run_params(data, "objective.eps").items()}
    values = [eps_by_run[r] for r in runs if r in eps_by_run]
    if values:
        return float(np.median(values)), ""
    return default, f"objective.eps not logged: eps = {default:g} (the TROLL default)"


def troll_kl_bound(data: ExperimentData, opts: Mapping) -> list[CheckResult]:
    """TROLL bounds the KL of every token (eq. 3), so the statistic is per token: the share of response
    tokens whose KL after the update from the centre of TROLL's region exceeds eps, mean over steps,
    TROLL's minus Clip's (same eps, same recipe), paired by seed, claimed < 0. The paper guarantees the
    *projected* policy inside the region; the network after the optimiser step is what both methods leave,
    so no absolute tolerance is claimed. Both shares are shown beside it, not counted.

    The centre is the policy the tokens were sampled from (section 3.1). On-policy that is pi_old of the
    old-log-prob pass (``actor/post_update_kl_frac_above_<eps>``); with a separate sampling copy (stale
    rollouts, a lower-precision sampler) it is that copy (``actor/post_update_kl_sampler_frac_above_<eps>``,
    logged by every method there). Runs from before the sampler statistic existed fall back to pi_old's,
    and the note says so."""
    part = "TROLL leaves fewer tokens beyond eps than Clip"
    arms, pairs = _troll_pairs(data)
    if not pairs:
        return [not_checked(part, "no TROLL run (objective troll*) in this sweep")]
    labels, names = run_labels(data), set(data.metric_names())
    checks = []
    for arm, clip in pairs:
        runs = labels.loc[labels["arm"] == arm, "run_id"].astype(str)
        eps, eps_note = _troll_eps(data, runs, float(opts["eps_default"]))
        if clip is None:
            checks.append(not_checked(part, f"no Clip run with the recipe of {arm}", arm))
            continue
        metric, centre, centre_note = _kl_centre(names, eps, _off_policy(data, runs))
        if metric not in names:
            logged = ", ".join(f"{e:g}" for e in metric_names.POST_UPDATE_KL_THRESHOLDS)
            why = f"no run logs {metric} (thresholds logged: {logged}; runs from before the metric existed lack it)"
            checks.append(not_checked(part, why, f"{arm} − {clip}"))
            continue
        share = per_seed(data, metric, "mean", labels=labels)
        stat = f"share of tokens with KL(π_new ‖ {centre}) > eps = {eps:g} after the update ({metric}), mean over steps"
        note = "; ".join(filter(None, [eps_note, centre_note]))
        diff = _paired(share.get(arm, {}), share.get(clip, {}))
        checks.append(
            CheckResult(part, f"{arm} − {clip}", stat + ", paired by seed", diff, Rule("less", 0.0), note=note)
        )
        for who in (arm, clip):
            shown = CheckResult(f"share beyond eps ({who})", who, stat, share.get(who, {}), counts=False)
            shown.verdict = SHOWN
            checks.append(shown)
    return checks


def _off_policy(data: ExperimentData, runs: pd.Series) -> str:
    """How the runs' sampling policy differs from pi_old ("" on-policy): stale rollouts, a lower-precision
    sampler. Only the built-in trainer centres TROLL on its sampling copy; verl's TROLL keeps the top-K of its
    old-log-prob pass (``runners.backends.verl.sparse_old``), so pi_old is the centre there."""
    labels = data.labels()
    verl = set(labels.loc[labels[metric_names.TAG_BACKEND] == "verl", "run_id"].astype(str))
    ids = set(runs) - verl
    stale = [int(float(v)) for r, v in run_params(data, "rollout.staleness").items() if r in ids]
    dtypes = {str(v) for r, v in run_params(data, "rollout.dtype").items() if r in ids} - {"auto", "None", "nan"}
    k = max(stale, default=0)
    parts = [
        f"rollouts {k} iteration(s) stale" if k > 0 else "",
        f"a {'/'.join(sorted(dtypes))} sampler" if dtypes else "",
    ]
    return " and ".join(filter(None, parts))


def _kl_centre(names: set[str], eps: float, off_policy: str) -> tuple[str, str, str]:
    """(the share metric, the centre's symbol, a note) for runs sampled on-policy or ``off_policy``."""
    own = metric_names.post_update_kl_frac_above(eps)
    if not off_policy:
        return own, "π_old", ""
    sampler = metric_names.post_update_kl_frac_above(eps, sampler=True)
    if sampler in names:
        return sampler, "π_sampler", f"{off_policy}: measured from the sampling policy, the centre of TROLL's region"
    note = (
        f"{off_policy}: TROLL's region is centred on the sampling policy, the statistic's pi_old is the policy "
        f"before the update (these runs do not log {sampler})"
    )
    return own, "π_old", note


# -- TRM -------------------------------------------------------------------------------------------
def _run_length(data: ExperimentData, rid: str, lengths: dict) -> int | None:
    """The run's real response length: the longest response it logged, else its configured maximum."""
    s = lengths.get(rid)
    if s is not None and s.notna().any():
        return max(1, int(np.ceil(float(s.max()))))
    configured = run_params(data, "rollout.max_response_length").get(rid)
    return int(float(configured)) if configured is not None else None


def _log10_bound(data: ExperimentData, rid: str, tv: list, series: dict, lengths: dict, masks: dict) -> float:
    """log10 of TRM's best error bound (eq. 42-45: min of Pinsker-marginal, Adaptive) at the run's
    largest logged ``trm/max_kl``, its per-position TV and its real response length T. ``trm/max_kl`` is
    taken over every sequence of a batch; a TRM-Max run trains only on those whose max KL is at most its
    ``mask.delta`` (section 6), so its divergence is capped there."""
    kl = series["max_kl"].get(rid)
    T = _run_length(data, rid, lengths)
    if kl is None or not kl.notna().any() or T is None:
        return float("nan")
    buckets = {(lo, hi): float(series[m][rid].mean()) for lo, hi, m in tv if rid in series[m]}
    if not buckets or not all(np.isfinite(v) for v in buckets.values()):
        return float("nan")
    try:
        dbar = dbar_from_position_buckets(buckets, T)
    except ValueError:
        return float("nan")
    delta = float(kl.max())
    if rid in masks:
        delta = min(delta, float(masks[rid]))
    best = float(error_bounds(T, delta, dbar=dbar)["best"])
    return float(np.log10(best)) if best > 0 else float("nan")


def trm_bound(data: ExperimentData, opts: Mapping) -> list[CheckResult]:
    part_bound = "TRM-Max's error bound is non-vacuous (below 1, the largest reward)"
    part_stable = "TRM-Max's final success rate not below GRPO's (stable training)"
    part_len = "length bias (appendix D.1, a limitation the paper concedes)"
    arms, names = arm_table(data), data.metric_names()
    trms = select_arms(arms, mask="trm_max")
    if not trms:
        return [not_checked(part_bound, "no TRM-Max run (mask trm_max) in this sweep")]
    buckets, tv = accept_rate_buckets(names), tv_position_buckets(names)
    lengths = run_series(data, metric_names.RESPONSE_LENGTH_MAX)
    labels = run_labels(data)
    masked = set(labels.loc[labels[metric_names.TAG_MASK] == "trm_max", "run_id"].astype(str))
    masks = {r: v for r, v in run_params(data, "mask.delta").items() if r in masked}
    checks = []
    for arm in trms:
        grpo = counterpart(arms, arm, _grpo_arms(arms), ())
        if metric_names.TRM_MAX_KL not in names or not tv:
            need = f"needs {metric_names.TRM_MAX_KL} and {metric_names.trm_tv_position_bucket(0, 64)}-style buckets"
            checks.append(not_checked(part_bound, need, arm))
        else:
            series = {"max_kl": run_series(data, metric_names.TRM_MAX_KL), **{m: run_series(data, m) for _, _, m in tv}}

            def bound(rid: str, series=series) -> float:
                return _log10_bound(data, rid, tv, series, lengths, masks)

            stat = (f"log10 of the best bound (eq. 42-45) at the run's largest {metric_names.TRM_MAX_KL} (TRM-Max: at most "
                    "its mask.delta, the largest divergence it trains on), its per-position TV and its longest response (T)")  # fmt: skip
            base_values = _per_run_seed(data, grpo, bound) if grpo is not None else None
            values = _per_run_seed(data, arm, bound)
            note = "" if base_values else "the baseline logs no TRM divergence: it is not run through this check"
            if not values:
                note = ("needs each run's response length (response_length/max or rollout.max_response_length) "
                        "inside the per-position TV buckets")  # fmt: skip
            checks.append(CheckResult(part_bound, arm, stat, values, Rule("less", 0.0),
                                      baseline_runs=grpo or "", baseline_values=base_values or None, note=note))  # fmt: skip
        checks.append(final_success(data, opts, part_stable, arm, grpo, "GRPO (Clip, no mask)"))
        if len(buckets) < 2:
            checks.append(not_checked(part_len, "fewer than two acceptance-by-length buckets", arm, counts=False))
            continue
        acc = {(lo, hi): per_seed(data, m, "mean").get(arm, {}) for lo, hi, m in buckets}
        vals, used = {}, set()
        for seed in sorted(set().union(*(set(v) for v in acc.values()))):
            have = [(k, v[seed]) for k, v in acc.items() if seed in v and np.isfinite(v[seed])]
            if len(have) >= 2:
                vals[seed] = have[0][1] - have[-1][1]
                used.add((have[0][0], have[-1][0]))
        (short, long_), *_ = sorted(used) or [((0, 0), (0, 0))]
        stat = f"acceptance of lengths [{short[0]}, {short[1]}) minus [{long_[0]}, {long_[1]}) (mean over steps)"
        shown = CheckResult(part_len, arm, stat, vals, counts=False)
        shown.verdict = SHOWN
        checks.append(shown)
    return checks


# -- GTPO ------------------------------------------------------------------------------------------
def gtpo_conflict(data: ExperimentData, opts: Mapping) -> list[CheckResult]:
    part_keep, part_vs = "GTPO's conflict tokens gain probability", "they gain more under GTPO than under GRPO"
    part_success = "GTPO's final success rate above GRPO's"
    arms = arm_table(data)
    gtpos = _either(arms, algorithm="gtpo", objective="gtpo")
    if not gtpos:
        return [not_checked(part_keep, "no GTPO run in this sweep")]
    metric = metric_names.GTPO_CONFLICT_PROB_DELTA
    delta = per_seed(data, metric, "mean") if metric in data.metric_names() else {}
    checks = []
    for arm in gtpos:
        grpo = counterpart(arms, arm, _grpo_arms(arms), ())
        stat = f"mean over steps of {metric} (nats)"
        if not delta.get(arm):
            checks.append(not_checked(part_keep, f"no run logs {metric} (backends must log it)", arm))
        else:
            base = delta.get(grpo) if grpo is not None else None
            note = "" if base else "no GRPO run logs the statistic: the baseline is not run through this check"
            checks.append(CheckResult(part_keep, arm, stat, delta[arm], Rule("greater", 0.0),
                                      baseline_runs=grpo or "", baseline_values=base or None, note=note))  # fmt: skip
            if grpo is None or not base:
                checks.append(
                    not_checked(part_vs, "no GRPO run" if grpo is None else f"{grpo} does not log {metric}", arm)
                )
            else:
                checks.append(CheckResult(part_vs, f"{arm} − {grpo}", f"{stat}, paired by seed",
                                          _paired(delta[arm], base), Rule("greater", 0.0)))  # fmt: skip
        checks.append(final_success(data, opts, part_success, arm, grpo, "GRPO (Clip, no mask)"))
    return checks


# -- entropy-preserving RL -------------------------------------------------------------------------
def _entropy_preserving(
    data: ExperimentData,
    opts: Mapping,
    method: str,
    label: str,
    base: str,
    what: str,
    base_arms: Callable[[pd.DataFrame], list[str]],
    headline: str,
) -> list[CheckResult]:
    """``label`` (``method``'s runs) against ``base`` (``base_arms(arms)``, described as ``what``): entropy at the
    end and final success, paired by seed, and whether the method's controller sat at a cap (``pinned_check``);
    with no run of the method, the paper's headline part (``headline``: "entropy" or "success") is not checked."""
    parts = {
        "entropy": f"{label} keeps more entropy than {base}",
        "success": f"{label}'s final success rate above {base}'s",
    }
    arms = arm_table(data)
    found = _either(arms, entropy_control=method, algorithm=method)
    if not found:
        return [not_checked(parts[headline], f"no {label} run in this sweep")]
    checks = []
    for arm in found:
        other = counterpart(arms, arm, base_arms(arms), ())
        checks.append(entropy_kept(data, parts["entropy"], arm, other, what))
        checks.append(final_success(data, opts, parts["success"], arm, other, what))
        checks.append(pinned_check(data, arm, method))
    return checks


def repo_r_entropy(data: ExperimentData, opts: Mapping) -> list[CheckResult]:
    return _entropy_preserving(data, opts, "repo_r", "REPO-R", "GRPO", "GRPO (Clip, no mask)", _grpo_arms, "entropy")


def adapo_success(data: ExperimentData, opts: Mapping) -> list[CheckResult]:
    dapo = functools.partial(select_arms, algorithm="dapo", entropy_control="none")
    return _entropy_preserving(data, opts, "adapo", "ADAPO", "DAPO", "DAPO", dapo, "success")


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
        return [
            not_checked(
                part, "not run in this sweep: sweeps/tppo_table1.yaml (GPU) and sweeps/tppo_table1_cpu.yaml run it"
            )
        ]
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
    Claim("troll_success", "TROLL against Clip", "arXiv 2510.03817 abstract, Table 1; §4, Figures 5 and 17",
          "\"TROLL consistently outperforms PPO-like clipping in terms of training speed, stability, and final success "
          "rates\"; \"TROLL generally maintains more entropy during training while showing higher success rates\".",
          troll_success, {"eval": None}),
    Claim("troll_kl_bound", "TROLL trust region", "arXiv 2510.03817 §3, eq. 3",
          "The projection \"provides principled token-level KL constraints\": KL(π_new ‖ π_old) ≤ eps per token, where "
          "clipping is \"a crude approximation\".", troll_kl_bound, {"eps_default": 0.05}),
    Claim("trm_bound", "TRM: non-vacuous bounds, stable training", "arXiv 2512.23075 abstract, §4.1, §6, §7; App. D.1",
          "\"TRM enables the first non-vacuous monotonic improvement guarantees\" (a bound below 1, \"the maximum "
          "possible reward\") \"and demonstrates empirical training stability\".", trm_bound, {"eval": None}),
    Claim("gtpo_conflict", "GTPO protects conflict tokens", "arXiv 2508.03772 abstract, §5",
          "GTPO \"identifies conflict tokens ... and protects them by skipping negative updates, while amplifying positive "
          "ones\", \"ensuring greater training stability and improved performance\".", gtpo_conflict, {"eval": None}),
    Claim("repo_r_entropy", "REPO-R preserves entropy", "arXiv 2603.11682 abstract, §5",
          "\"Models trained with our entropy-preserving methods maintain diversity throughout training, yielding final "
          "policies that are more performant\".", repo_r_entropy, {"eval": None}),
    Claim("adapo_success", "ADAPO preserves entropy", "arXiv 2603.11682 abstract, §5.2",
          "ADAPO, \"an adaptive asymmetric clipping approach\", maintains diversity and yields more performant final "
          "policies than its base, DAPO.", adapo_success, {"eval": None}),
    Claim("tppo_time", "T-PPO efficiency", "arXiv 2506.15050 §4.2, Figure 1",
          "T-PPO matches PPO's final reward \"with 60% wall-clock time reduction\" (a time ratio of at most 0.4).",
          tppo_time, {"goal": 0.4, "last_n": 3, "reward": None}),
):  # fmt: skip
    register_claim(_claim)
