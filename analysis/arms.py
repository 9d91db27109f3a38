"""Arms of a sweep (one compared configuration: a method, per model and per off-policy regime when a sweep
spans several), their per-seed values, and which arm is each arm's baseline.

Why: comparisons are paired by seed, so every statistic is first reduced to ``{arm: {seed: value}}``.
A sweep's baseline is a set of run tags (``Baseline.tags``, e.g. ``algorithm=grpo, objective=clip``)
plus the tags a method shares with its baseline (``Baseline.match``: ``("algorithm",)`` pairs
"GRPO+TROLL" with "GRPO" and "GSPO+TROLL" with "GSPO"); model, data set and regime always match. Tags a run
lacks take the configuration default (objective clip, mask none, entropy_control none, rollout_correction
none).

Arms are ordered deterministically (baselines first, then by label), never by the order MLflow
returned the runs in, so the same sweep prints the same table on every machine.

    from analysis.arms import arm_table, per_seed, Baseline, resolve_baselines
    values = per_seed(data, "critic/score/mean", how="final", last_n=5)   # {arm: {seed: value}}
    evals, steps = per_seed_final_eval(data, "val-core/gsm8k/acc/mean_at_1")  # each run's last evaluation
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis.aggregate import final_evals, final_value, run_series
from analysis.frames import ExperimentData
from runners import metric_names

TAG_DEFAULTS = {
    metric_names.TAG_OBJECTIVE: "clip",
    metric_names.TAG_MASK: "none",
    metric_names.TAG_ENTROPY_CONTROL: "none",
    metric_names.TAG_ROLLOUT_CORRECTION: "none",
}
# tags an arm is always compared within: the same model, data set and off-policy regime
MATCH_ALWAYS = (metric_names.TAG_MODEL, metric_names.TAG_DATASET, metric_names.TAG_REGIME)
# tags that split a method into several arms when a sweep spans several of their values ("GRPO | stale k=2")
SPLIT_BY = (metric_names.TAG_MODEL, metric_names.TAG_REGIME)


@dataclass(frozen=True)
class Baseline:
    """The runs every other arm of a sweep is compared with (see module docstring)."""

    # tag -> value; a value may be a glob ("troll*") and "!" negates it ("!troll*": any objective but TROLL's)
    tags: Mapping[str, str] = field(default_factory=dict)
    match: tuple[str, ...] = ()

    def predicates(self) -> dict[str, Callable[[str], bool]]:
        out = {}
        for tag, pattern in self.tags.items():
            negate, pat = pattern.startswith("!"), pattern.lstrip("!")
            out[tag] = lambda v, pat=pat, negate=negate: fnmatch.fnmatchcase(str(v), pat) != negate
        return out

    def describe(self) -> str:
        tags = ", ".join(f"{k} not {v[1:]}" if v.startswith("!") else f"{k}={v}" for k, v in self.tags.items())
        tags = tags or "any run"
        same = f"; a method is compared with the baseline of the same {', '.join(self.match)}" if self.match else ""
        return f"baseline: runs with {tags}{same} (same model and data set)"


DEFAULT_BASELINE = Baseline(
    {
        metric_names.TAG_ALGORITHM: "grpo",
        metric_names.TAG_OBJECTIVE: "clip",
        metric_names.TAG_MASK: "none",
        metric_names.TAG_ENTROPY_CONTROL: "none",
        metric_names.TAG_ROLLOUT_CORRECTION: "none",
    }
)


def run_labels(data: ExperimentData) -> pd.DataFrame:
    """``data.labels()`` with default tags filled in and an ``arm`` column: the method, followed by the model
    and the regime when the sweep has several of them ("GRPO+TROLL | stale k=2")."""
    labels = data.labels()
    for tag, default in TAG_DEFAULTS.items():
        labels[tag] = [v if isinstance(v, str) and v else default for v in labels[tag]]
    labels[metric_names.TAG_REGIME] = labels[metric_names.TAG_REGIME].fillna("?").astype(str)
    parts = [labels[metric_names.TAG_METHOD].astype(str)]
    for tag in SPLIT_BY:
        column = labels[tag].fillna("?").astype(str)
        if column.nunique() > 1:
            parts.append(column)
    labels["arm"] = [" | ".join(p) for p in zip(*parts)]
    return labels


def arm_table(data: ExperimentData) -> pd.DataFrame:
    """One row per arm (index ``arm``): the tags of its first run, sorted by arm label."""
    labels = run_labels(data)
    first = labels.drop_duplicates("arm").set_index("arm")
    return first.loc[sorted(first.index)]


def select_arms(arms: pd.DataFrame, **tags: object) -> list[str]:
    """Arms whose tags equal the given values; a value may be a tuple (any of) or a predicate."""
    keep = np.ones(len(arms), dtype=bool)
    for tag, want in tags.items():
        col = arms[tag].astype(str).to_numpy()
        if callable(want):
            keep &= np.array([bool(want(v)) for v in col], dtype=bool)
        elif isinstance(want, tuple):
            keep &= np.isin(col, [str(w) for w in want])
        else:
            keep &= col == str(want)
    return list(arms.index[keep])


def counterpart(arms: pd.DataFrame, arm: str, candidates: list[str], match: tuple[str, ...]) -> str | None:
    """The first of ``candidates`` (sorted) sharing ``match`` tags and model/data set with ``arm``."""
    row = arms.loc[arm]
    for c in sorted(candidates):
        if c != arm and all(str(arms.at[c, t]) == str(row[t]) for t in (*MATCH_ALWAYS, *match)):
            return c
    return None


def resolve_baselines(arms: pd.DataFrame, baseline: Baseline) -> dict[str, str | None]:
    """{arm: its baseline arm}; baseline arms map to themselves, arms without one to None."""
    bases = select_arms(arms, **baseline.predicates()) if baseline.tags else []
    out: dict[str, str | None] = {}
    for arm in arms.index:
        out[arm] = arm if arm in bases else counterpart(arms, arm, bases, baseline.match)
    return out


def ordered_arms(arms: pd.DataFrame, baselines: Mapping[str, str | None]) -> list[str]:
    """Baselines first, then the other arms, each group sorted by label."""
    base = sorted(a for a in arms.index if baselines.get(a) == a)
    return base + sorted(a for a in arms.index if baselines.get(a) != a)


def per_seed(
    data: ExperimentData,
    metric: str,
    how: str | Callable[[pd.Series], float] = "final",
    last_n: int = 1,
    labels: pd.DataFrame | None = None,
) -> dict[str, dict[int, float]]:
    """{arm: {seed: value}} of one number per run (runs of the same arm and seed are averaged).

    how: "final" (mean of the last ``last_n`` points), "mean", "max", "min", "first", or a function of
    the run's step-indexed series.
    """
    fns: dict[str, Callable[[pd.Series], float]] = {
        "final": lambda s: final_value(s, last_n),
        "mean": lambda s: float(s.mean()),
        "max": lambda s: float(s.max()),
        "min": lambda s: float(s.min()),
        "first": lambda s: float(s.dropna().sort_index().iloc[0]),
    }
    fn = how if callable(how) else fns.get(how)
    if fn is None:
        raise ValueError(f"how must be one of {sorted(fns)} or a function, got {how!r}")
    labels = run_labels(data) if labels is None else labels
    series = run_series(data, metric)
    values = {}
    for rid in labels["run_id"]:
        s = series.get(str(rid))
        if s is not None and s.notna().any():
            values[str(rid)] = float(fn(s.dropna()))
    return _by_arm_and_seed(labels, values)


def per_seed_final_eval(
    data: ExperimentData, metric: str, labels: pd.DataFrame | None = None
) -> tuple[dict[str, dict[int, float]], list[float]]:
    """({arm: {seed: final evaluation}}, the steps those evaluations were taken at): each run's last
    evaluation of ``metric`` (``analysis.aggregate.final_evals``, the rule every table shares)."""
    labels = run_labels(data) if labels is None else labels
    finals = final_evals(data, metric)
    finals = finals[np.isfinite(finals["value"].to_numpy(dtype=float))]
    values = dict(zip(finals["run_id"].astype(str), finals["value"].astype(float)))
    return _by_arm_and_seed(labels, values), list(finals["step"])


def _by_arm_and_seed(labels: pd.DataFrame, values: Mapping[str, float]) -> dict[str, dict[int, float]]:
    """{arm: {seed: value}} from {run_id: value} (finite values only; runs of one arm and seed averaged)."""
    acc: dict[str, dict[int, list[float]]] = {}
    for rid, arm, seed in zip(labels["run_id"], labels["arm"], labels[metric_names.TAG_SEED]):
        value = values.get(str(rid))
        if value is not None and np.isfinite(value):
            acc.setdefault(arm, {}).setdefault(int(seed), []).append(float(value))
    return {arm: {seed: float(np.mean(v)) for seed, v in seeds.items()} for arm, seeds in acc.items()}


def run_params(data: ExperimentData, key: str) -> dict[str, str]:
    """{run_id: value of the MLflow param ``key``} for the runs that logged it."""
    col = f"params.{key}"
    if col not in data.runs:
        return {}
    runs = data.runs[["run_id", col]].dropna()
    return {str(r): str(v) for r, v in zip(runs["run_id"], runs[col])}
