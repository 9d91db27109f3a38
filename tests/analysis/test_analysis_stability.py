"""The stability map (analysis/stability.py, its tables, figures and report) on synthetic runs with known
effects: every number is recomputed here with numpy/scipy from the curves that were logged, the verdicts
follow the stated rule, the seeds an underpowered cell needs reach 80% power in a Monte Carlo simulation of
the paired t-test, and each instability indicator fires on a series built to trigger it and not otherwise."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sst

from analysis import stability as st
from analysis.synthetic import SyntheticSpec, _m, profile, synthetic_data, with_regime
from analysis.tables.stability import regime_claims_table, score_map_table, stability_table
from runners import metric_names

EVAL = metric_names.val_acc_mean("embedded_test", 1)
REPS = 400


def _spec(effects: dict[str, float], seeds, noise=0.02, seed_sd=0.02, steps=20) -> SyntheticSpec:
    """GRPO and GRPO+TROLL in each regime of ``effects`` (TROLL's final success = GRPO's + effect)."""
    methods = []
    for regime, effect in effects.items():
        methods.append(with_regime(_m("GRPO", "grpo", final=0.5, seed_sd=seed_sd), regime))
        methods.append(with_regime(_m("GRPO+TROLL", "grpo", "troll", final=0.5 + effect, seed_sd=seed_sd), regime))
    return SyntheticSpec(
        "stab_test", methods, seeds=tuple(seeds), steps=steps, eval_every=10, eval_sets=("embedded_test",),
        model="tiny-qwen2", dataset="embedded", families=frozenset({"core"}), noise=noise,
    )  # fmt: skip


def _finals(truth, label: str, regime: str, seeds) -> np.ndarray:
    return np.array([truth[(f"{label} | {regime}", s)]["curves"][EVAL][1][-1] for s in seeds])


def _iqm(x: np.ndarray) -> float:
    s = np.sort(x)
    k = len(s) // 4
    return float(s[k : len(s) - k].mean())


def _expected(truth, regime: str, seeds, margin=st.DEFAULT_MARGIN) -> dict:
    """IQM Δ with its bootstrap interval, the paired t interval and the verdict, recomputed by hand."""
    x, y = _finals(truth, "GRPO+TROLL", regime, seeds), _finals(truth, "GRPO", regime, seeds)
    rx, ry = np.random.default_rng(0), np.random.default_rng(1)
    bx = np.array([_iqm(x[i]) for i in rx.integers(0, len(x), size=(REPS, len(x)))])
    by = np.array([_iqm(y[i]) for i in ry.integers(0, len(y), size=(REPS, len(y)))])
    d = x - y
    n = len(d)
    half = sst.t.ppf(0.975, n - 1) * d.std(ddof=1) / np.sqrt(n) if n > 1 else np.nan
    lo, hi = d.mean() - half, d.mean() + half
    if n < 2:
        verdict = "too few seeds"
    elif lo > 0 or hi < 0:
        verdict = "better" if d.mean() > 0 else "worse"
    elif -margin <= lo and hi <= margin:
        verdict = "not distinguishable"
    else:
        verdict = "underpowered"
    poi = np.mean([(a > b) + 0.5 * (a == b) for a in x for b in y])
    return dict(iqm_diff=_iqm(x) - _iqm(y), boot=np.quantile(bx - by, [0.025, 0.975]), diff=d.mean(), lo=lo, hi=hi,
                sd=d.std(ddof=1) if n > 1 else np.nan, verdict=verdict, poi=poi)  # fmt: skip


def test_a_real_difference_is_found_in_its_regime_and_every_number_matches_numpy():
    seeds = range(5)
    data, truth = synthetic_data(_spec({"on-policy": 0.0, "stale k=4": 0.2}, seeds))
    smap = st.score_map(data, reps=REPS)
    assert list(smap.index) == ["GRPO+TROLL | on-policy", "GRPO+TROLL | stale k=4"]  # GRPO is the baseline
    for regime in ("on-policy", "stale k=4"):
        row, want = smap.loc[f"GRPO+TROLL | {regime}"], _expected(truth, regime, seeds)
        assert row["baseline"] == f"GRPO | {regime}" and row["pairs"] == 5
        assert row["iqm_diff"] == pytest.approx(want["iqm_diff"], abs=1e-12)
        assert [row["iqm_diff_lo"], row["iqm_diff_hi"]] == pytest.approx(list(want["boot"]), abs=1e-12)
        assert row["poi"] == pytest.approx(want["poi"], abs=1e-12)
        assert [row["diff"], row["diff_lo"], row["diff_hi"]] == pytest.approx([want["diff"], want["lo"], want["hi"]])
        assert row["verdict"] == want["verdict"]
    assert smap.loc["GRPO+TROLL | stale k=4", "verdict"] == "better"
    worse, _ = synthetic_data(_spec({"stale k=4": -0.2}, seeds))
    assert st.score_map(worse, reps=REPS)["verdict"].tolist() == ["worse"]


def test_a_null_difference_with_enough_seeds_is_not_distinguishable():
    seeds = range(10)
    data, truth = synthetic_data(_spec({"on-policy": 0.0}, seeds, noise=0.005, seed_sd=0.0))
    row, want = st.score_map(data, reps=REPS).iloc[0], _expected(truth, "on-policy", seeds)
    assert want["verdict"] == row["verdict"] == "not distinguishable"
    assert -0.03 <= row["diff_lo"] <= 0 <= row["diff_hi"] <= 0.03
    # a narrower margin than the interval makes the same cell underpowered
    assert st.score_map(data, margin=abs(row["diff_lo"]) / 2, reps=REPS).iloc[0]["verdict"] == "underpowered"


def _mc_power(n: int, delta: float, sd: float, reps: int = 40000) -> float:
    """Monte Carlo power of the two-sided paired t-test at alpha 0.05 with n pairs ~ N(delta, sd^2)."""
    d = np.random.default_rng(n).normal(delta, sd, size=(reps, n))
    t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / np.sqrt(n))
    return float(np.mean(np.abs(t) > sst.t.ppf(0.975, n - 1)))


def test_too_few_seeds_is_underpowered_with_the_seeds_a_monte_carlo_power_estimate_confirms():
    seeds = range(3)
    data, truth = synthetic_data(_spec({"bfloat16 sampler": 0.08}, seeds))
    row, want = st.score_map(data, reps=REPS).iloc[0], _expected(truth, "bfloat16 sampler", seeds)
    assert want["verdict"] == row["verdict"] == "underpowered"
    need = int(row["seeds_needed"])
    assert row["diff_sd"] == pytest.approx(want["sd"])
    assert 3 < need < 200
    assert _mc_power(need, want["diff"], want["sd"]) >= 0.8 - 0.01
    assert _mc_power(need - 1, want["diff"], want["sd"]) < 0.8 + 0.01
    table = score_map_table(data, reps=REPS)
    assert table.display.iloc[0]["verdict"] == f"underpowered: needs {need} seeds (has 3)"
    one, _ = synthetic_data(_spec({"bfloat16 sampler": 0.08}, [0]))
    assert st.score_map(one, reps=REPS).iloc[0]["verdict"] == "too few seeds"


@pytest.mark.parametrize(
    "n,mean,lo,hi,expected",
    [(5, 0.03, 0.01, 0.05, "better"), (5, -0.03, -0.05, -0.01, "worse"), (5, 0.0, -0.02, 0.02, "not distinguishable"),
     (5, 0.01, -0.05, 0.07, "underpowered"), (1, 0.1, np.nan, np.nan, "too few seeds")],
)  # fmt: skip
def test_verdict_rule(n, mean, lo, hi, expected):
    assert st.verdict(n, mean, lo, hi, margin=0.03) == expected


def _s(values) -> pd.Series:
    return pd.Series(np.asarray(values, dtype=float), index=np.arange(1, len(values) + 1))


def test_each_indicator_fires_on_a_run_built_to_trigger_it_and_not_otherwise():
    t = np.arange(40)
    flat = 0.8 + 0.01 * np.sin(t)
    assert st.entropy_collapse(_s(0.8 * np.exp(-0.06 * t))) is True  # last quarter ~0.1 of the start
    assert st.entropy_collapse(_s(flat)) is False
    assert st.entropy_collapse(_s(0.8 * np.exp(-0.01 * t))) is False  # last quarter ~0.7 of the start
    rise = 0.6 * (1 - np.exp(-0.2 * t))
    fall = np.where(t < 20, rise, rise * np.clip(1 - (t - 20) / 12, 0.1, 1))
    assert st.reward_collapse(_s(fall)) is True
    assert st.reward_collapse(_s(rise)) is False
    assert st.reward_collapse(_s(np.where(t < 20, 0.08, 0.0))) is False  # best below the 0.1 floor
    assert st.gap_blowup(_s(0.002 * 50 ** (t / 40))) is True
    assert st.gap_blowup(_s(0.0001 * 50 ** (t / 40))) is False  # x50, but under the 0.01 floor
    assert st.gap_blowup(_s(np.full(40, 0.05))) is False  # large but steady
    pinned = np.clip(0.28 + 0.2 * t / 40, 0.2, 0.32)
    assert st.controller_pinned(_s(pinned), 0.2, 0.32) is True
    assert st.controller_pinned(_s(np.clip(0.28 + 0.03 * t / 40, 0.2, 0.32)), 0.2, 0.32) is False
    assert st.controller_pinned(_s(np.where(t % 2, 1e-4, -1e-4)), 1e-4, 0.05) is True  # REPO-R's sign flips
    # n/a: not logged, too short, caps unknown
    for fn in (st.entropy_collapse, st.reward_collapse, st.gap_blowup):
        assert fn(None) is None and fn(_s([1.0, 0.1, 0.1])) is None
    assert st.controller_pinned(_s(pinned), None, 0.32) is None


def test_indicators_per_arm_on_the_profile_and_na_where_a_metric_is_missing():
    data, _ = synthetic_data(profile("stability_map_cpu", steps=40, seeds=(0, 1, 2)))
    stab = st.stability(data)
    fired = {arm: r["fired"] for arm, r in stab.iterrows() if r["fired"]}
    assert fired == {"GRPO | stale k=4": "ERG", "ADAPO | stale k=4": "P", "REPO-R | stale k=4": "P"}
    assert stab.loc["GRPO | stale k=4", ["entropy_k", "entropy_n", "gap_k", "gap_n"]].tolist() == [3, 3, 3, 3]
    assert stab.loc["GRPO | on-policy", "gap_n"] == 0  # rollout_corr/kl not logged on-policy
    assert stab.loc["GRPO | stale k=4", "pinned_n"] == 0  # no controller
    table = stability_table(data)
    row = table.display.loc[("GRPO", "on-policy")]
    assert row["training-inference gap blow-up"] == "n/a" and row["controller pinned at a cap"] == "n/a"
    assert table.display.loc[("ADAPO", "stale k=4"), "controller pinned at a cap"] == "3 of 3"
    assert np.isnan(table.values.loc[("GRPO", "on-policy"), "training-inference gap blow-up"])


def test_regime_claims_read_the_score_map_and_check_the_paper_claims_per_regime():
    data, _ = synthetic_data(profile("stability_map_cpu", steps=40, seeds=(0, 1, 2, 3, 4)))
    table = regime_claims_table(data, reps=REPS)
    regimes = list(dict.fromkeys(table.display.index.get_level_values(0)))
    assert regimes == ["on-policy", "bfloat16 sampler", "stale k=4"]
    troll = table.display.loc[("stale k=4", "TROLL (arXiv 2510.03817) keeps its edge over GRPO: GRPO+TROLL")]
    assert troll["verdict"] == "better"
    claims = [c for c in table.display.index.get_level_values(1) if c.startswith("paper claim")]
    # per regime, the claims its runs can check (TROLL x2, TRM, REPO-R); the rest (no GTPO, DAPO or T-PPO run)
    # are left out rather than listed as "not checked"
    titles = {c.split(": ", 1)[1].split(" (arXiv")[0] for c in claims}
    assert titles == {"TROLL against Clip", "TROLL trust region", "TRM: non-vacuous bounds, stable training",
                      "REPO-R preserves entropy"}  # fmt: skip
    assert len(claims) == 3 * 4


@pytest.mark.slow
def test_the_stability_report_builds_end_to_end(tmp_path):
    from reports.build import build_report

    data, _ = synthetic_data(profile("stability_map_cpu", steps=20, seeds=(0, 1)))
    result = build_report(
        "stability_map_cpu", "sqlite:///unused.db", tmp_path, data=data, pdf=False, log_to_mlflow=False
    )
    assert [i.status for i in result.items] == ["ok"] * len(result.items)
    html = result.html.read_text()
    assert "arXiv 2504.07086" in html and "arXiv 2108.13264" in html
    assert {"score_map", "stability", "regime_claims"} <= {i.key for i in result.items}
    assert (tmp_path / "figures" / "score_map_heatmap.svg").exists()


def test_a_method_that_scored_exactly_as_grpo_on_every_seed_is_identical_not_just_indistinguishable():
    """On-policy, clipping and TRM's masks cannot act: the runs are GRPO's bit for bit. The map says so."""
    seeds = range(3)
    data, _ = synthetic_data(_spec({"on-policy": 0.0}, seeds))
    runs, metrics = data.runs.copy(), data.metrics.copy()
    method = f"tags.{metric_names.TAG_METHOD}"
    grpo_ids = runs.loc[runs[method] == "GRPO", "run_id"].astype(str)
    copy_of = dict(zip(runs.loc[runs[method] == "GRPO+TROLL", "run_id"].astype(str), grpo_ids))
    # GRPO+TROLL's runs get GRPO's metric points of the same seed
    points = metrics[metrics["run_id"].astype(str).isin(set(grpo_ids))]
    back = {g: t for t, g in copy_of.items()}
    cloned = points.assign(run_id=points["run_id"].astype(str).map(back))
    metrics = pd.concat([metrics[~metrics["run_id"].astype(str).isin(set(copy_of))], cloned], ignore_index=True)
    same = st.score_map(type(data)(runs, metrics), reps=REPS).iloc[0]
    assert same["verdict"] == st.IDENTICAL and same["diff"] == 0 and same["pairs"] == 3
    # one seed off by a little is no longer identical
    first = metrics["run_id"].astype(str) == next(iter(copy_of))
    metrics.loc[first & (metrics["metric"] == EVAL), "value"] += 1e-3
    assert st.score_map(type(data)(runs, metrics), reps=REPS).iloc[0]["verdict"] == st.NOT_DISTINGUISHABLE
