"""GTPO's claim (arXiv 2508.03772), checked against GRPO (``analysis.claim_checks``).

gtpo_conflict (abstract, section 5): conflict tokens keep their probability (run on GRPO too), gain more
of it than under GRPO, and GTPO's final success rate is above GRPO's.
"""

from __future__ import annotations

from collections.abc import Mapping

from analysis.arms import arm_table, counterpart, per_seed
from analysis.claim_checks_common import arms_with_any, final_success, grpo_arms, paired
from analysis.claim_rules import CheckResult, Rule, not_checked
from analysis.frames import ExperimentData
from runners import metric_names


def gtpo_conflict(data: ExperimentData, opts: Mapping) -> list[CheckResult]:
    part_keep, part_vs = "GTPO's conflict tokens gain probability", "they gain more under GTPO than under GRPO"
    part_success = "GTPO's final success rate above GRPO's"
    arms = arm_table(data)
    gtpos = arms_with_any(arms, algorithm="gtpo", objective="gtpo")
    if not gtpos:
        return [not_checked(part_keep, "no GTPO run in this sweep")]
    metric = metric_names.GTPO_CONFLICT_PROB_DELTA
    delta = per_seed(data, metric, "mean") if metric in data.metric_names() else {}
    checks = []
    for arm in gtpos:
        grpo = counterpart(arms, arm, grpo_arms(arms), ())
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
                                          paired(delta[arm], base), Rule("greater", 0.0)))  # fmt: skip
        checks.append(final_success(data, opts, part_success, arm, grpo, "GRPO (Clip, no mask)"))
    return checks
