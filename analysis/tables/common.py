"""Helpers shared by the paper-table builders: metric resolution, paper-model matching, ours/paper cells."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.aggregate import mean_std
from analysis.names import EVAL_ALIASES, eval_metrics, find_eval, match_name, norm
from analysis.tables.base import fmt_mean_std, fmt_num

# benchmarks of the MATH-Eval suite (never taken as the "in-domain" evaluation)
MATH_SUITE = ("aime24", "aime25", "amc", "math500", "omni_math", "olympiad", "minerva", "math_eval")


def resolve_eval(metric_names: list[str], canonical: str, dataset: str | None = None) -> tuple[str | None, str | None]:
    """The eval metric for ``canonical``; for "dapo_eval" falls back to the in-domain evaluation.

    In-domain fallback: the eval data set named like the training data set, else the only eval
    data set outside the MATH suite. Returns (metric or None, note for the caption or None).
    """
    metric = find_eval(metric_names, canonical)
    if metric is not None or canonical != "dapo_eval":
        return metric, None
    suite = {norm(a) for key in MATH_SUITE for a in EVAL_ALIASES[key]}
    candidates = {d: m for d, m in eval_metrics(metric_names).items() if norm(d) not in suite}
    if dataset is not None:
        for d, m in candidates.items():
            if norm(d).startswith(norm(dataset)) or norm(dataset).startswith(norm(d)):
                return m, f"in-domain evaluation taken from {m}"
    if len(candidates) == 1:
        (m,) = candidates.values()
        return m, f"in-domain evaluation taken from {m}"
    return None, None


def paper_model(model_tag: object, candidates: list[str], default: str) -> tuple[str, str | None]:
    """The paper model matching our ``model`` tag, else ``default`` with a caption note."""
    hit = match_name(model_tag, candidates)
    if hit is not None:
        return hit, None
    return default, f"our model {model_tag} is not in the paper; paper column shows {default}"


def seed_cell(values: pd.Series | np.ndarray, digits: int = 3) -> tuple[float, float, str]:
    """(mean, std, display) over seeds; the display shows ± std when there are several seeds."""
    mean, std, _ = mean_std(np.asarray(values, dtype=float))
    return mean, std, fmt_mean_std(mean, std, digits)


def paper_cell(value: object, digits: int = 3) -> tuple[float, str]:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return float("nan"), fmt_num(None)
    return x, fmt_num(x, digits)


def is_troll(objective: object) -> bool:
    """True for the TROLL objectives (``troll`` and its sequence variant ``troll_seq``)."""
    return str(objective).startswith("troll")


def objective_column(objective: object) -> str:
    """the TROLL paper's column name for a run's objective tag."""
    return "TROLL" if is_troll(objective) else "Clip"
