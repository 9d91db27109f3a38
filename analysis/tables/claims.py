"""The report section that checks the papers' claims on the sweep's runs (``analysis.claims``).

One "claim" row per claim (the paper's words, its overall verdict) and one row per check: the runs
involved, the per-seed statistic, its mean and 95% t interval over seeds (n), the same statistic on the
baseline where the check is on one method's own numbers, the rule and the verdict (supported /
contradicted / underpowered (needs N seeds) / not evidence / not checked; rows that are shown and not
counted say "shown" or "pinned at a cap"). Notes carry what a check needs and lacks, and details such
as the T-PPO phase breakdown.

    from analysis.tables.claims import claims_table
    claims_table(data, claims=["tppo_time"])
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from analysis.claim_keys import ALL_CLAIMS
from analysis.claims import NOT_CHECKED, check_claims
from analysis.frames import ExperimentData
from analysis.skip import SkipItem
from analysis.tables.base import MISSING, Table

COLUMNS = ["runs", "per-seed statistic", "mean [95% CI]", "baseline [95% CI]", "rule", "verdict"]


def verdict_class(verdict: str) -> str:
    return "verdict-" + verdict.replace(" ", "-")


def claims_table(
    data: ExperimentData,
    claims: list[str] | tuple[str, ...] = ALL_CLAIMS,
    options: Mapping[str, Mapping] | None = None,
    show_unchecked: bool = True,
) -> Table:
    """Rows (claim, check); ``show_unchecked=False`` drops the claims of methods the sweep did not run (a
    claim whose method ran but whose baseline or metric is missing stays, saying what is missing)."""
    outcomes = check_claims(data, list(claims), options)
    if not show_unchecked:
        outcomes = [o for o in outcomes if o.verdict != NOT_CHECKED or any(c.runs != MISSING for c in o.checks)]
    if not outcomes:
        raise SkipItem("no run of this sweep is covered by a paper claim")
    rows, cells, classes, notes, means = [], [], [], [], []
    for o in outcomes:
        name = f"{o.claim.title} ({o.claim.paper})"
        rows.append((name, "claim: " + o.claim.statement))
        cells.append(["", "", "", "", "every counted check supported", o.verdict_text])
        classes.append(["", "", "", "", "", verdict_class(o.verdict)])
        means.append(float("nan"))
        for c in o.checks:
            rows.append((name, c.part if c.counts else f"{c.part} (not counted)"))
            ci = c.ci.text(3) if c.ci is not None else MISSING
            base = (
                f"{c.baseline_runs}: {c.baseline_ci.text(3)}, {c.baseline_verdict}"
                if c.baseline_ci is not None
                else MISSING
            )
            cells.append([c.runs, c.statistic, ci, base, c.rule.describe() if c.rule else MISSING, c.verdict_text])
            classes.append(["", "", "", "", "", verdict_class(c.verdict)])
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
            "Each claim is quoted from its paper and checked with the paper's own metric; 'final' is each run's last "
            "evaluation. A check reduces every seed to one number (comparisons: paired by seed) and takes the 95% t "
            "interval over seeds; the rule states only the direction the paper claims, against a null from the paper "
            "(0 for a difference). supported: the interval is on the claimed side; contradicted: on the other side; "
            "underpowered: it contains the null, with the seeds a paired t-test (alpha 0.05, power 0.8) needs if the true "
            "effect were the observed one; not evidence: the baseline, run through the same check, is supported too. "
            "A claim is contradicted if a counted check is, underpowered if one is, not evidence if one is, supported "
            "if all are. 'not checked' names what is missing. Ratios use a t interval on the log scale (geometric mean)."
        ),
        values=values,
        display=display,
        notes=notes,
        cell_classes=pd.DataFrame(classes, index=index, columns=display.columns),
    )
