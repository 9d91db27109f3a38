"""Tables of the stability map (``analysis.stability``): the score map (each method against GRPO within each
off-policy regime, with its verdict), the stability indicators ("k of n seeds" per arm), and the claims read
per regime (the score map's TRM-Max / SER / TROLL rows and the papers' registered claims on each regime's runs).

    from analysis.tables.stability import score_map_table, stability_table, regime_claims_table
    score_map_table(data, margin=0.03)
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis import aggregates as agg
from analysis import stability as st
from analysis.claims import NOT_CHECKED, check_claims
from analysis.frames import ExperimentData
from analysis.skip import SkipItem
from analysis.stats import seeds_text
from analysis.tables.base import MISSING, Table
from analysis.tables.claims import ALL_CLAIMS, verdict_class
from runners import metric_names

SCORE_COLUMNS = [
    "runs (GRPO)", "IQM", "IQM GRPO", "Δ IQM [95% CI]", "P(improvement) [95% CI]", "paired seeds",
    "paired Δ [95% t CI]", "verdict",
]  # fmt: skip


def _ci(est: float, lo: float, hi: float, signed: bool = True) -> str:
    if not np.isfinite(est):
        return MISSING
    f = "{:+.3f}" if signed else "{:.3f}"
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return f.format(est) + " (no CI)"
    return f"{f.format(est)} [{f.format(lo)}, {f.format(hi)}]"


def verdict_text(row: pd.Series) -> str:
    """The verdict cell: 'better', 'underpowered: needs 12 seeds (has 3)', ..."""
    v = row["verdict"]
    if v == st.UNDERPOWERED:
        need = row["seeds_needed"]
        need = None if need is None or not np.isfinite(need) else int(need)
        return f"{v}: needs {seeds_text(need, int(row['pairs']))} seeds (has {int(row['pairs'])})"
    return str(v)


def _require_map(data: ExperimentData, margin: float, reps: int) -> pd.DataFrame:
    smap = st.score_map(data, margin, reps)
    if not len(smap):
        raise SkipItem("no run logs a final evaluation (val-core/<data>/acc/mean_at_<n>) besides GRPO's")
    return smap


def score_caption(margin: float, reps: int) -> str:
    return (
        "Each (method, regime) against GRPO of the same regime (same model and data set). Score: each run's final "
        "evaluation (its last evaluation of pass@1; several evaluation sets are tasks). IQM: mean of the middle 50% "
        "of all runs' scores pooled over tasks; Δ IQM and P(improvement) (a method's run above a GRPO run, ties "
        f"one half) with {agg.DEFAULT_LEVEL:.0%} stratified-bootstrap intervals ({reps} resamples, the method's and "
        "GRPO's runs resampled independently; Agarwal et al., arXiv 2108.13264, sections 4.1 and 4.3). Paired Δ: "
        "the method minus GRPO on the seeds both ran (a seed's score: mean over tasks), 95% t interval. Verdict, "
        f"from the paired interval: {st.verdict_rule(margin)}. Each cell is its own 95% interval, not corrected "
        "for the number of cells: over many cells a few 'better'/'worse' arise by chance. Seed counts follow the "
        "seed-variance warning of arXiv 2504.07086."
    )


def score_map_table(data: ExperimentData, margin: float = st.DEFAULT_MARGIN, reps: int = agg.DEFAULT_REPS) -> Table:
    """Rows (method, regime); columns ``SCORE_COLUMNS``."""
    smap = _require_map(data, margin, reps)
    index = pd.MultiIndex.from_arrays([smap["method"], smap["regime"]], names=["Method", "Regime"])
    values = pd.DataFrame(np.nan, index=index, columns=pd.Index(SCORE_COLUMNS), dtype=object)
    display = pd.DataFrame(MISSING, index=index, columns=values.columns)
    classes = pd.DataFrame("", index=index, columns=values.columns)
    for i, (_, r) in enumerate(smap.iterrows()):
        base_runs = "–" if not np.isfinite(r["baseline runs"]) else str(int(r["baseline runs"]))
        values.iloc[i] = [
            r["runs"],
            r["iqm"],
            r["iqm_base"],
            r["iqm_diff"],
            r["poi"],
            r["pairs"],
            r["diff"],
            r["verdict"],
        ]
        display.iloc[i] = [
            f"{int(r['runs'])} ({base_runs})",
            _ci(r["iqm"], np.nan, np.nan, False).replace(" (no CI)", ""),
            _ci(r["iqm_base"], np.nan, np.nan, False).replace(" (no CI)", ""),
            _ci(r["iqm_diff"], r["iqm_diff_lo"], r["iqm_diff_hi"]),
            _ci(r["poi"], r["poi_lo"], r["poi_hi"], False),
            str(int(r["pairs"])),
            _ci(r["diff"], r["diff_lo"], r["diff_hi"]),
            verdict_text(r),
        ]
        classes.iloc[i, -1] = f"verdict-{str(r['verdict']).replace(' ', '-')}"
    notes = []
    if smap["regime"].nunique() == 1:
        notes.append(f"one regime only ({smap['regime'].iloc[0]}): the map has a single column")
    return Table(
        key="score_map",
        title="Score map: each method against GRPO within each off-policy regime",
        caption=score_caption(margin, reps),
        values=values,
        display=display,
        notes=notes,
        cell_classes=classes,
    )


def stability_caption() -> str:
    rules = "; ".join(f"{i.letter} = {i.name}: {i.rule}" for i in st.INDICATORS)
    return (
        "Per arm, runs (seeds) in which each instability indicator fired, of the runs where it could be evaluated "
        f"('n/a': none could). Windows are a quarter of the run's logged points (at least {st.MIN_POINTS} points). "
        f"{rules}. 'any': runs with at least one indicator fired, of the runs where at least one could be evaluated."
    )


def stability_table(data: ExperimentData) -> Table:
    """Rows (method, regime); one "k of n" column per indicator and "any"."""
    stab = st.stability(data)
    if not len(stab):
        raise SkipItem("no runs")
    cols = [i.name for i in st.INDICATORS] + ["any"]
    index = pd.MultiIndex.from_arrays([stab["method"], stab["regime"]], names=["Method", "Regime"])
    keys = [i.key for i in st.INDICATORS] + ["any"]
    values = pd.DataFrame(
        [[r[f"{k}_k"] / r[f"{k}_n"] if r[f"{k}_n"] else np.nan for k in keys] for _, r in stab.iterrows()],
        index=index,
        columns=pd.Index(cols),
    )
    display = pd.DataFrame(
        [[st.k_of_n(int(r[f"{k}_k"]), int(r[f"{k}_n"])) for k in keys] for _, r in stab.iterrows()],
        index=index,
        columns=values.columns,
    )
    return Table(
        key="stability",
        title="Stability indicators per method and regime (runs in which each fired)",
        caption=stability_caption(),
        values=values,
        display=display,
    )


CLAIM_COLUMNS = ["runs", "Δ IQM vs GRPO [95% CI]", "paired Δ [95% t CI]", "verdict"]


def regime_claims_table(
    data: ExperimentData,
    margin: float = st.DEFAULT_MARGIN,
    reps: int = agg.DEFAULT_REPS,
    claims: tuple[str, ...] = ALL_CLAIMS,
) -> Table:
    """Rows (regime, claim): the score map's answer to each ``REGIME_CLAIMS`` entry, then the verdict of each
    registered paper claim (``analysis.claims``) checked on that regime's runs alone."""
    smap = _require_map(data, margin, reps)
    answers = st.regime_claims(data, smap, margin)
    rows, cells, classes = [], [], []
    # a regime's own runs are only needed to check the paper claims on them
    answered = st.regime_order(answers["regime"]) if len(answers) else []
    by_regime = st.regime_data(data) if claims else dict.fromkeys(answered)
    for regime, subset in by_regime.items():
        for claim in st.REGIME_CLAIMS:
            hits = answers[(answers["regime"] == regime) & (answers["claim"] == claim.key)] if len(answers) else answers
            for _, r in hits.iterrows():
                rows.append((regime, f"{claim.statement}: {r['method']}"))
                cells.append(
                    [r["method"], _ci(r["iqm_diff"], r["iqm_diff_lo"], r["iqm_diff_hi"]),
                     _ci(r["diff"], r["diff_lo"], r["diff_hi"]), verdict_text(r)]
                )  # fmt: skip
                classes.append(["", "", "", f"verdict-{str(r['verdict']).replace(' ', '-')}"])
        for outcome in check_claims(subset, list(claims)) if claims else ():
            if outcome.verdict == NOT_CHECKED:
                continue
            runs = sorted({c.runs for c in outcome.checks if c.counts and c.runs != "–"})
            rows.append((regime, f"paper claim: {outcome.claim.title} ({outcome.claim.paper})"))
            cells.append(["; ".join(runs) or MISSING, MISSING, MISSING, outcome.verdict_text])
            classes.append(["", "", "", verdict_class(outcome.verdict)])
    if not rows:
        raise SkipItem("no regime has runs")
    index = pd.MultiIndex.from_tuples(rows, names=["Regime", "Claim"])
    display = pd.DataFrame(cells, index=index, columns=pd.Index(CLAIM_COLUMNS))
    notes = [] if len(answers) else ["no TRM-Max, SER or TROLL arm (GRPO-based) in these runs"]
    return Table(
        key="regime_claims",
        title="Claims per off-policy regime",
        caption=(
            "Per regime: where TRM-Max's and SER's advantage over Clip (GRPO) appears, and whether TROLL keeps its edge "
            "over GRPO, read from the score map (Δ IQM with its stratified-bootstrap 95% CI, arXiv 2108.13264; paired "
            f"Δ with its 95% t interval; verdict: {st.verdict_rule(margin)})."
            + (
                " Then each paper claim its runs can check (analysis/claim_checks.py), on that regime's runs alone: "
                "supported / contradicted / underpowered (seeds needed) / not evidence, rules as in the claims table."
                if claims
                else ""
            )
            + " Regimes: the "
            f"'{metric_names.TAG_REGIME}' tag ('{st.UNTAGGED}': runs without one)."
        ),
        values=display.copy(),
        display=display,
        notes=notes,
        cell_classes=pd.DataFrame(classes, index=index, columns=display.columns),
    )
