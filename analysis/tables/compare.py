"""Comparison table: every arm against the sweep's baseline, over seeds, with the multiple-test correction.

Per metric and arm: mean and 95% t interval over seeds (n stated) of each run's final value (an
evaluation metric: the run's last evaluation, its step named in the row label, as in every table;
training success: the mean of its last 5 steps); the difference to the baseline
on the seeds both ran (paired by seed) with its t interval; the two-sided p-value of the paired
t-test (or the exact sign-flip test); Holm-Bonferroni adjusted over every comparison of the table;
the verdict ("higher" / "lower" than the baseline, or "not distinguishable"); and the seeds a paired
t-test would need for 80% power at alpha 0.05 to detect the observed difference and a stated
minimal effect, from the observed spread of the differences. See ``analysis.stats``.

    from analysis.tables.compare import comparison_table
    table = comparison_table(data, baseline={"tags": {"algorithm": "ppo"}})
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from analysis.aggregate import final_eval_label
from analysis.arms import (
    DEFAULT_BASELINE,
    Baseline,
    arm_table,
    ordered_arms,
    per_seed,
    per_seed_final_eval,
    resolve_baselines,
    run_labels,
)
from analysis.frames import ExperimentData
from analysis.names import eval_metrics
from analysis.skip import SkipItem
from analysis.stats import ALPHA, POWER, TEST_NAMES, holm, paired_test, seeds_needed, seeds_text, t_interval
from analysis.tables.base import MISSING, Table
from runners import metric_names

COLUMNS = [
    "n seeds",
    "mean [95% CI]",
    "baseline",
    "Δ vs baseline [95% CI]",
    "p",
    "p (Holm)",
    "verdict",
    "seeds for observed Δ",
    "seeds for minimal Δ",
]


# ``how`` of a metric whose value per run is its final evaluation (``analysis.aggregate.final_evals``: the last
# evaluation); its row label gets the step: "<label> at step 20 (last eval)"
LAST_EVAL = "last_eval"


def default_metrics(names: list[str], max_evals: int = 3) -> list[tuple[str, str, int, str]]:
    """[(metric, how, last_n, label)]: final training success (mean of the last 5 steps) and the final
    pass@1 (the last evaluation of each run) of up to ``max_evals`` evaluation sets."""
    out = []
    if metric_names.SCORE_MEAN in names:
        out.append((metric_names.SCORE_MEAN, "final", 5, "train success (mean of last 5 steps)"))
    for data, metric in list(eval_metrics(names).items())[:max_evals]:
        out.append((metric, LAST_EVAL, 1, f"{data} pass@1"))
    return out


def baselines_or_first(arms: pd.DataFrame, spec: Baseline) -> tuple[dict[str, str], list[str]]:
    """Each arm's baseline by ``spec``; when no arm is one, every arm is compared with the first arm
    (sorted), and the note says so. The comparison and aggregate tables share this rule."""
    bases = resolve_baselines(arms, spec)
    if any(bases[a] == a for a in arms.index):
        return bases, []
    first = sorted(arms.index)[0]
    return {a: first for a in arms.index}, [f"no run matches the {spec.describe()}; compared with {first} instead"]


def make_baseline(baseline: Baseline | Mapping | None) -> Baseline:
    if baseline is None:
        return DEFAULT_BASELINE
    if isinstance(baseline, Baseline):
        return baseline
    return Baseline(dict(baseline.get("tags", {})), tuple(baseline.get("match", ())))


def _verdict(arm: str, base: str | None, n: int, p_holm: float, diff: float) -> str:
    if base == arm:
        return "baseline"
    if base is None:
        return "no baseline"
    if n < 2:
        return f"not testable (n={n})"
    if np.isfinite(p_holm) and p_holm <= ALPHA:
        return f"{'higher' if diff > 0 else 'lower'} than {base}"
    return "not distinguishable"


def comparison_table(
    data: ExperimentData,
    baseline: Baseline | Mapping | None = None,
    metrics: list[tuple[str, str, int, str]] | None = None,
    test: str = "t",
    min_effect: float = 0.02,
) -> Table:
    """Rows (metric, arm); columns ``COLUMNS`` (see module docstring)."""
    names = data.metric_names()
    metrics = [m for m in (metrics or default_metrics(names)) if m[0] in names]
    if not metrics:
        raise SkipItem(f"no run logs {metric_names.SCORE_MEAN} or an evaluation metric")
    spec = make_baseline(baseline)
    labels = run_labels(data)
    arms = arm_table(data)
    bases, notes = baselines_or_first(arms, spec)
    order = ordered_arms(arms, bases)
    rows, cells, pvals = [], [], []
    for metric, how, last_n, label in metrics:
        if how == LAST_EVAL:
            values, steps = per_seed_final_eval(data, metric, labels=labels)
            label = final_eval_label(steps, label)
        else:
            values = per_seed(data, metric, how, last_n, labels=labels)
        for arm in order:
            own = values.get(arm, {})
            base = bases.get(arm)
            test_result = paired_test(own, values.get(base, {}), test) if base not in (None, arm) else None
            rows.append((label, arm))
            cells.append((t_interval(list(own.values())), base, test_result))
            pvals.append(test_result.p if test_result is not None else np.nan)
    adjusted = holm(pvals)
    index = pd.MultiIndex.from_tuples(rows, names=["metric", "Method"])
    values = pd.DataFrame(np.nan, index=index, columns=pd.Index(COLUMNS), dtype=object)
    display = pd.DataFrame(MISSING, index=index, columns=values.columns)
    aux = {k: pd.DataFrame(np.nan, index=index, columns=["value"]) for k in ("ci_lo", "ci_hi", "diff_lo", "diff_hi")}
    for (row, (ci, base, tr)), p_holm in zip(zip(rows, cells), adjusted):
        n_pairs = tr.n if tr is not None else 0
        diff = tr.diff.mean if tr is not None else np.nan
        verdict = _verdict(row[1], base, n_pairs, p_holm, diff)
        seeds_obs = seeds_min = None
        if tr is not None and n_pairs >= 2:
            seeds_obs = seeds_needed(diff, tr.diff.std)
            seeds_min = seeds_needed(min_effect, tr.diff.std)
        values.loc[row] = [ci.n, ci.mean, base, diff, tr.p if tr else np.nan, p_holm, verdict, seeds_obs, seeds_min]
        aux["ci_lo"].loc[row, "value"], aux["ci_hi"].loc[row, "value"] = ci.lo, ci.hi
        if tr is not None:
            aux["diff_lo"].loc[row, "value"], aux["diff_hi"].loc[row, "value"] = tr.diff.lo, tr.diff.hi
        display.loc[row] = [
            str(ci.n),
            ci.text(3, show_n=False),
            base if base not in (None, row[1]) else ("–" if base is None else "(baseline)"),
            tr.diff.text(3, signed=True, show_n=False) if tr is not None else MISSING,
            _p(tr.p) if tr is not None else MISSING,
            _p(p_holm),
            verdict,
            seeds_text(seeds_obs, n_pairs) if tr is not None else MISSING,
            seeds_text(seeds_min, n_pairs) if tr is not None else MISSING,
        ]
    m = int(np.isfinite(adjusted).sum())
    if test == "sign_flip":
        notes.append("the exact sign-flip test cannot reach p < 0.05 (two-sided) with fewer than 6 paired seeds")
    single = sorted({r[1] for r, (ci, _, _) in zip(rows, cells) if ci.n == 1})
    if single:
        notes.append(f"one seed only ({', '.join(single)}): no interval and no test; rerun with more seeds")
    return Table(
        key="comparison",
        title="Comparison with the baseline over seeds",
        caption=(
            "Mean [95% t interval] over seeds (n seeds) of each run's final value (an evaluation: the run's last "
            "evaluation, at the step in the row's label; training success: mean of its last steps). Δ = method − baseline on the seeds "
            f"both ran (paired by seed) with its 95% t interval; p: two-sided {TEST_NAMES[test]} on the paired "
            f"differences; p (Holm): Holm-Bonferroni adjusted over the {m} comparisons of this table; "
            f"'not distinguishable' where the adjusted p > {ALPHA}. Seeds for observed / minimal Δ: paired seeds a paired "
            f"t-test needs for {POWER:.0%} power at alpha {ALPHA} (two-sided, per comparison) given the observed spread of "
            f"the differences, to detect the observed Δ / a minimal effect of {min_effect:g} (– below 2 paired seeds). "
            + spec.describe().capitalize()
            + "."
        ),
        values=values,
        display=display,
        notes=notes,
        aux={k: v["value"].to_frame() for k, v in aux.items()},
    )


def _p(p: float) -> str:
    if not np.isfinite(p):
        return MISSING
    return "< 0.001" if p < 0.001 else f"{p:.3f}"
