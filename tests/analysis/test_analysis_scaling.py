"""Sigmoid reward-vs-compute fits (ScaleRL, arXiv 2510.13786): recovery of known curves, refusals with a
reason, and the per-method table against fits on curves rebuilt here from what was logged."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.frames import ExperimentData
from analysis.scaling import fit_sigmoid, sigmoid_reward
from analysis.skip import SkipItem
from analysis.synthetic import profile, synthetic_data
from analysis.tables.scaling import scaling_table
from runners import metric_names


def test_sigmoid_is_r0_at_zero_compute_and_half_gain_at_c_mid():
    assert sigmoid_reward(0.0, 0.1, 0.7, 1.5, 300.0) == pytest.approx(0.1)
    assert sigmoid_reward(300.0, 0.1, 0.7, 1.5, 300.0) == pytest.approx(0.4)
    assert sigmoid_reward(1e12, 0.1, 0.7, 1.5, 300.0) == pytest.approx(0.7, abs=1e-9)


def test_fit_recovers_a_noise_free_curve_exactly():
    C = np.linspace(0, 2000, 41)
    fit = fit_sigmoid(C, sigmoid_reward(C, 0.1, 0.7, 1.5, 300.0), a_bounds=(0, 1))
    assert fit.ok and fit.note == ""
    assert (fit.A, fit.B, fit.C_mid, fit.R0) == pytest.approx((0.7, 1.5, 300.0, 0.1), rel=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_fit_recovers_a_noisy_curve(seed):
    """A known curve (A = 0.62, B = 2, C_mid = 5e4 tokens) with sd 0.01 noise on 60 points."""
    rng = np.random.default_rng(seed)
    C = np.r_[0, np.geomspace(1e3, 1e6, 59)]
    R = sigmoid_reward(C, 0.05, 0.62, 2.0, 5e4) + rng.normal(0, 0.01, C.shape)
    fit = fit_sigmoid(C, R, r0=0.05, a_bounds=(0, 1))
    assert fit.ok
    assert fit.A == pytest.approx(0.62, abs=0.015)
    assert fit.B == pytest.approx(2.0, rel=0.2)
    assert fit.C_mid == pytest.approx(5e4, rel=0.15)
    assert fit.rmse == pytest.approx(0.01, rel=0.3)


def test_fit_refuses_with_a_reason():
    C = np.arange(5.0)
    few = fit_sigmoid(C, 0.1 + 0.1 * C)
    assert not few.ok and few.reason == "4 points of positive compute (< 6)"
    flat = fit_sigmoid(np.arange(30.0), np.full(30, 0.3) + np.random.default_rng(0).normal(0, 0.01, 30))
    assert not flat.ok and "no gain" in flat.reason
    early = fit_sigmoid(np.linspace(0, 100, 20), sigmoid_reward(np.linspace(0, 100, 20), 0.0, 0.8, 2.0, 500.0))
    assert early.ok and "beyond the observed compute" in early.note


def test_scaling_table_fits_each_run_on_its_cumulative_wall_time():
    """The table's A and B are the mean over seeds of fits on curves rebuilt here from the logged points:
    evaluation pass@1 at compute = cumulative timing_s/step up to the evaluation step (0 before training)."""
    spec = profile("tppo_table1", steps=80, seeds=(0, 1, 2))
    data, truth = synthetic_data(spec)
    table = scaling_table(data)
    metric = metric_names.val_acc_mean("aime24")
    assert metric in table.caption and "cumulative wall time" in table.caption
    for method in spec.methods:
        As, Bs = [], []
        for seed in spec.seeds:
            curves = truth[(method.label, seed)]["curves"]
            steps, reward = curves[metric]
            t_steps, t_vals = curves[metric_names.TIMING_STEP]
            C = np.array([t_vals[t_steps <= s].sum() for s in steps])
            fit = fit_sigmoid(C, reward, a_bounds=(0, 1))
            As.append(fit.A)
            Bs.append(fit.B)
        assert table.values.loc[method.label, "A (asymptote) [95% CI]"] == pytest.approx(np.mean(As), rel=1e-6)
        assert table.values.loc[method.label, "B (efficiency) [95% CI]"] == pytest.approx(np.mean(Bs), rel=1e-6)
        assert table.values.loc[method.label, "runs fitted"] == 3


def test_scaling_table_says_why_no_run_was_fitted_instead_of_an_empty_table():
    data, _ = synthetic_data(profile("tppo_table1", steps=30, seeds=(0,)))  # evaluations at 0, 10, 20, 30
    with pytest.raises(SkipItem, match=r"could be fitted \(\d+ run\(s\): 3 points of positive compute \(< 6\)\)"):
        scaling_table(data)


def test_scaling_table_names_the_runs_it_could_not_fit():
    """One run cut to its first evaluations: the others are fitted, its row says 0 of 1 and a note says why."""
    data, _ = synthetic_data(profile("tppo_table1", steps=120, seeds=(0,)))
    labels = data.labels()
    cut = str(labels["run_id"].iloc[0])
    keep = (data.metrics["run_id"] != cut) | (data.metrics["step"] <= 30)
    data = ExperimentData(runs=data.runs, metrics=data.metrics[keep].reset_index(drop=True), load_info=data.load_info)
    table = scaling_table(data)
    method = str(labels[metric_names.TAG_METHOD].iloc[0])
    assert table.display.loc[method, "runs fitted"] == "0 / 1"
    assert (table.display.drop(index=method)["runs fitted"] == "1 / 1").all()
    assert any(n.startswith(f"{method}: not fitted") and "points of positive compute" in n for n in table.notes)
