"""The learning-curve table on synthetic sweeps with known curves: AUC recomputed with numpy's trapezoid
rule from the logged evaluation curve, the paired difference with scipy's t interval, steps and CPU seconds
to the target read off the curves by a plain loop; runs that never reach the target are not timed."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as st

from analysis.skip import SkipItem
from analysis.synthetic import SyntheticSpec, _m, synthetic_data
from analysis.tables.learning import curve_auc, first_reaching, learning_table
from runners import metric_names

EVAL = metric_names.val_acc_mean("dapo_eval", 1)


def _data(methods, seeds=(0, 1, 2)):
    spec = SyntheticSpec("learning_test", methods, seeds=seeds, steps=40, eval_every=5,
                         families=frozenset({"core", "timing"}))  # fmt: skip
    return spec, *synthetic_data(spec)


def test_auc_is_the_mean_of_the_curve_over_its_span():
    import pandas as pd

    s = pd.Series([0.0, 0.5, 0.5, 1.0], index=[0, 10, 20, 40])
    # trapezoids: 10*0.25 + 10*0.5 + 20*0.75 = 22.5 over 40 steps
    assert curve_auc(s) == pytest.approx(22.5 / 40)
    assert np.isnan(curve_auc(pd.Series([0.3], index=[0])))
    assert first_reaching(s, 0.5) == 10 and first_reaching(s, 1.01) is None


def test_learning_table_against_the_curves():
    methods = [_m("GRPO", "grpo", final=0.4, rate=0.05), _m("GTPO", "gtpo", "gtpo", final=0.7, rate=0.2)]
    spec, data, truth = _data(methods)
    table = learning_table(data)
    aucs = {}
    for label in ("GRPO", "GTPO"):
        aucs[label] = []
        for s in spec.seeds:
            x, y = truth[(label, s)]["curves"][EVAL]
            aucs[label].append(np.trapezoid(y, x) / (x[-1] - x[0]))
    assert table.values.loc["GTPO", "AUC [95% CI]"] == pytest.approx(np.mean(aucs["GTPO"]), rel=1e-9)
    d = np.array(aucs["GTPO"]) - np.array(aucs["GRPO"])
    assert table.values.loc["GTPO", "Δ AUC vs baseline [95% CI]"] == pytest.approx(d.mean(), rel=1e-9)
    half = st.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    assert (
        f"[{d.mean() - half:+.3f}, {d.mean() + half:+.3f}]" in table.display.loc["GTPO", "Δ AUC vs baseline [95% CI]"]
    )
    assert table.display.loc["GRPO", "Δ AUC vs baseline [95% CI]"] == "(baseline)"
    # target: 90% of the best method's mean last evaluation
    best = max(np.mean([truth[(m, s)]["curves"][EVAL][1][-1] for s in spec.seeds]) for m in ("GRPO", "GTPO"))
    target = 0.9 * best
    steps, seconds = [], []
    for s in spec.seeds:
        x, y = truth[("GTPO", s)]["curves"][EVAL]
        hit = next(int(xi) for xi, yi in zip(x, y) if yi >= target)
        t_steps, t = truth[("GTPO", s)]["curves"][metric_names.TIMING_CPU_STEP]
        steps.append(hit)
        seconds.append(t[t_steps <= hit].sum())
    assert table.values.loc["GTPO", "steps to target"] == np.median(steps)
    assert table.values.loc["GTPO", "CPU s to target"] == pytest.approx(np.median(seconds), rel=1e-9)
    assert table.display.loc["GRPO", "steps to target"] == "not reached (0 of 3)"  # 0.4 never reaches 0.9 x ~0.7
    assert f"{target:.3f}" in table.caption


def test_learning_table_needs_curves():
    spec = SyntheticSpec("learning_none", [_m("GRPO", "grpo")], steps=8, eval_every=100, families=frozenset({"core"}))
    data, _ = synthetic_data(spec)
    with pytest.raises(SkipItem, match="two evaluations"):
        learning_table(data)
