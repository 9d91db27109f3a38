"""TRM's claims (arXiv 2512.23075), checked on TRM-Max runs against GRPO (``analysis.claim_checks``).

trm_bound (abstract, section 6, section 7; appendix D.1): the error bound (eq. 42-45) at the runs' real
response lengths and measured divergence is non-vacuous (below 1, the largest reward, section 4.1) and
training is stable (final success not below GRPO's); the length bias TRM concedes is shown, not counted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from analysis.aggregate import run_series
from analysis.arms import arm_table, counterpart, per_seed, run_labels, run_params, select_arms
from analysis.claim_checks_common import SHOWN, final_success, grpo_arms
from analysis.claim_rules import CheckResult, Rule, not_checked
from analysis.frames import ExperimentData
from analysis.names import accept_rate_buckets, tv_position_buckets
from runners import metric_names
from runners.algorithms.bounds import dbar_from_position_buckets, error_bounds


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
        grpo = counterpart(arms, arm, grpo_arms(arms), ())
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
