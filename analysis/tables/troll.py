"""TROLL paper tables: Table 1 (final success per estimator, Clip vs TROLL), Table 4 (per MATH
benchmark), Table 5 (memory and runtime overhead), each with the paper's numbers beside ours.

Final values per run: the mean of the last ``last_n_train`` training steps (a smoothed end of the
training curve) and, for evaluations, the run's last evaluation (``analysis.aggregate.final_evals``, as in
every table; the caption names its step); then mean ± std over seeds. Rows are keyed by the run's ``algorithm`` tag (the
estimator preset: grpo, drgrpo, ppo, gspo, rfpp) and the ``objective`` tag (troll -> "TROLL",
anything else -> "Clip"), so "GSPO with TROLL" is algorithm=gspo, objective=troll.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.aggregate import final_evals, per_run, steps_text
from analysis.frames import ExperimentData
from analysis.names import find_eval, paper_method
from analysis.paper_data import paper_source, paper_table
from analysis.skip import SkipItem
from analysis.tables.base import MISSING, Table, fmt_num
from analysis.tables.common import is_troll, objective_column, paper_cell, paper_model, resolve_eval, seed_cell
from analysis.timing import inflation_notes
from runners import metric_names

PAPER_METHODS = ["GRPO", "Dr.GRPO", "PPO", "GSPO", "RF++"]
TABLE1_MODELS = ["Qwen3-8B", "Qwen2.5-7B-Instruct"]
TABLE4_BENCHMARKS = [
    ("aime24", "AIME24"),
    ("aime25", "AIME25"),
    ("amc", "AMC"),
    ("math500", "MATH"),
    ("omni_math", "Omni-Math"),
    ("olympiad", "Olympiad"),
    ("minerva", "Minerva"),
]
TABLE5_MODELS = ["Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-4B"]


def _method_order(name: str) -> tuple[int, str]:
    return (PAPER_METHODS.index(name) if name in PAPER_METHODS else len(PAPER_METHODS), name)


def _with_keys(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.copy()
    frame["Method"] = [
        paper_method(a, m) for a, m in zip(frame[metric_names.TAG_ALGORITHM], frame[metric_names.TAG_METHOD])
    ]
    frame["Objective"] = [objective_column(o) for o in frame[metric_names.TAG_OBJECTIVE]]
    frame["Model"] = frame[metric_names.TAG_MODEL].fillna("?")
    return frame[frame["value"].notna()]


def _table1_ours(frame, cell, values, std, display) -> None:
    """Our mean ± std over seeds for one (model, method) x (split, objective) cell of Table 1."""
    if frame is None:
        return
    (model, method), (split, obj) = cell
    sel = frame[(frame["Model"] == model) & (frame["Method"] == method) & (frame["Objective"] == obj)]["value"]
    if len(sel):
        mean, sd, text = seed_cell(sel)
        values.loc[(model, method), (split, obj, "ours")] = mean
        std.loc[(model, method), (split, obj, "ours")] = sd
        display.loc[(model, method), (split, obj, "ours")] = text


def _table1_paper(paper, pmodel, cell, values, display) -> None:
    """The paper's number for the same cell (its closest model)."""
    (model, method), (split, obj) = cell
    p = paper[
        (paper["model"] == pmodel)
        & (paper["split"] == split)
        & (paper["objective"] == obj)
        & (paper["method"] == method)
    ]
    if len(p):
        x, text = paper_cell(p["value"].iloc[0])
        values.loc[(model, method), (split, obj, "paper")] = x
        display.loc[(model, method), (split, obj, "paper")] = text


def troll_table1(data: ExperimentData, last_n_train: int = 7) -> Table:
    """TROLL (arXiv 2510.03817) Table 1, transposed: rows (model, method); columns split x objective x {ours, paper}."""
    names = data.metric_names()
    labels = data.labels()
    dataset = (
        labels[metric_names.TAG_DATASET].dropna().iloc[0] if labels[metric_names.TAG_DATASET].notna().any() else None
    )
    notes: list[str] = []
    splits = {"DAPO Train": (metric_names.SCORE_MEAN if metric_names.SCORE_MEAN in names else None, last_n_train)}
    for split, canonical in (("DAPO Eval", "dapo_eval"), ("MATH Eval", "math_eval")):
        metric, note = resolve_eval(names, canonical, dataset)
        splits[split] = (metric, None)  # None: each run's last evaluation
        if note:
            notes.append(f"{split}: {note}")
        if metric is None:
            notes.append(f"{split}: no matching val-core/<data>/acc/mean_at_N metric logged")
    if all(m is None for m, _ in splits.values()):
        raise SkipItem(f"no run logs {metric_names.SCORE_MEAN} or an evaluation metric")
    finals, eval_steps = {}, []
    for split, (metric, n) in splits.items():
        if metric is None:
            continue
        if n is None:
            frame = final_evals(data, metric)
            eval_steps.append(f"{split} at {steps_text(frame.loc[frame['value'].notna(), 'step'])}")
        else:
            frame = per_run(data, metric, "final", n)
        finals[split] = _with_keys(frame)
    any_frame = pd.concat(finals.values())
    paper = paper_table("troll_table1")
    rows = sorted(
        {(m, meth) for m, meth in zip(any_frame["Model"], any_frame["Method"])},
        key=lambda r: (r[0], _method_order(r[1])),
    )
    cols = pd.MultiIndex.from_tuples(
        [(s, o, src) for s in splits for o in ("Clip", "TROLL") for src in ("ours", "paper")],
        names=["split", "objective", "source"],
    )
    index = pd.MultiIndex.from_tuples(rows, names=["Model", "Method"])
    values = pd.DataFrame(np.nan, index=index, columns=cols)
    std = values.copy()
    display = pd.DataFrame(MISSING, index=index, columns=cols)
    for model, method in rows:
        pmodel, note = paper_model(model, TABLE1_MODELS, "Qwen3-8B")
        if note and note not in notes:
            notes.append(note)
        for split in splits:
            for obj in ("Clip", "TROLL"):
                cell = (model, method), (split, obj)
                _table1_ours(finals.get(split), cell, values, std, display)
                _table1_paper(paper, pmodel, cell, values, display)
    return Table(
        key="troll_table1",
        title="Final train and evaluation success rates, Clip vs TROLL",
        caption=(
            "Reproduces TROLL (arXiv 2510.03817) Table 1 (transposed: methods as rows). Ours: mean ± std over seeds of each run's "
            f"final value (training: mean of the last {last_n_train} training steps; evaluations: the last "
            f"evaluation{' (' + ', '.join(eval_steps) + ')' if eval_steps else ''}). "
            "Paper: " + paper_source("troll_table1")
        ),
        values=values,
        display=display,
        reproduces="TROLL (arXiv 2510.03817) Table 1",
        notes=notes,
        aux={"std": std},
    )


def troll_table4(data: ExperimentData) -> Table:
    """TROLL (arXiv 2510.03817) Table 4: rows (model, method, objective); columns benchmark x {ours, paper}."""
    names = data.metric_names()
    metrics = {label: find_eval(names, key) for key, label in TABLE4_BENCHMARKS}
    if all(m is None for m in metrics.values()):
        raise SkipItem("no run logs an evaluation on AIME24/AIME25/AMC/MATH500/Omni-Math/OlympiadBench/Minerva")
    finals = {label: _with_keys(final_evals(data, m)) for label, m in metrics.items() if m is not None}
    at = steps_text(pd.concat([f["step"] for f in finals.values()]))
    any_frame = pd.concat(finals.values())
    rows = sorted(
        {(a, b, c) for a, b, c in zip(any_frame["Model"], any_frame["Method"], any_frame["Objective"])},
        key=lambda r: (r[0], _method_order(r[1]), r[2]),
    )
    paper = paper_table("troll_table4")
    index = pd.MultiIndex.from_tuples(rows, names=["Model", "Method", "Objective"])
    cols = pd.MultiIndex.from_tuples(
        [(b, s) for _, b in TABLE4_BENCHMARKS for s in ("ours", "paper")], names=["benchmark", "source"]
    )
    values = pd.DataFrame(np.nan, index=index, columns=cols)
    std = values.copy()
    display = pd.DataFrame(MISSING, index=index, columns=cols)
    notes = [f"{b}: not logged" for b, m in metrics.items() if m is None]
    for model, method, obj in rows:
        pmodel, note = paper_model(model, ["Qwen2.5-7B-Instruct", "Qwen3-8B"], "Qwen3-8B")
        if note and note not in notes:
            notes.append(note)
        for _, bench in TABLE4_BENCHMARKS:
            if bench in finals:
                f = finals[bench]
                sel = f[(f["Model"] == model) & (f["Method"] == method) & (f["Objective"] == obj)]["value"]
                if len(sel):
                    mean, sd, text = seed_cell(sel)
                    values.loc[(model, method, obj), (bench, "ours")] = mean
                    std.loc[(model, method, obj), (bench, "ours")] = sd
                    display.loc[(model, method, obj), (bench, "ours")] = text
            p = paper[
                (paper["model"] == pmodel)
                & (paper["method"] == method)
                & (paper["objective"] == obj)
                & (paper["benchmark"] == bench)
            ]
            if len(p):
                (
                    values.loc[(model, method, obj), (bench, "paper")],
                    display.loc[(model, method, obj), (bench, "paper")],
                ) = paper_cell(p["value"].iloc[0])
    return Table(
        key="troll_table4",
        title="Success rates on the individual MATH test sets",
        caption=(
            f"Reproduces TROLL (arXiv 2510.03817) Table 4. Ours: mean ± std over seeds of each run's last evaluation ({at}) "
            "(pass@1 estimate, val-core/<data>/acc/mean_at_N). Paper: " + paper_source("troll_table4")
        ),
        values=values,
        display=display,
        reproduces="TROLL (arXiv 2510.03817) Table 4",
        notes=notes,
        aux={"std": std},
    )


def troll_variant(label: str, objective: object, params: dict[str, object]) -> str:
    """Clip / TROLL / TROLL Chunked (a TROLL run whose method label or a ``*chunk*`` param says chunked)."""
    if not is_troll(objective):
        return "Clip"
    if "chunk" in str(label).lower():
        return "TROLL Chunked"
    for key, value in params.items():
        if "chunk" in key.lower() and str(value).lower() not in ("", "0", "none", "null", "false"):
            return "TROLL Chunked"
    return "TROLL"


def troll_table5(data: ExperimentData) -> Table:
    """TROLL (arXiv 2510.03817) Table 5: peak memory and time per iteration per variant, with Delta vs Clip."""
    per, mem_metric, time_metric = _table5_inputs(data)
    labels = data.labels()
    params = data.runs.set_index("run_id")
    pcols = [c for c in params.columns if c.startswith("params.")]
    labels["Variant"] = [
        troll_variant(m, o, {c[7:]: params.at[r, c] for c in pcols if pd.notna(params.at[r, c])})
        for r, m, o in zip(labels["run_id"], labels[metric_names.TAG_METHOD], labels[metric_names.TAG_OBJECTIVE])
    ]
    models = sorted(labels[metric_names.TAG_MODEL].fillna("?").unique())
    variants = ["Clip", "TROLL", "TROLL Chunked"]
    units = {"VRAM": "GiB", "Runtime": "s", "Runtime (CPU)": "s"}
    rows = [(metric, v) for metric in per for v in (*variants, "Delta")]
    index = pd.MultiIndex.from_tuples(rows, names=["Metric", "Variant"])
    cols = pd.MultiIndex.from_tuples([(m, s) for m in models for s in ("ours", "paper")], names=["model", "source"])
    values = pd.DataFrame(np.nan, index=index, columns=cols)
    display = pd.DataFrame(MISSING, index=index, columns=cols)
    paper = paper_table("troll_table5")
    notes = []
    if mem_metric == metric_names.CPU_MEMORY_USED_GB:
        notes.append(f"VRAM: no GPU memory logged; ours shows {metric_names.CPU_MEMORY_USED_GB} (process memory)")
    header = {}
    for model in models:
        pmodel, note = paper_model(model, TABLE5_MODELS, "Qwen3-1.7B")
        header[model] = model if note is None else f"{model} (paper column: {pmodel})"
        if note and note not in notes:
            notes.append(note)
        in_model = labels[labels[metric_names.TAG_MODEL].fillna("?") == model]
        for metric, series in per.items():
            means = {}
            for v in variants:
                ids = in_model.loc[in_model["Variant"] == v, "run_id"]
                vals = series.reindex(ids).dropna()
                if len(vals):
                    means[v] = float(vals.mean())
                    values.loc[(metric, v), (model, "ours")] = means[v]
                    display.loc[(metric, v), (model, "ours")] = f"{means[v]:.3f} {units[metric]}"
                p = paper[(paper["model"] == pmodel) & (paper["metric"] == metric) & (paper["variant"] == v)]
                if len(p):
                    values.loc[(metric, v), (model, "paper")] = float(p["value"].iloc[0])
                    display.loc[(metric, v), (model, "paper")] = f"{float(p['value'].iloc[0]):.3f} {units[metric]}"
            new = "TROLL Chunked" if "TROLL Chunked" in means else "TROLL"
            if "Clip" in means and new in means:
                delta = means[new] - means["Clip"]
                values.loc[(metric, "Delta"), (model, "ours")] = delta
                display.loc[(metric, "Delta"), (model, "ours")] = (
                    f"{delta:+.3f} {units[metric]} ({delta / means['Clip'] * 100:+.1f}%) [{new}]"
                )
            p = paper[
                (paper["model"] == pmodel) & (paper["metric"] == metric) & (paper["variant"] == "Delta (Chunked)")
            ]
            if len(p):
                x, pct = float(p["value"].iloc[0]), float(p["delta_pct"].iloc[0])
                values.loc[(metric, "Delta"), (model, "paper")] = x
                display.loc[(metric, "Delta"), (model, "paper")] = f"{x:+.3f} {units[metric]} ({pct:+.1f}%) [Chunked]"
    display.columns = pd.MultiIndex.from_tuples([(header[m], src) for m, src in display.columns], names=cols.names)
    return Table(
        key="troll_table5",
        title="Memory and runtime overhead of TROLL",
        caption=(
            f"Reproduces TROLL (arXiv 2510.03817) Table 5. Ours: peak of {mem_metric or 'memory'} over the run and mean of {time_metric or 'step time'} "
            f"(wall clock; Runtime (CPU): {metric_names.TIMING_CPU_STEP}, the training process's CPU time) "
            "over all steps but the first (warm-up), averaged over seeds; Delta = TROLL (chunked if present) minus Clip. "
            "Paper: " + paper_source("troll_table5")
        ),
        values=values,
        display=display,
        reproduces="TROLL (arXiv 2510.03817) Table 5",
        notes=notes + inflation_notes(data),
    )


def _table5_inputs(data: ExperimentData) -> tuple[dict[str, pd.Series], str | None, str | None]:
    """({row metric: value per run}, memory metric, time metric): peak memory, mean step time after the
    first step, and the CPU time of the step beside it when the backend logs it."""
    names = data.metric_names()
    mem_metric = next(
        (m for m in (metric_names.MAX_MEMORY_ALLOCATED_GB, metric_names.CPU_MEMORY_USED_GB) if m in names), None
    )
    time_metric = metric_names.TIMING_STEP if metric_names.TIMING_STEP in names else None
    if mem_metric is None and time_metric is None:
        raise SkipItem(f"no run logs {metric_names.MAX_MEMORY_ALLOCATED_GB} or {metric_names.TIMING_STEP}")
    per = {}
    if mem_metric:
        per["VRAM"] = per_run(data, mem_metric, "max").set_index("run_id")["value"]
    if time_metric:
        per["Runtime"] = _runtime_per_run(data, time_metric)
    if time_metric and metric_names.TIMING_CPU_STEP in names:
        per["Runtime (CPU)"] = _runtime_per_run(data, metric_names.TIMING_CPU_STEP)
    return per, mem_metric, time_metric


def _runtime_per_run(data: ExperimentData, metric: str) -> pd.Series:
    m = data.metrics
    sel = m[m["metric"] == metric].astype({"run_id": str})
    out = {}
    for rid, g in sel.groupby("run_id"):
        g = g.sort_values("step")
        rest = g[g["step"] > g["step"].min()]
        out[rid] = float((rest if len(rest) else g)["value"].mean())
    return pd.Series(out, dtype=float)


__all__ = ["troll_table1", "troll_table4", "troll_table5", "troll_variant", "fmt_num"]
