"""What the papers' claims share (``analysis.claim_checks``): picking a method's arms and its baseline,
pairing by seed, and the two checks several papers make, final success and entropy kept.

"Final" success is each run's last evaluation of held-out pass@1 (``analysis.aggregate.final_evals``);
entropy at the end is the mean over the last tenth of a run's steps; a comparison is the method's value
minus its baseline's on the same seed (``paired``), claimed > 0 (``analysis.claim_rules.Rule``).
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from analysis.aggregate import final_eval_label
from analysis.arms import per_seed, per_seed_final_eval, select_arms
from analysis.claim_rules import CheckResult, Rule, not_checked
from analysis.frames import ExperimentData
from analysis.names import eval_metrics
from runners import metric_names

SAME_RECIPE = (
    metric_names.TAG_ALGORITHM,
    metric_names.TAG_ESTIMATOR,
    metric_names.TAG_MASK,
    metric_names.TAG_ENTROPY_CONTROL,
)
PINNED, SHOWN = "pinned at a cap", "shown"


def is_troll(objective: str) -> bool:
    return objective.startswith("troll")


def grpo_arms(arms: pd.DataFrame) -> list[str]:
    return select_arms(arms, algorithm="grpo", objective="clip", mask="none", entropy_control="none")


def arms_with_any(arms: pd.DataFrame, **tags: str) -> list[str]:
    """Arms matching any one of the tag values (e.g. entropy_control=repo_r or algorithm=repo_r)."""
    return sorted({a for tag, value in tags.items() for a in select_arms(arms, **{tag: value})})


def paired(a: Mapping[int, float], b: Mapping[int, float]) -> dict[int, float]:
    return {s: a[s] - b[s] for s in sorted(set(a) & set(b))}


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
    diff = paired(finals.get(arm, {}), finals.get(base, {}))
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
    return CheckResult(part, f"{arm} − {base}", stat, paired(ent.get(arm, {}), ent.get(base, {})), Rule("greater", 0.0))
