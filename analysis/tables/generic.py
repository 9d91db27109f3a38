"""Tables for any experiment: run overview, final value of every metric per method, config diff.

Rows and columns are arms (``analysis.arms.run_labels``): the method, split by model and off-policy regime
when the sweep spans several ("GRPO+TROLL | stale k=2"), so no table pools runs of different regimes."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.aggregate import final_eval_label, final_evals, per_run, run_series, steps_text, summarize
from analysis.arms import run_labels
from analysis.frames import ExperimentData
from analysis.names import eval_metrics
from analysis.skip import SkipItem
from analysis.tables.base import MISSING, Table, fmt_mean_std
from runners import metric_names

# params that always differ between runs and say nothing about the compared methods
_IGNORED_PARAMS = ("seed",)
# the preset's declaration of its components (``algorithm.components.objective = clip``), which an override
# replaces: what a run used is ``<group>.name`` (``objective.name = troll``), so the declaration would
# contradict it in the table
_IGNORED_PREFIXES = ("algorithm.components.",)


def _arms(data: ExperimentData) -> tuple[pd.DataFrame, list[str]]:
    """(run labels with their ``arm``, the arms in first-run order)."""
    labels = run_labels(data)
    return labels, list(dict.fromkeys(labels["arm"]))


def _by_arm(frame: pd.DataFrame, labels: pd.DataFrame) -> pd.DataFrame:
    """``summarize`` over seeds of each arm of a per-run frame (``per_run`` / ``final_evals``), indexed by arm."""
    arm_of = dict(zip(labels["run_id"].astype(str), labels["arm"]))
    frame = frame.assign(arm=[arm_of.get(str(r)) for r in frame["run_id"]])
    return summarize(frame, by="arm", ci=False).set_index("arm")


def overview_table(data: ExperimentData) -> Table:
    """Runs per arm: seeds, status counts, last step logged."""
    labels = run_labels(data)
    if not len(labels):
        raise SkipItem("the experiment has no runs")
    last = data.metrics.astype({"run_id": str}).groupby("run_id")["step"].max()
    labels["last_step"] = labels["run_id"].map(last)
    rows = []
    for method, g in labels.groupby("arm", sort=False):
        rows.append(
            {
                "Method": method,
                "runs": len(g),
                "seeds": ", ".join(str(s) for s in sorted(g[metric_names.TAG_SEED]) if s >= 0) or MISSING,
                "model": ", ".join(sorted(g[metric_names.TAG_MODEL].dropna().astype(str).unique())) or MISSING,
                "dataset": ", ".join(sorted(g[metric_names.TAG_DATASET].dropna().astype(str).unique())) or MISSING,
                "status": ", ".join(f"{k}×{v}" for k, v in g["status"].value_counts().items()),
                "last step": int(g["last_step"].max()) if g["last_step"].notna().any() else -1,
            }
        )
    frame = pd.DataFrame(rows).set_index("Method")
    return Table(
        key="overview",
        title="Runs",
        caption="Runs of the experiment grouped by method (the run's 'method' tag; per model and off-policy regime "
        "when the sweep has several): seeds, model, data set, MLflow status, last logged step.",
        values=frame,
        display=frame.astype(str),
    )


def final_metrics_table(
    data: ExperimentData, metrics: list[str] | None = None, last_n: int = 3, max_metrics: int = 40
) -> Table:
    """Mean ± std over seeds of each run's final value: rows are metrics, columns methods (a sweep has
    few methods and possibly many metrics). A training metric's final value is the mean of its last
    ``last_n`` points; an evaluation metric's is the run's last evaluation (``final_evals``, as in every
    table), its row labelled with the step ("<metric> at step 20 (last eval)")."""
    logged = set(data.metric_names())
    names = [m for m in (metrics or sorted(logged)) if m in logged]
    if not names:
        raise SkipItem("no metrics logged")
    notes = [f"{len(names) - max_metrics} more metrics not shown"] if len(names) > max_metrics else []
    names = names[:max_metrics]
    evals = set(eval_metrics(list(logged)).values())
    labels, methods = _arms(data)
    per_metric = {}
    for m in names:
        if m in evals:
            finals = final_evals(data, m)
            per_metric[final_eval_label(finals["step"], m)] = finals
        else:
            per_metric[m] = per_run(data, m, "final", last_n)
    values = pd.DataFrame(
        np.nan, index=pd.Index(list(per_metric), name="metric"), columns=pd.Index(methods, name="Method")
    )
    std = values.copy()
    display = pd.DataFrame(MISSING, index=values.index, columns=values.columns)
    for row, frame in per_metric.items():
        s = _by_arm(frame, labels)
        for method in methods:
            if method in s.index:
                values.loc[row, method], std.loc[row, method] = s.at[method, "mean"], s.at[method, "std"]
                display.loc[row, method] = fmt_mean_std(s.at[method, "mean"], s.at[method, "std"], 3)
    what = f"training metrics: the mean of its last {last_n} logged points"
    if any(m in evals for m in names):
        what += "; evaluation metrics: its last evaluation, at the step the row names"
    return Table(
        key="final_metrics",
        title="Final values",
        caption=f"Mean ± std over seeds of each run's final value ({what}).",
        values=values,
        display=display,
        notes=notes,
        aux={"std": std},
    )


def config_diff_table(data: ExperimentData, max_rows: int = 40) -> Table:
    """Params that differ between runs, one column per method ("a | b" where seeds of a method differ)."""
    runs = data.runs
    pcols = [
        c
        for c in runs.columns
        if c.startswith("params.") and c[7:] not in _IGNORED_PARAMS and not c[7:].startswith(_IGNORED_PREFIXES)
    ]
    differing = [c for c in pcols if runs[c].astype(str).nunique(dropna=False) > 1]
    if not differing:
        raise SkipItem("all runs share the same params (apart from the seed)")
    labels, methods = _arms(data)
    arm_of = dict(zip(labels["run_id"].astype(str), labels["arm"]))
    run_arms = np.array([arm_of.get(str(r)) for r in runs["run_id"]], dtype=object)
    by_method = {m: runs[run_arms == m] for m in methods}
    notes = []
    if len(differing) > max_rows:
        notes.append(f"{len(differing) - max_rows} more differing params not shown")
    rows = differing[:max_rows]
    display = pd.DataFrame(
        MISSING, index=pd.Index([c[7:] for c in rows], name="param"), columns=pd.Index(methods, name="Method")
    )
    for c in rows:
        for m, g in by_method.items():
            vals = sorted({str(v) if pd.notna(v) else MISSING for v in g[c]})
            display.loc[c[7:], m] = " | ".join(vals)
    return Table(
        key="config_diff",
        title="Config differences",
        caption="Resolved-config params (MLflow params, dotted keys) that differ between the compared runs; "
        "params equal in every run are omitted, and so are the seed and a preset's declared components "
        "(algorithm.components.*: the component a run used is <group>.name).",
        values=display.copy(),
        display=display,
        notes=notes,
    )


def eval_start_end_table(data: ExperimentData) -> Table:
    """Evaluation pass@1 of every data set before training (first evaluation) and at the end (the last,
    ``final_evals``: the same final value as every other table), and the change, mean ± std over seeds:
    did RL move the policy? Rows methods, columns data sets; the headers name the steps."""
    metrics = eval_metrics(data.metric_names())
    if not metrics:
        raise SkipItem("no evaluation metrics (val-core/<data>/acc/mean_at_N) logged")
    labels, methods = _arms(data)
    columns = pd.MultiIndex.from_product([list(metrics), ["start", "end", "change"]], names=["data", "when"])
    values = pd.DataFrame(np.nan, index=pd.Index(methods, name="Method"), columns=columns)
    display = pd.DataFrame(MISSING, index=values.index, columns=columns)
    headers = {}
    for dataset, metric in metrics.items():
        first = per_run(data, metric, "first")
        series = run_series(data, metric)
        first_steps = [float(series[r].dropna().index.min()) for r in first["run_id"] if r in series]
        last = final_evals(data, metric)
        change = last.assign(value=last["value"].to_numpy() - first["value"].to_numpy())
        headers[(dataset, "start")] = f"pass@1 at {steps_text(first_steps)} (first eval)"
        headers[(dataset, "end")] = final_eval_label(last["step"])
        headers[(dataset, "change")] = "change"
        for when, frame in (("start", first), ("end", last), ("change", change)):
            s = _by_arm(frame, labels)
            for method in methods:
                if method in s.index:
                    values.loc[method, (dataset, when)] = s.at[method, "mean"]
                    text = fmt_mean_std(s.at[method, "mean"], s.at[method, "std"], 3)
                    display.loc[method, (dataset, when)] = (
                        ("+" + text) if when == "change" and s.at[method, "mean"] > 0 else text
                    )
    display.columns = pd.MultiIndex.from_tuples([(d, headers[(d, w)]) for d, w in columns], names=columns.names)
    return Table(
        key="eval_start_end",
        title="Evaluation before and after training",
        caption="pass@1 (mean over the evaluation samples of each prompt) at the first evaluation (before any "
        "update) and at the last one (each run's final evaluation, as in every table; the headers name the "
        "steps), and the change; mean ± std over seeds.",
        values=values,
        display=display,
    )
