"""Evaluation sampling error table: each method's final pass@1 with the error of its finite prompt set, and its
difference to the baseline with a paired per-prompt bootstrap beside the seed-only interval.

Per evaluation set (up to three, as the comparison table) and method, from the per-prompt results of each run's
final evaluation (``analysis.eval_error``; runs without them are left out and counted in a note):

- pass@1: the mean over seeds of each run's mean over prompts (the comparison table's final value);
- eval-sampling 95% CI: percentile bootstrap resampling prompts (the same draw for every seed), seeds fixed;
- Δ vs the method's baseline (the comparison table's, ``analysis.tables.compare``) on the seeds both ran, with
  three 95% intervals: prompts (paired per-prompt bootstrap, seeds fixed), seeds (the comparison table's t
  interval over paired seeds, ``analysis.stats.paired_test``), and both (two-level bootstrap: paired seeds,
  then prompts).

    from analysis.tables.eval_error import eval_error_table
    eval_error_table(data)                   # reads the artifacts from data.load_info["tracking_uri"]
    eval_error_table(data, n_boot=5000)
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from analysis.aggregate import final_eval_label, steps_text
from analysis.arms import Baseline, arm_table, ordered_arms
from analysis.eval_error import (
    LEVEL,
    N_BOOT,
    SEED,
    PromptScores,
    Reader,
    arm_error,
    diff_error,
    load_prompt_scores,
    mlflow_reader,
    stack,
)
from analysis.frames import ExperimentData
from analysis.names import eval_metrics
from analysis.skip import SkipItem
from analysis.stats import paired_test
from analysis.tables.base import MISSING, Table
from analysis.tables.compare import baselines_or_first, make_baseline

COLUMNS = [
    "seeds",
    "prompts × samples",
    "pass@1",
    "eval-sampling 95% CI",
    "baseline",
    "Δ vs baseline",
    "Δ 95% CI: prompts (paired)",
    "Δ 95% CI: seeds",
    "Δ 95% CI: seeds and prompts",
]
# the interval columns' bounds, in ``Table.aux`` (their value cells hold the interval's width)
AUX = ("ci_lo", "ci_hi", "prompt_lo", "prompt_hi", "seed_lo", "seed_hi", "both_lo", "both_hi")
NOT_LOGGED = (
    "no run logged per-prompt evaluation results (the built-in trainer logs them at every evaluation; runs from "
    "before it did and verl runs have none)"
)


def _interval(lo: float, hi: float, signed: bool = False) -> str:
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return MISSING
    f = "{:+.3f}" if signed else "{:.3f}"
    return f"[{f.format(lo)}, {f.format(hi)}]"


def _n_text(scores: PromptScores) -> str:
    """The samples per prompt: '4', or '2-4' when runs differ."""
    n = sorted(set(scores.samples))
    return str(n[0]) if len(n) == 1 else f"{n[0]}-{n[-1]}"


def _samples_text(scores: PromptScores) -> str:
    return f"{len(scores.keys)} × {_n_text(scores)}"


def _rows(scores: PromptScores, bases: Mapping[str, str | None], order: list[str], opts: dict):
    """(arm, values row, display row, aux values) of one evaluation set."""
    for arm in [a for a in order if a in scores.x]:
        own = scores.x[arm]
        err = arm_error(stack(own), **opts)
        aux = dict.fromkeys(AUX, np.nan)
        aux.update(ci_lo=err.lo, ci_hi=err.hi)
        base = bases.get(arm)
        values = [err.seeds, err.prompts, err.pass1, err.hi - err.lo, base, np.nan, np.nan, np.nan, np.nan]
        display = [str(err.seeds), _samples_text(scores), f"{err.pass1:.3f}", _interval(err.lo, err.hi)]
        display += ["(baseline)" if base == arm else (base or MISSING)] + [MISSING] * 4
        other = scores.x.get(base) if base not in (None, arm) else None
        paired = sorted(set(own) & set(other)) if other is not None else []
        if paired:
            d = diff_error(stack(own, paired), stack(other, paired), **opts)
            seed_ci = paired_test(
                {s: float(own[s].mean()) for s in paired}, {s: float(other[s].mean()) for s in paired}
            )
            aux.update(prompt_lo=d.lo, prompt_hi=d.hi, both_lo=d.two_lo, both_hi=d.two_hi)
            aux.update(seed_lo=seed_ci.diff.lo, seed_hi=seed_ci.diff.hi)
            values[5:] = [d.diff, d.hi - d.lo, seed_ci.diff.hi - seed_ci.diff.lo, d.two_hi - d.two_lo]
            display[5:] = [
                f"{d.diff:+.3f} ({d.seeds} paired)",
                _interval(d.lo, d.hi, True),
                _interval(seed_ci.diff.lo, seed_ci.diff.hi, True) if seed_ci.diff.has_interval else "– (1 seed)",
                _interval(d.two_lo, d.two_hi, True),
            ]
        elif base not in (None, arm):
            display[5] = f"– ({base}: no per-prompt results)" if other is None else "– (no common seed)"
        yield arm, values, display, aux


def eval_error_table(
    data: ExperimentData,
    baseline: Baseline | Mapping | None = None,
    n_boot: int = N_BOOT,
    seed: int = SEED,
    max_evals: int = 3,
    reader: Reader | None = None,
) -> Table:
    """Rows (evaluation set, method); columns ``COLUMNS`` (module docstring). ``reader(run_id, step)`` gives a
    run's per-prompt artifact (default: ``data.load_info["per_prompt"]`` for runs built in memory, else from the
    store ``data.load_info["tracking_uri"]``)."""
    evals = list(eval_metrics(data.metric_names()).items())[:max_evals]
    if not evals:
        raise SkipItem("no run logs an evaluation (val-core/<data>/acc/mean_at_<n>)")
    held, uri = data.load_info.get("per_prompt"), data.load_info.get("tracking_uri")
    if reader is None and held is not None:  # built in memory (analysis.synthetic): the results come with the runs
        reader = lambda run_id, step: held.get((run_id, step))  # noqa: E731
    if reader is None and not uri:
        raise SkipItem(f"{NOT_LOGGED}; these runs were not loaded from a tracking store")
    reader = reader or mlflow_reader(uri)
    cache: dict = {}
    loaded = [(name, metric, load_prompt_scores(data, name, metric, reader, cache)) for name, metric in evals]
    loaded = [item for item in loaded if item[2].x]
    if not loaded:
        raise SkipItem(NOT_LOGGED)
    arms = arm_table(data)
    bases, notes = baselines_or_first(arms, make_baseline(baseline))
    order = ordered_arms(arms, bases)
    opts = dict(n_boot=n_boot, seed=seed, level=LEVEL)
    index, value_rows, display_rows, aux_rows = [], [], [], []
    for name, _metric, scores in loaded:
        label = final_eval_label(scores.steps, f"{name} pass@1")
        for arm, values, display, aux in _rows(scores, bases, order, opts):
            index.append((label, arm))
            value_rows.append(values)
            display_rows.append(display)
            aux_rows.append(aux)
        if scores.missing:
            notes.append(
                f"{name}: {scores.missing} of {scores.runs} runs have no per-prompt results of their "
                "final evaluation (older runs, the verl backend): left out"
            )
        notes += [f"{name}: {n}" for n in scores.notes]
    idx = pd.MultiIndex.from_tuples(index, names=["metric", "Method"])
    values = pd.DataFrame(value_rows, index=idx, columns=pd.Index(COLUMNS), dtype=object)
    display = pd.DataFrame(display_rows, index=idx, columns=values.columns)
    aux = {k: pd.DataFrame({"value": [row[k] for row in aux_rows]}, index=idx) for k in AUX}
    first = loaded[0][2]
    return Table(
        key="eval_error",
        title="Evaluation sampling error: prompts resampled, paired across methods",
        caption=(
            f"Each run's final evaluation ({steps_text(s for _, _, sc in loaded for s in sc.steps)}, its last) on "
            f"{len(first.keys)} prompts × {_n_text(first)} samples (per evaluation set: the 'prompts × samples' "
            f"column). pass@1: mean over seeds of each run's mean over prompts. Eval-sampling 95% CI: percentile "
            f"bootstrap ({n_boot} draws) resampling the prompts, the same draw for every seed, seeds fixed: the "
            "error of evaluating on a finite prompt set. Δ = method − baseline on the seeds both ran (paired by "
            "seed). Prompts (paired): bootstrap resampling each prompt jointly for both methods, seeds fixed. "
            "Seeds: the comparison table's 95% t interval over the paired seeds, prompts fixed. Seeds and prompts: "
            "two-level bootstrap, the paired seeds resampled, then the prompts: the combined uncertainty. "
            + make_baseline(baseline).describe().capitalize()
            + "."
        ),
        values=values,
        display=display,
        notes=notes,
        aux=aux,
    )
