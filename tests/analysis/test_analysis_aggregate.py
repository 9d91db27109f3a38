"""Aggregations against independent computations: numpy convolution for smoothing, hand-computed
cases for final/best/checkpoint/entropy change, and scipy's bootstrap for the confidence interval."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.aggregate import (
    best_checkpoint,
    bootstrap_ci,
    effective_window,
    entropy_change,
    final_value,
    mean_std,
    per_run,
    seed_curves,
    smooth,
)
from analysis.synthetic import profile, synthetic_data
from runners import metric_names


@pytest.mark.parametrize("window", [1, 3, 7, 21])
def test_smooth_is_a_centred_moving_average(window):
    x = np.random.default_rng(0).normal(size=60)
    y = smooth(x, window)
    h = window // 2
    # interior points: the full window, as numpy's valid convolution computes it
    np.testing.assert_allclose(y[h : len(x) - h], np.convolve(x, np.ones(window) / window, mode="valid"), atol=1e-12)
    # ends: the mean of the points the window covers
    for i in list(range(h)) + list(range(len(x) - h, len(x))):
        assert y[i] == pytest.approx(x[max(0, i - h) : i + h + 1].mean(), abs=1e-12)


def test_effective_window_caps_at_half_the_series_and_stays_odd():
    assert effective_window(21, 1000) == 21
    assert effective_window(21, 10) == 5
    assert effective_window(7, 9) == 3
    assert effective_window(7, 1) == 1


def test_final_and_mean_std():
    s = pd.Series([0.1, 0.5, np.nan, 0.2, 0.4], index=[4, 1, 3, 2, 5])  # unsorted steps, a NaN
    assert final_value(s, 2) == pytest.approx((0.1 + 0.4) / 2)  # steps 4 and 5 (sorted by step)
    assert final_value(s, 3) == pytest.approx((0.2 + 0.1 + 0.4) / 3)  # the NaN at step 3 is skipped
    assert final_value(s, 1) == pytest.approx(0.4)
    mean, std, n = mean_std([1.0, 2.0, 4.0, np.nan])
    assert (mean, n) == (pytest.approx(7 / 3), 3)
    assert std == pytest.approx(np.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) / 2))


def test_bootstrap_ci_agrees_with_scipy():
    x = np.random.default_rng(1).normal(0.5, 0.1, size=12)
    lo, hi = bootstrap_ci(x, level=0.9, n_boot=20000, seed=3)
    ref = stats.bootstrap((x,), np.mean, confidence_level=0.9, n_resamples=20000, method="percentile", random_state=4)
    assert lo == pytest.approx(ref.confidence_interval.low, abs=0.004)
    assert hi == pytest.approx(ref.confidence_interval.high, abs=0.004)
    assert bootstrap_ci([0.3]) != bootstrap_ci([0.3])  # NaN for a single seed (NaN != NaN)


def test_best_checkpoint_and_entropy_change():
    a = pd.Series([0.1, 0.4, 0.3], index=[0, 10, 20])
    b = pd.Series([0.2, 0.1, 0.5], index=[0, 10, 20])
    assert best_checkpoint([a, b]) == 20  # means 0.15, 0.25, 0.40
    assert best_checkpoint([a]) == 10
    entropy = pd.Series([0.8, 0.7, 0.6, 0.5], index=[1, 5, 10, 15])
    assert entropy_change(entropy, 12) == (pytest.approx(0.6 - 0.8), pytest.approx(-0.2 / 0.8))
    assert entropy_change(entropy, 0) == (0.0, 0.0)  # evaluation before the first update: the initial policy


def test_seed_curves_against_numpy():
    data, truth = synthetic_data(profile("demo", steps=30, seeds=(0, 1, 2)))
    curves = seed_curves(data, metric_names.SCORE_MEAN, window=7)
    g = curves[curves["method"] == "GRPO"]
    runs = np.stack([truth[("GRPO", s)]["curves"][metric_names.SCORE_MEAN][1] for s in (0, 1, 2)])
    np.testing.assert_allclose(g["raw"], runs.mean(axis=0), atol=1e-12)
    np.testing.assert_allclose(g["smooth"], np.mean([smooth(r, 7) for r in runs], axis=0), atol=1e-12)
    assert (g["lo"] <= g["smooth"] + 1e-12).all() and (g["smooth"] <= g["hi"] + 1e-12).all()
    finals = per_run(data, metric_names.SCORE_MEAN, "final", last_n=5)
    assert finals.loc[finals["run_id"] == "GRPO-s1", "value"].item() == pytest.approx(runs[1][-5:].mean())
