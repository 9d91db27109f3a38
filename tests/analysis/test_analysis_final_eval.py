"""A final evaluation is the last evaluation of each run, in every table, labelled with its step.

Reference: the evaluation curves ``analysis.synthetic`` generated (exactly what the runs logged), read with
numpy: the value at each run's last evaluation step, then mean (and sample std) over seeds. The sweep is
shaped like the demo (evaluations at steps 0, 10 and 20): the evaluation at step 0 (before any update)
differs from every later one and the last evaluation differs from the mean of the last three, so a table
that averaged the last evaluations, or counted step 0, prints another number and fails here.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.aggregate import final_eval_label, final_evals, steps_text
from analysis.frames import ExperimentData
from analysis.synthetic import SyntheticSpec, _m, synthetic_data
from analysis.tables.compare import comparison_table
from analysis.tables.generic import eval_start_end_table, final_metrics_table
from analysis.tables.tppo import tppo_table1
from analysis.tables.troll import troll_table1
from runners import metric_names

METRIC = metric_names.val_acc_mean("embedded_test")
METHODS = ("GRPO", "GRPO+TROLL")
SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def sweep():
    spec = SyntheticSpec(
        "final_eval_test",
        [_m("GRPO", "grpo", final=0.5, seed_sd=0.02), _m("GRPO+TROLL", "grpo", "troll", final=0.6, rate=0.08)],
        seeds=SEEDS,
        steps=20,
        eval_every=10,
        eval_sets=("embedded_test",),
        model="tiny-qwen2",
        dataset="embedded",
        families=frozenset({"core", "timing"}),
    )
    return synthetic_data(spec)


def _evals(truth, method):
    """[seeds, evals] values and the evaluation steps of ``method`` (all seeds share the steps)."""
    curves = [truth[(method, s)]["curves"][METRIC] for s in SEEDS]
    assert all(np.array_equal(c[0], curves[0][0]) for c in curves)
    return np.array([c[1] for c in curves]), curves[0][0]


def _expected_last(truth, method):
    values, _ = _evals(truth, method)
    return values[:, -1].mean(), values[:, -1].std(ddof=1)


def test_the_sweep_separates_last_eval_from_mean_of_last_three_and_from_step_0(sweep):
    """The premise of the tests below: the three readings of "final" differ by far more than the tolerance."""
    _, truth = sweep
    for method in METHODS:
        values, steps = _evals(truth, method)
        assert list(steps) == [0, 10, 20]
        last, last3, first = values[:, -1].mean(), values[:, -3:].mean(), values[:, 0].mean()
        assert abs(last - last3) > 0.05 and abs(last - first) > 0.1, (method, last, last3, first)
        assert np.all(np.abs(values[:, 1:] - values[:, :1]) > 0.02)  # step 0 differs from every later eval


def test_final_evals_is_each_runs_last_evaluation_and_its_step(sweep):
    data, truth = sweep
    finals = final_evals(data, METRIC).set_index("run_id")
    for method in METHODS:
        values, steps = _evals(truth, method)
        for k, seed in enumerate(SEEDS):
            row = finals.loc[truth[(method, seed)]["run_id"]]
            assert row["value"] == values[k, -1] and row["step"] == steps[-1]


def test_every_table_prints_the_last_evaluation_and_names_its_step(sweep):
    data, truth = sweep
    label = "embedded_test pass@1 at step 20 (last eval)"
    compare = comparison_table(data)
    start_end = eval_start_end_table(data)
    final = final_metrics_table(data, metrics=[metric_names.SCORE_MEAN, METRIC])
    tppo = tppo_table1(data)  # no AIME24 logged: shows the evaluation it has
    troll = troll_table1(data)  # the in-domain evaluation as "DAPO Eval"
    final_row = f"{METRIC} at step 20 (last eval)"
    assert label in compare.values.index.get_level_values("metric")
    assert list(final.values.index) == [metric_names.SCORE_MEAN, final_row]
    assert "the last evaluation (DAPO Eval at step 20)" in troll.caption
    assert "each run's last evaluation (step 20)" in tppo.caption
    for method in METHODS:
        mean, std = _expected_last(truth, method)
        objective = "TROLL" if "TROLL" in method else "Clip"
        shown = {
            "comparison": compare.values.loc[(label, method), "mean [95% CI]"],
            "eval_start_end": start_end.values.loc[method, ("embedded_test", "end")],
            "final_metrics": final.values.loc[final_row, method],
            "troll_table1": troll.values.loc[("tiny-qwen2", "GRPO"), ("DAPO Eval", objective, "ours")],
        }
        for table, value in shown.items():
            assert value == pytest.approx(mean, abs=1e-12), (table, method)
        assert final.aux["std"].loc[final_row, method] == pytest.approx(std, abs=1e-12)
        # displayed with the same three decimals everywhere
        text = f"{mean:.3f}"
        assert compare.display.loc[(label, method), "mean [95% CI]"].startswith(text + " [")
        assert start_end.display.loc[method, ("embedded_test", final_eval_label([20]))].startswith(text + " ± ")
        assert final.display.loc[final_row, method].startswith(text + " ± ")
    # the headers of the before/after table name both steps
    assert list(start_end.display.columns) == [
        ("embedded_test", "pass@1 at step 0 (first eval)"),
        ("embedded_test", "pass@1 at step 20 (last eval)"),
        ("embedded_test", "change"),
    ]
    assert "pass@1 at step 20 (last eval)" in start_end.to_html()
    assert label in compare.to_html()


def test_tppo_table_shows_the_same_final_evaluation(sweep):
    """T-PPO's table (x100) has one row per paper method; both our methods are GRPO there: the mean over
    their six runs' last evaluations."""
    data, truth = sweep
    tppo = tppo_table1(data)
    (col,) = [c for c in tppo.values.columns if c[1] == "ours" and c[0].endswith("(%)")]
    runs = np.concatenate([_evals(truth, m)[0][:, -1] for m in METHODS])
    assert tppo.values.loc["GRPO", col] == pytest.approx(100 * runs.mean(), abs=1e-9)


def test_runs_ending_at_different_steps_are_labelled_with_the_range(sweep):
    """A run whose last evaluation came earlier (stopped at step 10) contributes that evaluation, and the
    label says the final evaluations were taken at steps 10-20."""
    data, truth = sweep
    short = truth[("GRPO", 1)]["run_id"]
    m = data.metrics
    cut = m[~((m["run_id"].astype(str) == short) & (m["step"] > 10))]
    data = ExperimentData(runs=data.runs, metrics=cut.reset_index(drop=True))
    values, _ = _evals(truth, "GRPO")
    expected = np.array([values[0, -1], values[1, 1], values[2, -1]])  # seed 1: its evaluation at step 10
    label = "embedded_test pass@1 at steps 10-20 (last eval)"
    compare = comparison_table(data)
    assert compare.values.loc[(label, "GRPO"), "mean [95% CI]"] == pytest.approx(expected.mean(), abs=1e-12)
    start_end = eval_start_end_table(data)
    assert start_end.values.loc["GRPO", ("embedded_test", "end")] == pytest.approx(expected.mean(), abs=1e-12)
    assert ("embedded_test", "pass@1 at steps 10-20 (last eval)") in list(start_end.display.columns)


def test_steps_text_and_label():
    assert steps_text([20.0, 20.0, float("nan")]) == "step 20"
    assert steps_text(pd.Series([10, 20, 15])) == "steps 10-20"
    assert steps_text([]) == "–"
    assert final_eval_label([20], "gsm8k pass@1") == "gsm8k pass@1 at step 20 (last eval)"
