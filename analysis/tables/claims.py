"""The report section that checks the papers' claims on the sweep's runs (``analysis.claims``).

One row per check and one "claim" row per claim with its overall verdict: the runs involved, the
per-seed statistic, its mean and 95% t interval over seeds (n), the verdict rule and the verdict
(pass / fail / inconclusive / not checked). Notes carry what a check needs and lacks, and details
such as the T-PPO phase breakdown.

    from analysis.tables.claims import claims_table
    claims_table(data, claims=["tppo_time"])
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from analysis.claims import NOT_CHECKED, check_claims
from analysis.frames import ExperimentData
from analysis.skip import SkipItem
from analysis.tables.base import MISSING, Table

ALL_CLAIMS = ("troll_kl_bound", "trm_length", "repo_r_entropy", "gtpo_conflict", "adapo_eps_high", "tppo_time")
COLUMNS = ["runs", "per-seed statistic", "mean [95% CI]", "rule", "verdict"]


def claims_table(
    data: ExperimentData,
    claims: list[str] | tuple[str, ...] = ALL_CLAIMS,
    options: Mapping[str, Mapping] | None = None,
    show_unchecked: bool = True,
) -> Table:
    """Rows (claim, check); ``show_unchecked=False`` drops claims no run of the sweep can check."""
    outcomes = check_claims(data, list(claims), options)
    if not show_unchecked:
        outcomes = [o for o in outcomes if o.verdict != NOT_CHECKED]
    if not outcomes:
        raise SkipItem("no run of this sweep is covered by a paper claim")
    rows, cells, classes, notes, means = [], [], [], [], []
    for o in outcomes:
        name = f"{o.claim.title} ({o.claim.paper})"
        rows.append((name, "claim: " + o.claim.statement))
        cells.append(["", "", "", "all counted checks pass", o.verdict])
        classes.append(["", "", "", "", f"verdict-{o.verdict.replace(' ', '-')}"])
        means.append(float("nan"))
        for c in o.checks:
            rows.append((name, c.part))
            ci = c.ci.text(3) if c.ci is not None else MISSING
            cells.append([c.runs, c.statistic, ci, c.rule.describe() if c.rule else MISSING, c.verdict])
            classes.append(["", "", "", "", f"verdict-{c.verdict.replace(' ', '-')}"])
            means.append(c.ci.mean if c.ci is not None else float("nan"))
            if c.note:
                notes.append(f"{o.claim.title}, {c.part} ({c.runs}): {c.note}")
    index = pd.MultiIndex.from_tuples(rows, names=["Claim", "Check"])
    display = pd.DataFrame(cells, index=index, columns=pd.Index(COLUMNS))
    values = display.copy()
    values["mean [95% CI]"] = means
    return Table(
        key="claims",
        title="The papers' claims, checked on these runs",
        caption=(
            "Each check reduces every seed to one number (comparisons: paired by seed) and takes the 95% t interval over "
            "seeds. greater: pass if the interval lies above the null, fail if below it or inside null ± margin (effect "
            "absent); less mirrors it; within: pass inside the band, fail outside; differs: pass if the interval excludes "
            "the null, fail inside the band; one seed: inconclusive. A claim passes when all its counted checks pass, "
            "fails when one fails, and is inconclusive otherwise; 'not checked' names what is missing. Ratios use a t "
            "interval on the log scale (geometric mean)."
        ),
        values=values,
        display=display,
        notes=notes,
        cell_classes=pd.DataFrame(classes, index=index, columns=display.columns),
    )
