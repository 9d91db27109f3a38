"""Entropy-preserving RL (arXiv 2603.11682) Tables 1-4: score at the best checkpoint (mean ± std over seeds), best score, entropy change.

Procedure of Entropy-preserving RL (arXiv 2603.11682) appendix C.3, per run:
- best checkpoint = the evaluation step with the highest selection score: the validation split
  (``dev``) when logged (AppWorld tables), else the mean of the two test sets (AIME tables);
- each test set's score at that step -> mean ± std (ddof=1) over seeds;
- "Best" = the highest score of that test set over all seeds and all evaluations;
- ΔH = entropy (``actor/entropy``) at the best checkpoint minus at the first step, absolute and
  relative to the first step, averaged over seeds.
The paper table beside ours is chosen by benchmark (AppWorld test splits -> Tables 1/2, else AIME ->
Tables 3/4) and model (Qwen3-32B -> 2/4, otherwise 1/3).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.aggregate import best_checkpoint, entropy_change, mean_std, run_series, value_at
from analysis.frames import ExperimentData
from analysis.names import algorithm_name, eval_metrics, find_eval, norm
from analysis.paper_data import paper_source, paper_table
from analysis.skip import SkipItem
from analysis.tables.base import MISSING, Table, fmt_change, fmt_mean_std, fmt_num
from runners import metric_names


def _test_sets(names: list[str]) -> tuple[str, list[tuple[str, str]], str | None, list[str]]:
    """(benchmark, [(paper test-set name, metric)], selection metric or None, notes)."""
    normal, challenge = find_eval(names, "test_normal"), find_eval(names, "test_challenge")
    if normal and challenge:
        return "AppWorld", [("Test Normal", normal), ("Test Challenge", challenge)], find_eval(names, "dev"), []
    a24, a25 = find_eval(names, "aime24"), find_eval(names, "aime25")
    if a24 and a25:
        return "AIME", [("AIME 2024", a24), ("AIME 2025", a25)], None, []
    evals = list(eval_metrics(names).values())
    if not evals:
        raise SkipItem("no run logs an evaluation metric (val-core/<data>/acc/mean_at_N)")
    picked = evals[:2]
    note = f"no AIME 2024/2025 or AppWorld test splits logged; columns show {', '.join(picked)} beside the paper's AIME columns"
    return "AIME", list(zip(("AIME 2024", "AIME 2025"), picked)), None, [note]


def _run_row(lab, tests, series, sel_series, ent) -> dict | None:
    """One run's scores at its best checkpoint and its entropy change there (None if it lacks evaluations)."""
    rid = lab["run_id"]
    if not all(rid in series[t] for t, _ in tests):
        return None
    chosen = [sel_series[rid]] if sel_series is not None and rid in sel_series else [series[t][rid] for t, _ in tests]
    step = best_checkpoint(chosen)
    if step is None:
        return None
    row = {"label": lab[metric_names.TAG_METHOD], "algorithm": lab[metric_names.TAG_ALGORITHM], "step": step}
    for t, _ in tests:
        row[f"{t}/at_best"] = value_at(series[t][rid], step)
        row[f"{t}/max"] = float(series[t][rid].max())
    dh, rel = entropy_change(ent[rid], step) if rid in ent else (np.nan, np.nan)
    row["dH"], row["dH_rel"] = dh, rel
    return row


def _fill_scores(label, g, prow, tests, values, std, display) -> None:
    """Test-set cells of one algorithm's row: ours (mean ± std, best) beside the paper's."""
    for t, _ in tests:
        mean, sd, _ = mean_std(g[f"{t}/at_best"])
        values.loc[label, (t, "mean ± std", "ours")], std.loc[label, (t, "mean ± std", "ours")] = mean, sd
        display.loc[label, (t, "mean ± std", "ours")] = fmt_mean_std(mean, sd)
        best = float(g[f"{t}/max"].max())
        values.loc[label, (t, "best", "ours")] = best
        display.loc[label, (t, "best", "ours")] = fmt_num(best, 2)
        pm = prow[(prow["test_set"] == t) & (prow["stat"] == "mean")]["value"]
        ps = prow[(prow["test_set"] == t) & (prow["stat"] == "std")]["value"]
        pb = prow[(prow["test_set"] == t) & (prow["stat"] == "best")]["value"]
        if len(pm):
            values.loc[label, (t, "mean ± std", "paper")], std.loc[label, (t, "mean ± std", "paper")] = (
                float(pm.iloc[0]),
                float(ps.iloc[0]),
            )
            display.loc[label, (t, "mean ± std", "paper")] = fmt_mean_std(float(pm.iloc[0]), float(ps.iloc[0]))
        if len(pb):
            values.loc[label, (t, "best", "paper")] = float(pb.iloc[0])
            display.loc[label, (t, "best", "paper")] = fmt_num(float(pb.iloc[0]), 2)


def entropy_table(data: ExperimentData) -> Table:
    names = data.metric_names()
    if metric_names.ENTROPY not in names:
        raise SkipItem(f"no run logs {metric_names.ENTROPY}")
    bench, tests, selection, notes = _test_sets(names)
    labels = data.labels()
    series = {name: run_series(data, metric) for name, metric in tests}
    sel_series = run_series(data, selection) if selection else None
    ent = run_series(data, metric_names.ENTROPY)
    models = labels[metric_names.TAG_MODEL].dropna()
    model = str(models.iloc[0]) if len(models) else "?"
    big = "32b" in norm(model)
    table_no = {"AppWorld": 2 if big else 1, "AIME": 4 if big else 3}[bench]
    if norm(model) not in ("qwen38b", "qwen332b"):
        notes.append(
            f"our model {model} is not in the paper; paper columns show Qwen3-{'32' if big else '8'}B (Table {table_no})"
        )
    paper = paper_table("entropy_tables")
    paper = paper[paper["table"] == table_no]

    per_run = [row for _, lab in labels.iterrows() if (row := _run_row(lab, tests, series, sel_series, ent))]
    if not per_run:
        raise SkipItem("no run has both test-set evaluations")
    runs = pd.DataFrame(per_run)
    groups = list(dict.fromkeys(runs["label"]))
    cols = [(t, stat, src) for t, _ in tests for stat in ("mean ± std", "best") for src in ("ours", "paper")]
    cols += [("ΔH", "", "ours"), ("ΔH", "", "paper")]
    columns = pd.MultiIndex.from_tuples(cols, names=["test set", "statistic", "source"])
    index = pd.Index(groups, name="Algorithm")
    values = pd.DataFrame(np.nan, index=index, columns=columns)
    std = values.copy()
    rel = values.copy()
    display = pd.DataFrame(MISSING, index=index, columns=columns)
    for label in groups:
        g = runs[runs["label"] == label]
        prow = paper[paper["algorithm"] == algorithm_name(g["algorithm"].iloc[0])]
        _fill_scores(label, g, prow, tests, values, std, display)
        dh, dh_rel = float(np.nanmean(g["dH"])), float(np.nanmean(g["dH_rel"]))
        values.loc[label, ("ΔH", "", "ours")], rel.loc[label, ("ΔH", "", "ours")] = dh, dh_rel
        display.loc[label, ("ΔH", "", "ours")] = fmt_change(dh, dh_rel)
        pa = prow[prow["stat"] == "delta_h"]["value"]
        pr = prow[prow["stat"] == "delta_h_rel_pct"]["value"]
        if len(pa):
            values.loc[label, ("ΔH", "", "paper")], rel.loc[label, ("ΔH", "", "paper")] = (
                float(pa.iloc[0]),
                float(pr.iloc[0]) / 100,
            )
            display.loc[label, ("ΔH", "", "paper")] = fmt_change(float(pa.iloc[0]), float(pr.iloc[0]) / 100)
    selection_text = f"the highest {selection}" if selection else "the highest mean of the two test sets"
    return Table(
        key=f"entropy_table{table_no}",
        title=f"Scores at the best checkpoint and entropy change ({bench})",
        caption=(
            f"Reproduces Entropy-preserving RL (arXiv 2603.11682) Table {table_no}. Ours, per run: checkpoint with {selection_text}; "
            "test scores there (mean ± std over seeds, ddof=1), best score over all seeds and evaluations, and "
            f"ΔH = {metric_names.ENTROPY} at that checkpoint minus at the first step (relative change in parentheses, mean over seeds). "
            "Paper: " + paper_source("entropy_tables")
        ),
        values=values,
        display=display,
        reproduces=f"Entropy-preserving RL (arXiv 2603.11682) Table {table_no}",
        notes=notes,
        aux={"std": std, "relative": rel},
    )
