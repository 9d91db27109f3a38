"""The entropy-preserving claims (arXiv 2603.11682): REPO-R against GRPO, ADAPO against DAPO
(``analysis.claim_checks``).

repo_r_entropy, adapo_success (abstract, section 5): entropy kept better than the baseline's and a better
final success rate; a run whose controller sat at one of its caps over the whole last quarter is flagged
(``pinned_check``), since it ran its baseline with a fixed setting, not the adaptive method.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import pandas as pd

from analysis.aggregate import run_series
from analysis.arms import arm_table, counterpart, run_labels, run_params, select_arms
from analysis.claim_checks_common import PINNED, SHOWN, arms_with_any, entropy_kept, final_success, grpo_arms
from analysis.claim_rules import CheckResult, not_checked
from analysis.frames import ExperimentData
from analysis.stability_indicators import CONTROLLERS, controller_pinned
from runners import metric_names


def pinned_check(data: ExperimentData, arm: str, controller: str) -> CheckResult:
    """Shown, not counted: the share of the arm's seeds whose controller sat at one cap over the whole last
    quarter of the run (``analysis.stability_indicators.controller_pinned``): such a run is its baseline with a fixed
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
    found = arms_with_any(arms, entropy_control=method, algorithm=method)
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
    return _entropy_preserving(data, opts, "repo_r", "REPO-R", "GRPO", "GRPO (Clip, no mask)", grpo_arms, "entropy")


def adapo_success(data: ExperimentData, opts: Mapping) -> list[CheckResult]:
    dapo = functools.partial(select_arms, algorithm="dapo", entropy_control="none")
    return _entropy_preserving(data, opts, "adapo", "ADAPO", "DAPO", "DAPO", dapo, "success")
