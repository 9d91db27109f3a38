"""The comparison table against scipy's paired t-test (a generic solver), Holm's step-down rule applied
literally, and the per-seed final values recomputed from the logged curves; baselines and ordering."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from scipy import stats as st

from analysis.frames import ExperimentData
from analysis.synthetic import SyntheticSpec, _m, profile, synthetic_data
from analysis.tables.compare import comparison_table
from runners import metric_names

LABEL = "train success (mean of last 5 steps)"


def _spec(seeds=(0, 1, 2, 3, 4, 5)):
    return SyntheticSpec(
        "compare_test",
        [
            _m("GRPO", "grpo", final=0.5, seed_sd=0.03),
            _m("Same", "rloo", final=0.5, seed_sd=0.03),  # no effect
            _m("Better", "dapo", final=0.7, seed_sd=0.03),  # a large effect
            _m("Slightly", "loop", final=0.52, seed_sd=0.03),  # smaller than the seed spread
        ],
        seeds=seeds,
        steps=30,
        eval_sets=(),
    )


def _finals(truth, label, seeds):
    return np.array([truth[(label, s)]["curves"][metric_names.SCORE_MEAN][1][-5:].mean() for s in seeds])


def _holm_rejected(p: dict[str, float], alpha: float = 0.05) -> set[str]:
    rejected = set()
    for k, (name, value) in enumerate(sorted(p.items(), key=lambda kv: kv[1])):
        if value > alpha / (len(p) - k):
            break
        rejected.add(name)
    return rejected


def test_comparison_matches_scipy_and_holm():
    spec = _spec()
    data, truth = synthetic_data(spec)
    table = comparison_table(data)
    base = _finals(truth, "GRPO", spec.seeds)
    pvals = {}
    for label in ("Same", "Better", "Slightly"):
        own = _finals(truth, label, spec.seeds)
        ref = st.ttest_rel(own, base)
        row = table.values.loc[(LABEL, label)]
        assert row["mean [95% CI]"] == pytest.approx(own.mean(), abs=1e-12)
        assert row["Δ vs baseline [95% CI]"] == pytest.approx((own - base).mean(), abs=1e-12)
        assert row["p"] == pytest.approx(ref.pvalue, rel=1e-9)
        lo, hi = ref.confidence_interval(0.95)
        assert table.aux["diff_lo"].loc[(LABEL, label), "value"] == pytest.approx(lo, rel=1e-9)
        assert table.aux["diff_hi"].loc[(LABEL, label), "value"] == pytest.approx(hi, rel=1e-9)
        pvals[label] = ref.pvalue
    rejected = _holm_rejected(pvals)
    assert "Better" in rejected and "Same" not in rejected
    for label in pvals:
        diff = table.values.loc[(LABEL, label), "Δ vs baseline [95% CI]"]
        expected = f"{'higher' if diff > 0 else 'lower'} than GRPO" if label in rejected else "not distinguishable"
        assert table.values.loc[(LABEL, label), "verdict"] == expected
    assert table.values.loc[(LABEL, "GRPO"), "verdict"] == "baseline"
    assert "Holm-Bonferroni adjusted over the 3 comparisons" in table.caption


def test_one_seed_is_not_testable_and_says_so():
    data, _ = synthetic_data(_spec(seeds=(0,)))
    table = comparison_table(data)
    assert table.values.loc[(LABEL, "Better"), "verdict"] == "not testable (n=1)"
    assert table.display.loc[(LABEL, "Better"), "mean [95% CI]"].endswith("(n=1, no CI)")
    assert any("one seed only" in n for n in table.notes)


def test_order_does_not_depend_on_the_order_runs_were_loaded_in():
    data, _ = synthetic_data(_spec())
    shuffled = ExperimentData(data.runs.sample(frac=1.0, random_state=3).reset_index(drop=True), data.metrics)
    a, b = comparison_table(data), comparison_table(shuffled)
    assert list(a.display.index) == list(b.display.index)
    assert a.display.equals(b.display)
    assert [m for _, m in a.display.index[:4]] == ["GRPO", "Better", "Same", "Slightly"]  # baseline first, then sorted


def test_troll_methods_are_compared_with_clip_of_the_same_estimator():
    data, _ = synthetic_data(profile("troll_table1", steps=20, seeds=(0, 1)))
    table = comparison_table(data, baseline={"tags": {"objective": "!troll*"}, "match": ("algorithm",)})
    base = table.values.xs(LABEL, level="metric")["baseline"]
    assert base["GSPO+TROLL"] == "GSPO" and base["Dr.GRPO+TROLL"] == "Dr.GRPO" and base["GRPO+TROLL"] == "GRPO"
    assert base["GSPO"] == "GSPO"  # a baseline of its own


def test_unknown_baseline_falls_back_with_a_note():
    spec = _spec()
    data, _ = synthetic_data(replace(spec, methods=spec.methods[1:]))
    table = comparison_table(data)
    assert any("no run matches the baseline" in n for n in table.notes)
    assert table.values.loc[(LABEL, "Better"), "verdict"] == "baseline"  # first label alphabetically


def test_rollout_corrections_are_compared_with_the_uncorrected_run():
    """verl's corrections (tag rollout_correction) are arms of their own, compared with the run without one,
    both by the TRM report's baseline and by the default one; runs without the tag count as 'none'."""
    data, _ = synthetic_data(profile("trm_acceptance", steps=20, seeds=(0, 1)))
    trm = comparison_table(
        data, baseline={"tags": {"mask": "none", "rollout_correction": "none"}, "match": ("algorithm",)}
    )
    base = trm.values.xs(LABEL, level="metric")["baseline"]
    assert base["PPO-Clip + TIS"] == "PPO-Clip" and base["PPO-Clip"] == "PPO-Clip" and base["TRM-Max"] == "PPO-Clip"
    default = comparison_table(data).values.xs(LABEL, level="metric")["baseline"]
    assert default["PPO-Clip + TIS"] == "PPO-Clip"
    runs = data.runs.drop(columns=[f"tags.{metric_names.TAG_ROLLOUT_CORRECTION}"])  # runs logged before the tag
    old = comparison_table(ExperimentData(runs=runs, metrics=data.metrics)).values.xs(LABEL, level="metric")
    assert old["baseline"]["PPO-Clip"] == "PPO-Clip"
