"""T-PPO (arXiv 2506.15050) Table 1: AIME24 avg@N of each algorithm (percent), ours beside the paper, plus step time.

Ours: the final AIME24 score of each run (its last evaluation, ``analysis.aggregate.final_evals`` as in
every table, of the largest ``val-core/<aime24>/acc/mean_at_N`` logged, x100; the caption names the
step), mean ± std over seeds; the paper's rows without a run of ours keep an empty "ours" cell. Step time columns (ours only) support the
paper's efficiency claim (section 4.2.2): mean ``timing_s/step`` and its ratio to PPO's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.aggregate import final_evals, steps_text
from analysis.frames import ExperimentData
from analysis.names import eval_metrics, find_eval, paper_method
from analysis.paper_data import paper_source, paper_table
from analysis.skip import SkipItem
from analysis.tables.base import MISSING, Table, fmt_num
from analysis.tables.common import seed_cell
from analysis.tables.troll import _runtime_per_run
from analysis.timing import inflation_notes
from runners import metric_names


def tppo_table1(data: ExperimentData) -> Table:
    names = data.metric_names()
    notes = []
    metric = find_eval(names, "aime24")
    if metric is None:
        evals = list(eval_metrics(names).values())
        if not evals:
            raise SkipItem("no run logs an evaluation metric (val-core/<data>/acc/mean_at_N)")
        metric = evals[0]
        notes.append(f"no AIME24 evaluation logged; ours shows {metric}")
    n = metric.rsplit("_", 1)[-1]
    finals = final_evals(data, metric)
    finals = finals[finals["value"].notna()].copy()
    at = steps_text(finals["step"])
    finals["Method"] = [
        paper_method(a, m) for a, m in zip(finals[metric_names.TAG_ALGORITHM], finals[metric_names.TAG_METHOD])
    ]
    for col, clock in (("step_time", metric_names.TIMING_STEP), ("cpu_time", metric_names.TIMING_CPU_STEP)):
        per = _runtime_per_run(data, clock) if clock in names else pd.Series(dtype=float)
        finals[col] = per.reindex(finals["run_id"]).to_numpy()
    paper = paper_table("tppo_table1")
    rows = list(paper["method"]) + [m for m in dict.fromkeys(finals["Method"]) if m not in set(paper["method"])]
    score_col = f"AIME24 avg@{n} (%)" if metric == find_eval(names, "aime24") else f"{metric} (%)"
    cols = pd.MultiIndex.from_tuples(
        [
            (score_col, "ours"),
            (score_col, "paper"),
            ("time / step (s)", "ours"),
            ("CPU time / step (s)", "ours"),
            ("time vs PPO", "ours"),
        ],
        names=["", "source"],
    )
    index = pd.Index(rows, name="Method")
    values = pd.DataFrame(np.nan, index=index, columns=cols)
    display = pd.DataFrame(MISSING, index=index, columns=cols)
    ppo_time = finals.loc[finals["Method"] == "PPO", "step_time"].mean()
    for method in rows:
        g = finals[finals["Method"] == method]
        if len(g):
            mean, _, text = seed_cell(g["value"] * 100, digits=1)
            values.loc[method, (score_col, "ours")] = mean
            display.loc[method, (score_col, "ours")] = text
            t = float(g["step_time"].mean())
            values.loc[method, ("time / step (s)", "ours")] = t
            display.loc[method, ("time / step (s)", "ours")] = fmt_num(t, 2)
            cpu = float(g["cpu_time"].mean())
            values.loc[method, ("CPU time / step (s)", "ours")] = cpu
            display.loc[method, ("CPU time / step (s)", "ours")] = fmt_num(cpu, 2)
            if np.isfinite(ppo_time) and np.isfinite(t):
                values.loc[method, ("time vs PPO", "ours")] = t / ppo_time
                display.loc[method, ("time vs PPO", "ours")] = f"{t / ppo_time:.2f}×"
        p = paper[paper["method"] == method]
        if len(p):
            values.loc[method, (score_col, "paper")] = float(p["aime24_avg32_pct"].iloc[0])
            display.loc[method, (score_col, "paper")] = fmt_num(float(p["aime24_avg32_pct"].iloc[0]), 0)
    if not len(finals):
        raise SkipItem(f"no run logs {metric}")
    return Table(
        key="tppo_table1",
        title="Results of different algorithms on AIME24",
        caption=(
            f"Reproduces T-PPO (arXiv 2506.15050) Table 1. Ours: each run's last evaluation ({at}) of {metric} ×100, "
            f"mean ± std over seeds; time per step = mean {metric_names.TIMING_STEP} after the first step (wall clock) and "
            f"mean {metric_names.TIMING_CPU_STEP} (CPU time of the training process; – when not logged). "
            "Paper: " + paper_source("tppo_table1")
        ),
        values=values,
        display=display,
        reproduces="T-PPO (arXiv 2506.15050) Table 1",
        notes=notes + inflation_notes(data),
    )
