"""The stability map: every method against GRPO within each off-policy regime, and how often its runs
become unstable (``metric_names.TAG_REGIME``: "on-policy", "stale k=2", "bfloat16 sampler", ...).

Why: a method that beats GRPO on-policy may lose its edge once the sampler lags the trainer or runs in
another precision; reading that from a handful of seeds needs a rule that says "better", "worse",
"the same within a margin" or "not enough seeds", never a ranking of noise (seed variance of RL for
LLMs: arXiv 2504.07086; aggregate statistics: arXiv 2108.13264).

**Score map** (``score_map``): per (method, regime) arm other than GRPO, its score is each run's final
evaluation (its last evaluation of pass@1, ``analysis.aggregate.final_evals``; each evaluation set is a
task), compared with GRPO of the same regime (``analysis.arms``: model, data set and regime always match):

- IQM of each and their difference with a stratified-bootstrap 95% interval (the method's and GRPO's
  runs resampled independently within each task; arXiv 2108.13264 sections 4.1 and 4.3),
- P(improvement) with its interval (``analysis.aggregates.probability_of_improvement``),
- the paired-by-seed difference (a seed's score: the mean over tasks of its run's final evaluations) and
  its 95% t interval (``analysis.stats.paired_test``), which decides the verdict (``verdict``):

  ``better`` / ``worse``: the paired t interval excludes 0; ``not distinguishable``: it contains 0 and
  lies inside +-``margin`` (an equivalence statement at that margin); ``underpowered``: it contains 0
  but reaches beyond +-``margin``, with the paired seeds a t-test needs for 80% power at alpha 0.05 to
  resolve the observed difference (``stats.seeds_needed``); ``too few seeds``: fewer than 2 paired seeds.
  Each cell is its own 95% interval, not corrected for the number of cells.

**Stability indicators** (``INDICATORS``), each a function of one run's logged series that answers
True, False or None (cannot be evaluated: shown "n/a", never counted as 0), counted per arm as
"k of n seeds" (``stability``): entropy collapse, reward collapse, training-inference gap blow-up,
controller pinned at a cap. Their thresholds are the constants of ``analysis.stability_indicators``,
printed in the captions.

    from analysis.stability import score_map, stability
    smap = score_map(data)          # one row per (method, regime) arm: IQM Δ, P(improvement), paired Δ, verdict
    stab = stability(data)          # one row per arm: "k of n" per indicator
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis import aggregates as agg
from analysis.aggregate import run_series
from analysis.arms import DEFAULT_BASELINE, arm_table, per_seed_final_eval, resolve_baselines, run_labels, run_params
from analysis.frames import ExperimentData
from analysis.names import eval_metrics
from analysis.stability_indicators import (  # noqa: F401  (re-exported: the thresholds the captions and tests read)
    CONTROLLERS,
    ENTROPY_COLLAPSE_FRACTION,
    GAP_FACTOR,
    GAP_FLOOR,
    INDICATORS,
    MIN_POINTS,
    PIN_RTOL,
    REWARD_COLLAPSE_FRACTION,
    REWARD_FLOOR,
    WINDOW_FRACTION,
    Indicator,
    controller_pinned,
    entropy_collapse,
    gap_blowup,
    reward_collapse,
)
from analysis.stats import ALPHA, POWER, paired_test, seeds_needed
from analysis.tables.aggregates import task_scores
from runners import metric_names

# -- verdicts of the score map ---------------------------------------------------------------------
BETTER, WORSE = "better", "worse"
NOT_DISTINGUISHABLE = "not distinguishable"
# every paired seed scored exactly as GRPO's: the method did not act in this regime (e.g. clipping on-policy)
IDENTICAL = "identical to GRPO"
UNDERPOWERED = "underpowered"
TOO_FEW_SEEDS = "too few seeds"
NO_BASELINE = "no GRPO run in this regime"
VERDICTS = (BETTER, WORSE, IDENTICAL, NOT_DISTINGUISHABLE, UNDERPOWERED, TOO_FEW_SEEDS, NO_BASELINE)
DEFAULT_MARGIN = 0.03  # pass@1: differences inside +-0.03 count as "the same"
UNTAGGED = "?"  # regime of runs without a regime tag (``analysis.arms.run_labels``)


def verdict_rule(margin: float = DEFAULT_MARGIN) -> str:
    """The verdict rule in words (the captions print it)."""
    return (
        f"'{BETTER}' / '{WORSE}': the paired 95% t interval of the per-seed difference excludes 0; "
        f"'{NOT_DISTINGUISHABLE}': it contains 0 and lies inside ±{margin:g} pass@1 (equivalent at that margin); "
        f"'{UNDERPOWERED}': it contains 0 but reaches beyond ±{margin:g}, with the paired seeds a paired t-test needs "
        f"for {POWER:.0%} power at alpha {ALPHA} to resolve the observed difference (needs N) and the seeds it has; "
        f"'{TOO_FEW_SEEDS}': fewer than 2 paired seeds; '{IDENTICAL}': every paired seed scored exactly as GRPO "
        "(the method did not act in this regime)"
    )


def verdict(n: int, mean: float, lo: float, hi: float, margin: float = DEFAULT_MARGIN) -> str:
    """The score-map verdict of a paired difference with ``n`` pairs and t interval [lo, hi] (module docstring)."""
    if n < 2 or not (np.isfinite(lo) and np.isfinite(hi)):
        return TOO_FEW_SEEDS
    if lo > 0 or hi < 0:
        return BETTER if mean > 0 else WORSE
    if -margin <= lo and hi <= margin:
        return NOT_DISTINGUISHABLE
    return UNDERPOWERED


def regime_order(regimes) -> list[str]:
    """On-policy first, then the other regimes sorted by name (untagged runs last)."""
    regimes = {str(r) for r in regimes}
    return sorted(regimes, key=lambda r: (r != "on-policy", r == UNTAGGED, r))


SCORE_COLUMNS = [
    "method", "regime", "baseline", "runs", "baseline runs", "iqm", "iqm_base", "iqm_diff", "iqm_diff_lo",
    "iqm_diff_hi", "poi", "poi_lo", "poi_hi", "pairs", "diff", "diff_lo", "diff_hi", "diff_sd", "verdict",
    "seeds_needed",
]  # fmt: skip


def _seed_scores(data: ExperimentData, labels: pd.DataFrame, metrics: list[str]) -> dict[str, dict[int, float]]:
    """{arm: {seed: mean over the evaluation sets of the final evaluations}} (seeds with every set only)."""
    per_metric = [per_seed_final_eval(data, m, labels=labels)[0] for m in metrics]
    out: dict[str, dict[int, float]] = {}
    for arm in set().union(*per_metric) if per_metric else ():
        seeds = set.intersection(*(set(v.get(arm, {})) for v in per_metric))
        out[arm] = {s: float(np.mean([v[arm][s] for v in per_metric])) for s in sorted(seeds)}
    return out


def iqm_difference(
    x: list[np.ndarray],
    y: list[np.ndarray],
    reps: int = agg.DEFAULT_REPS,
    level: float = agg.DEFAULT_LEVEL,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(IQM(x) − IQM(y), lower, upper): the difference and its stratified-bootstrap percentile interval, x's
    runs resampled with stream ``seed`` and y's, independently, with ``seed + 1`` (per task; arXiv 2108.13264 s4.1)."""
    boot = agg.bootstrap_stats(x, agg.iqm, reps, seed) - agg.bootstrap_stats(y, agg.iqm, reps, seed + 1)
    lo, hi = agg.percentile_interval(boot, level)
    return agg.iqm(x) - agg.iqm(y), lo, hi


def score_map(
    data: ExperimentData, margin: float = DEFAULT_MARGIN, reps: int = agg.DEFAULT_REPS, seed: int = 0
) -> pd.DataFrame:
    """One row per (method, regime) arm other than GRPO (index: arm; columns ``SCORE_COLUMNS``); empty
    when no run logs an evaluation. Sorted by method, then regime (``regime_order``)."""
    scores, tasks, _ = task_scores(data)
    metrics = list(eval_metrics(data.metric_names()).values())
    if not tasks:
        return pd.DataFrame(columns=SCORE_COLUMNS)
    labels = run_labels(data)
    arms = arm_table(data)
    bases = resolve_baselines(arms, DEFAULT_BASELINE)
    per_seed = _seed_scores(data, labels, metrics)
    rows = {}
    for arm in arms.index:
        base = bases.get(arm)
        if base == arm or arm not in scores:
            continue
        method, regime = str(arms.at[arm, metric_names.TAG_METHOD]), str(arms.at[arm, metric_names.TAG_REGIME])
        own = scores[arm]
        row = dict.fromkeys(SCORE_COLUMNS, np.nan)
        row.update(method=method, regime=regime, baseline=base, runs=max(len(v) for v in own.values()))
        row["iqm"] = agg.iqm(list(own.values()))
        shared = [t for t in own if base is not None and t in scores.get(base, {})]
        if not shared:
            row.update(verdict=NO_BASELINE, pairs=0, seeds_needed=None, baseline="–")
            rows[arm] = row
            continue
        x, y = [own[t] for t in shared], [scores[base][t] for t in shared]
        row["baseline runs"] = max(len(v) for v in y)
        row["iqm_base"] = agg.iqm(y)
        row["iqm_diff"], row["iqm_diff_lo"], row["iqm_diff_hi"] = iqm_difference(x, y, reps, seed=seed)
        row["poi"], row["poi_lo"], row["poi_hi"] = agg.probability_of_improvement(x, y, reps, seed=seed)
        test = paired_test(per_seed.get(arm, {}), per_seed.get(base, {}))
        d = test.diff
        row.update(pairs=test.n, diff=d.mean, diff_lo=d.lo, diff_hi=d.hi, diff_sd=d.std)
        row["verdict"] = verdict(test.n, d.mean, d.lo, d.hi, margin)
        if test.n >= 2 and d.mean == 0 and d.std == 0:
            row["verdict"] = IDENTICAL
        row["seeds_needed"] = seeds_needed(d.mean, d.std) if row["verdict"] == UNDERPOWERED else None
        rows[arm] = row
    out = pd.DataFrame.from_dict(rows, orient="index", columns=SCORE_COLUMNS)
    order = {r: i for i, r in enumerate(regime_order(out["regime"]))}
    out = out.assign(_r=out["regime"].map(order)).sort_values(["method", "_r"]).drop(columns="_r")
    out.index.name = "arm"
    return out


# -- stability indicators ------------------------------------------------------------------------
def _float(value: object) -> float | None:
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return x if np.isfinite(x) else None


def run_indicators(data: ExperimentData) -> pd.DataFrame:
    """One row per run: run_id, arm, method, regime, seed and each indicator's True / False / None (n/a)."""
    labels = run_labels(data)
    series = {
        key: run_series(data, metric)
        for key, metric in (
            ("entropy", metric_names.ENTROPY),
            ("reward", metric_names.SCORE_MEAN),
            ("gap", metric_names.ROLLOUT_CORR_KL),
        )
    }
    controller_series = {ctl: run_series(data, spec[0]) for ctl, spec in CONTROLLERS.items()}
    caps = {ctl: (run_params(data, spec[1]), run_params(data, spec[2])) for ctl, spec in CONTROLLERS.items()}
    fns: dict[str, Callable] = {"entropy": entropy_collapse, "reward": reward_collapse, "gap": gap_blowup}
    rows = []
    for _, lab in labels.iterrows():
        rid = str(lab["run_id"])
        row = {"run_id": rid, "arm": lab["arm"], "method": lab[metric_names.TAG_METHOD]}
        row.update(regime=lab[metric_names.TAG_REGIME], seed=int(lab[metric_names.TAG_SEED]))
        for key, fn in fns.items():
            row[key] = fn(series[key].get(rid))
        ctl = lab[metric_names.TAG_ENTROPY_CONTROL]
        ctl = ctl if ctl in CONTROLLERS else lab[metric_names.TAG_ALGORITHM]
        if ctl in CONTROLLERS:
            lo, hi = (_float(c.get(rid)) for c in caps[ctl])
            row["pinned"] = controller_pinned(controller_series[ctl].get(rid), lo, hi)
        else:
            row["pinned"] = None
        rows.append(row)
    return pd.DataFrame(rows, columns=["run_id", "arm", "method", "regime", "seed", *(i.key for i in INDICATORS)])


def stability(data: ExperimentData) -> pd.DataFrame:
    """One row per arm (index): method, regime, and per indicator ``<key>_k`` (runs where it fired) and
    ``<key>_n`` (runs where it could be evaluated; 0: n/a), plus ``any_k`` / ``any_n`` (runs with at least
    one indicator fired / evaluable) and ``fired`` (the letters of the indicators that fired in any run)."""
    runs = run_indicators(data)
    rows = {}
    for arm, g in runs.groupby("arm", sort=True):
        row = {"method": g["method"].iloc[0], "regime": g["regime"].iloc[0], "runs": len(g)}
        known = np.zeros(len(g), dtype=bool)
        fired = np.zeros(len(g), dtype=bool)
        letters = ""
        for ind in INDICATORS:
            col = g[ind.key]
            ok = col.notna().to_numpy()
            hit = np.array([v is True for v in col])
            row[f"{ind.key}_k"], row[f"{ind.key}_n"] = int(hit.sum()), int(ok.sum())
            known |= ok
            fired |= hit
            letters += ind.letter if hit.any() else ""
        row.update(any_k=int(fired.sum()), any_n=int(known.sum()), fired=letters)
        rows[arm] = row
    out = pd.DataFrame.from_dict(rows, orient="index")
    if len(out):
        order = {r: i for i, r in enumerate(regime_order(out["regime"]))}
        out = out.assign(_r=out["regime"].map(order)).sort_values(["method", "_r"]).drop(columns="_r")
    out.index.name = "arm"
    return out


def k_of_n(k: int, n: int) -> str:
    """'2 of 5' (runs where an indicator fired, of those where it could be evaluated); 'n/a' for none."""
    return "n/a" if n == 0 else f"{k} of {n}"


# -- claims per regime ----------------------------------------------------------------------------
@dataclass(frozen=True)
class RegimeClaim:
    key: str
    statement: str
    select: Callable[[pd.Series], bool]  # a score-map arm's tags -> is it the claim's method


def _tag(arms: pd.DataFrame, arm: str, tag: str) -> str:
    return str(arms.at[arm, tag]) if arm in arms.index else ""


REGIME_CLAIMS = (
    RegimeClaim("trm_max", "TRM-Max (arXiv 2512.23075) beats Clip (GRPO)",
                lambda t: t[metric_names.TAG_MASK] == "trm_max" and t[metric_names.TAG_ALGORITHM] == "grpo"),
    RegimeClaim("ser", "SER beats Clip (GRPO)",
                lambda t: t[metric_names.TAG_MASK] == "ser" and t[metric_names.TAG_ALGORITHM] == "grpo"),
    RegimeClaim("troll", "TROLL (arXiv 2510.03817) keeps its edge over GRPO",
                lambda t: str(t[metric_names.TAG_OBJECTIVE]).startswith("troll") and t[metric_names.TAG_ALGORITHM] == "grpo"),
)  # fmt: skip


def regime_claims(
    data: ExperimentData, smap: pd.DataFrame | None = None, margin: float = DEFAULT_MARGIN
) -> pd.DataFrame:
    """Rows of the score map that answer each claim of ``REGIME_CLAIMS``, one per (regime, claim) with a
    method: columns regime, claim, statement, arm and the score map's columns."""
    smap = score_map(data, margin) if smap is None else smap
    arms = arm_table(data)
    rows = []
    for claim in REGIME_CLAIMS:
        for arm, row in smap.iterrows():
            if arm in arms.index and claim.select(arms.loc[arm]):
                rows.append(
                    {"regime": row["regime"], "claim": claim.key, "statement": claim.statement, "arm": arm, **row}
                )
    out = pd.DataFrame(rows)
    if len(out):
        order = {r: i for i, r in enumerate(regime_order(out["regime"]))}
        keys = {c.key: i for i, c in enumerate(REGIME_CLAIMS)}
        out = out.assign(_r=out["regime"].map(order), _c=out["claim"].map(keys)).sort_values(["_r", "_c", "arm"])
        out = out.drop(columns=["_r", "_c"]).reset_index(drop=True)
    return out


def regime_data(data: ExperimentData) -> dict[str, ExperimentData]:
    """{regime: the runs of that regime} (``regime_order``; runs without a regime tag under ``UNTAGGED``)."""
    labels = run_labels(data)
    return {
        r: data.subset(labels.loc[labels[metric_names.TAG_REGIME] == r, "run_id"])
        for r in regime_order(labels[metric_names.TAG_REGIME])
    }
