"""The papers' published numbers beside ours wherever an arm of a sweep ran a paper table's setting.

For a sweep without a dedicated paper report (the generic report): every arm whose model,
method, objective, evaluation set (and training data where the paper names it) match a row of a paper table
(``analysis.paper_match``, which documents the keys of each table) gets a row per matched paper cell.

Ours: each run's final evaluation (its last logged evaluation of the matched metric, ``final_evals`` as in
every table), runs of one arm and seed averaged, then mean ± std over seeds (ddof 1), with the step(s) it was
taken at. Paper: the published number (mean ± std where the paper gives a std), printed as the paper prints
it (the ``paper`` column: italic, as in every paper table).

    from analysis.tables.paper_match import paper_numbers_table
    paper_numbers_table(data)            # SkipItem when no arm ran a paper's setting
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.aggregate import final_evals, steps_text
from analysis.frames import ExperimentData
from analysis.paper_match import LOOKED_FOR, paper_matches, unmatched_arms
from analysis.skip import SkipItem
from analysis.tables.base import MISSING, Table, fmt_mean_std, fmt_num
from analysis.tables.common import seed_cell
from runners import metric_names

COLUMNS = [("score", "ours"), ("score", "paper"), ("seeds", "ours"), ("evaluated at", "ours")]
INDEX = ["Arm", "Evaluation", "Paper table", "Paper setting"]


def _ours(finals: pd.DataFrame, run_ids: tuple[str, ...]) -> tuple[float, float, str, int, str, float]:
    """(mean, std, display, seeds, steps text, last step) of one arm's final evaluations."""
    sel = finals[finals["run_id"].astype(str).isin(run_ids) & np.isfinite(finals["value"].to_numpy(dtype=float))]
    per_seed = sel.groupby(metric_names.TAG_SEED)["value"].mean()
    mean, std, text = seed_cell(per_seed.to_numpy(), digits=3)
    return mean, std, text, len(per_seed), steps_text(sel["step"]), float(sel["step"].max())


def _setting(match) -> str:
    """The keys of a ``paper_matches`` row, e.g. "Qwen3-8B, GRPO, TROLL, DAPO Eval"."""
    parts = (getattr(match, k) for k in ("model", "method", "objective", "benchmark"))
    return ", ".join(p for p in parts if isinstance(p, str) and p)


def _paper_text(value: float, std: float, digits: int) -> str:
    return fmt_mean_std(value, std, digits) if np.isfinite(std) else fmt_num(value, digits)


def _by_text(matches: pd.DataFrame, column: str) -> str:
    """One "<titles>: <text>" per distinct text of ``column`` (the tables sharing a text named together)."""
    groups: dict[str, list[str]] = {}
    for title, text in dict.fromkeys(zip(matches["title"], matches[column])):
        groups.setdefault(text, []).append(title)
    return "; ".join(f"{' and '.join(titles)}: {text}" for text, titles in groups.items())


def paper_numbers_table(data: ExperimentData, tables: list[str] | tuple[str, ...] | None = None) -> Table:
    """Rows: (arm, our evaluation metric, paper table, paper setting); columns: ours and the paper's score,
    our seeds and the step of our final evaluation. ``tables`` restricts the paper tables looked at."""
    matches = paper_matches(data, tables)
    if matches.empty:
        raise SkipItem(
            f"no arm's model, method, objective and evaluation set match a row of the papers' tables ({LOOKED_FOR})"
        )
    finals = {m: final_evals(data, m) for m in set(matches["metric"])}
    index = pd.MultiIndex.from_tuples(
        [(m.arm, m.metric, m.title, _setting(m)) for m in matches.itertuples(index=False)], names=INDEX
    )
    columns = pd.MultiIndex.from_tuples(COLUMNS, names=["", "source"])
    values = pd.DataFrame(np.nan, index=index, columns=columns)
    std = values.copy()
    display = pd.DataFrame(MISSING, index=index, columns=columns)
    steps = []
    for i, m in enumerate(matches.itertuples(index=False)):
        mean, sd, text, seeds, at, last = _ours(finals[m.metric], m.run_ids)
        values.iloc[i] = [mean, m.value, seeds, last]
        std.iloc[i, 0], std.iloc[i, 1] = sd, m.std
        display.iloc[i] = [text, _paper_text(m.value, m.std, m.digits), str(seeds), at]
        steps.append(last)
    notes = [f"arm {a}: its runs differ in model, data or method tags; not matched" for a in unmatched_arms(data)]
    return Table(
        key="paper_numbers",
        title="The papers' numbers for the arms that ran a paper's setting",
        caption=(
            "Arms that ran the setting of a row of a paper table, ours beside the paper's number. Ours: mean ± std over "
            "seeds (ddof 1) of each run's final evaluation, i.e. its last logged evaluation of the row's metric "
            "(val-core/<data>/acc/mean_at_N: pass@1 estimated from N samples per problem), at the step shown "
            f"({steps_text(steps)}). Matched on: the model (the same name as the paper's, never a nearest model), the "
            "method (our preset the paper names, with its own estimator and no added mask, entropy control or rollout "
            "correction), the objective (the preset's own clip, or TROLL's where the paper has a TROLL row), the "
            "evaluation set (named as the paper's benchmark), the training data where the paper names it (DAPO-Math "
            "for TROLL, AppWorld for Entropy-preserving RL Tables 1-2), and rollouts sampled from the current policy "
            f"(no stale or other-precision sampler regime). The paper's number: {_by_text(matches, 'statistic')}. Not "
            f"controlled by the match: our training length (the step shown) against the paper's; "
            f"{_by_text(matches, 'differs')}. Paper: {' '.join(dict.fromkeys(matches['source']))}"
        ),
        values=values,
        display=display,
        notes=notes,
        aux={"std": std},
    )
