"""Reproduced tables: "ours" numbers against values computed here with numpy from the known synthetic
curves (what was logged), "paper" numbers against the paper text, and the renderers.

TROLL Table 1 and the entropy table go through a real MLflow store (``store`` fixture); the others
use the same curves built in memory (``analysis.synthetic.synthetic_data``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from analysis.load import load_experiment
from analysis.names import eval_metrics
from analysis.synthetic import SyntheticSpec, _m, profile, synthetic_data
from analysis.tables.entropy import entropy_table
from analysis.tables.generic import config_diff_table, eval_start_end_table, final_metrics_table, overview_table
from analysis.tables.tppo import tppo_table1
from analysis.tables.trm import fit_violation_p, trm_acceptance_table, trm_bounds_table, trm_table_d1
from analysis.tables.troll import troll_table1, troll_table4, troll_table5
from runners import metric_names


def _curve(truth, label, seed, metric):
    return truth[(label, seed)]["curves"][metric]


def test_troll_table1_matches_numpy_on_logged_curves(store):
    spec, truth = store.specs["troll_table1"], store.truth["troll_table1"]
    table = troll_table1(load_experiment("troll_table1", store.uri, cache_dir=None), last_n_train=7)
    # training: mean of the last 7 steps; evaluations: each run's last evaluation (not a mean of the last few)
    splits = {
        "DAPO Train": (metric_names.SCORE_MEAN, 7),
        "DAPO Eval": (metric_names.val_acc_mean("dapo_math"), 1),  # the in-domain eval (named like the training data)
        "MATH Eval": (metric_names.val_acc_mean("math_eval"), 1),
    }
    checked = 0
    for method in spec.methods:
        algo = {"grpo": "GRPO", "gspo": "GSPO"}[method.tags["algorithm"]]
        objective = "TROLL" if method.tags["objective"].startswith("troll") else "Clip"
        for split, (metric, n) in splits.items():
            finals = [np.mean(_curve(truth, method.label, s, metric)[1][-n:]) for s in spec.seeds]
            cell = ("qwen3_8b", algo), (split, objective, "ours")
            assert table.values.loc[cell] == pytest.approx(np.mean(finals), abs=1e-12)
            assert table.aux["std"].loc[cell] == pytest.approx(np.std(finals, ddof=1), abs=1e-12)
            checked += 1
    assert checked == 12
    last = int(_curve(truth, spec.methods[0].label, spec.seeds[0], metric_names.val_acc_mean("math_eval"))[0][-1])
    assert f"evaluations: the last evaluation (DAPO Eval at step {last}, MATH Eval at step {last})" in table.caption
    # the paper's numbers (TROLL, arXiv 2510.03817, Table 1, Qwen3-8B; our model tag qwen3_8b matches it)
    paper = table.values.xs("paper", axis=1, level="source")
    assert paper.loc[("qwen3_8b", "GSPO"), ("DAPO Train", "Clip")] == 0.0
    assert paper.loc[("qwen3_8b", "GSPO"), ("DAPO Train", "TROLL")] == 0.736
    assert paper.loc[("qwen3_8b", "GRPO"), ("MATH Eval", "TROLL")] == 0.551
    assert paper.loc[("qwen3_8b", "GRPO"), ("DAPO Eval", "Clip")] == 0.640


def test_entropy_table_matches_numpy_on_logged_curves(store):
    spec, truth = store.specs["entropy_tables"], store.truth["entropy_tables"]
    table = entropy_table(load_experiment("entropy_tables", store.uri, cache_dir=None))
    assert table.reproduces == "Entropy-preserving RL (arXiv 2603.11682) Table 3"  # AIME evaluations, Qwen3-8B
    a24, a25 = metric_names.val_acc_mean("aime24"), metric_names.val_acc_mean("aime25")
    for method in spec.methods:
        at_best = {a24: [], a25: []}
        best_any = {a24: -np.inf, a25: -np.inf}
        dh, rel = [], []
        for s in spec.seeds:
            steps, v24 = _curve(truth, method.label, s, a24)
            _, v25 = _curve(truth, method.label, s, a25)
            i = int(np.argmax((v24 + v25) / 2))  # AIME rule: highest mean of the two test sets
            at_best[a24].append(v24[i])
            at_best[a25].append(v25[i])
            best_any[a24], best_any[a25] = max(best_any[a24], v24.max()), max(best_any[a25], v25.max())
            e_steps, ent = _curve(truth, method.label, s, metric_names.ENTROPY)
            h = ent[e_steps <= max(steps[i], e_steps[0])][-1]
            dh.append(h - ent[0])
            rel.append((h - ent[0]) / ent[0])
        row = method.label
        for name, metric in (("AIME 2024", a24), ("AIME 2025", a25)):
            assert table.values.loc[row, (name, "mean ± std", "ours")] == pytest.approx(
                np.mean(at_best[metric]), abs=1e-12
            )
            assert table.aux["std"].loc[row, (name, "mean ± std", "ours")] == pytest.approx(
                np.std(at_best[metric], ddof=1), abs=1e-12
            )
            assert table.values.loc[row, (name, "best", "ours")] == pytest.approx(best_any[metric], abs=1e-12)
        assert table.values.loc[row, ("ΔH", "", "ours")] == pytest.approx(np.mean(dh), abs=1e-12)
        assert table.aux["relative"].loc[row, ("ΔH", "", "ours")] == pytest.approx(np.mean(rel), abs=1e-12)
    # Entropy-preserving RL (arXiv 2603.11682) Table 3 (Qwen-3-8B, AIME): DAPO 0.43 ± 0.01, best 0.44, ΔH +0.23 (+158%)
    assert table.values.loc["DAPO", ("AIME 2024", "mean ± std", "paper")] == 0.43
    assert table.aux["std"].loc["DAPO", ("AIME 2024", "mean ± std", "paper")] == 0.01
    assert table.values.loc["DAPO", ("AIME 2024", "best", "paper")] == 0.44
    assert table.values.loc["DAPO", ("ΔH", "", "paper")] == 0.23
    assert table.aux["relative"].loc["DAPO", ("ΔH", "", "paper")] == pytest.approx(1.58)
    assert table.display.loc["DAPO", ("ΔH", "", "paper")] == "+0.23 (+158%)"


def test_troll_table4_and_table5_match_numpy():
    spec = SyntheticSpec(
        "t45",
        [
            _m("GRPO", "grpo"),
            _m("GRPO+TROLL", "grpo", "troll", final=0.7),
            _m("GRPO+TROLL (chunked)", "grpo", "troll", params={"algorithm.troll.chunk_size": 1024}),
        ],
        seeds=(0, 1),
        steps=20,
        eval_every=5,
        eval_sets=("aime24", "math500", "olympiadbench"),
        model="Qwen/Qwen3-1.7B",
    )
    data, truth = synthetic_data(spec)
    t4 = troll_table4(data)  # each run's last evaluation
    assert "each run's last evaluation (step 20)" in t4.caption
    for label, objective in (("GRPO", "Clip"),):
        for bench, metric in (("AIME24", "aime24"), ("MATH", "math500"), ("Olympiad", "olympiadbench")):
            expect = np.mean([_curve(truth, label, s, metric_names.val_acc_mean(metric))[1][-1] for s in spec.seeds])
            assert t4.values.loc[("Qwen/Qwen3-1.7B", "GRPO", objective), (bench, "ours")] == pytest.approx(
                expect, abs=1e-12
            )
    assert np.isnan(t4.values.loc[("Qwen/Qwen3-1.7B", "GRPO", "Clip"), ("AMC", "ours")])  # not logged
    # Qwen3-1.7B is not in Table 4: the paper column falls back to Qwen3-8B and says so
    assert t4.values.loc[("Qwen/Qwen3-1.7B", "GRPO", "Clip"), ("AIME24", "paper")] == 0.439
    assert any("not in the paper" in n for n in t4.notes)

    t5 = troll_table5(data)
    col = ("Qwen/Qwen3-1.7B", "ours")
    mem = {
        lab: np.mean([_curve(truth, lab, s, metric_names.MAX_MEMORY_ALLOCATED_GB)[1].max() for s in spec.seeds])
        for lab in ("GRPO", "GRPO+TROLL (chunked)")
    }
    step = {
        lab: np.mean([_curve(truth, lab, s, metric_names.TIMING_STEP)[1][1:].mean() for s in spec.seeds])
        for lab in ("GRPO", "GRPO+TROLL (chunked)")
    }
    assert t5.values.loc[("VRAM", "Clip"), col] == pytest.approx(mem["GRPO"], abs=1e-12)
    assert t5.values.loc[("VRAM", "TROLL Chunked"), col] == pytest.approx(mem["GRPO+TROLL (chunked)"], abs=1e-12)
    assert t5.values.loc[("VRAM", "Delta"), col] == pytest.approx(mem["GRPO+TROLL (chunked)"] - mem["GRPO"], abs=1e-12)
    assert t5.values.loc[("Runtime", "Delta"), col] == pytest.approx(
        step["GRPO+TROLL (chunked)"] - step["GRPO"], abs=1e-12
    )
    # TROLL (arXiv 2510.03817) Table 5, Qwen3-1.7B: VRAM (Clip) 28.418 GiB, Runtime Delta (Chunked) +7.257 s (+16.7%)
    assert t5.values.loc[("VRAM", "Clip"), ("Qwen/Qwen3-1.7B", "paper")] == 28.418
    assert t5.display.loc[("Runtime", "Delta"), ("Qwen/Qwen3-1.7B", "paper")] == "+7.257 s (+16.7%) [Chunked]"


def test_tppo_table1_matches_numpy_and_lists_the_papers_rows():
    spec = profile("tppo_table1", steps=20, seeds=(0, 1))
    data, truth = synthetic_data(spec)
    table = tppo_table1(data)  # each run's last evaluation
    metric = metric_names.val_acc_mean("aime24")
    assert "each run's last evaluation (step 20)" in table.caption
    for label in ("PPO", "T-PPO"):
        expect = np.mean([100 * _curve(truth, label, s, metric)[1][-1] for s in spec.seeds])
        assert table.values.loc[label, ("AIME24 avg@1 (%)", "ours")] == pytest.approx(expect, abs=1e-9)
    t = {
        lab: np.mean([_curve(truth, lab, s, metric_names.TIMING_STEP)[1][1:].mean() for s in spec.seeds])
        for lab in ("PPO", "T-PPO")
    }
    assert table.values.loc["T-PPO", ("time vs PPO", "ours")] == pytest.approx(t["T-PPO"] / t["PPO"], abs=1e-12)
    # T-PPO (arXiv 2506.15050) Table 1: all six published rows, T-PPO 62, VAPO 60, DeepSeek-R1-Zero-Qwen-32B 47
    assert list(table.values.index[:6]) == ["DeepSeek-R1-Zero-Qwen-32B", "DAPO", "VAPO", "GePPO", "PPO-EWMA", "T-PPO"]
    assert table.values.loc["T-PPO", ("AIME24 avg@1 (%)", "paper")] == 62
    assert table.values.loc["VAPO", ("AIME24 avg@1 (%)", "paper")] == 60
    assert np.isnan(table.values.loc["VAPO", ("AIME24 avg@1 (%)", "ours")])


def test_trm_table_d1_agrees_with_the_paper():
    """(1 - p)^T vs TRM (arXiv 2512.23075) Table D.1 as printed (some entries truncated: tolerance 1e-3)."""
    table = trm_table_d1()
    ours = table.values.xs("ours", axis=1, level="source")
    paper = table.values.xs("paper", axis=1, level="source")
    both = paper.notna()
    assert both.sum().sum() == 9  # the p = 1e-3, T = 16384 cell is empty in the paper
    np.testing.assert_allclose(
        ours[both].to_numpy(dtype=float)[both.to_numpy()], paper[both].to_numpy(dtype=float)[both.to_numpy()], atol=1e-3
    )
    assert paper.loc["p = 0.0001", "T = 16384"] == 0.194


def test_trm_bounds_table_agrees_with_the_paper():
    table = trm_bounds_table()
    ours = table.values.xs("ours", axis=1, level="source")
    paper = table.values.xs("paper", axis=1, level="source")
    small = ours.columns[0]
    # TRM (arXiv 2512.23075) section 6.3: classical 1677, Pinsker-Marginal 35.0, Mixed 8.2, linear 115.9 (T=4096, delta=1e-4, D_seq=0.01)
    for bound, value in (("Classical (TRPO)", 1677), ("Pinsker-Marginal", 35.0), ("Mixed", 8.2), ("Linear", 115.9)):
        assert paper.loc[bound, small] == value
        assert ours.loc[bound, small] == pytest.approx(value, rel=3e-3)
    np.testing.assert_allclose(ours.to_numpy(dtype=float), paper.to_numpy(dtype=float), rtol=3e-3)


def test_trm_acceptance_table_fits_the_iid_model():
    spec = profile("trm_acceptance", steps=12, seeds=(0, 1))
    data, truth = synthetic_data(spec)
    table = trm_acceptance_table(data)
    for method in spec.methods:
        row = table.values.loc[(method.label, "measured")]
        for col in table.values.columns[:-1]:
            lo, hi = (int(x) for x in col.strip("[)").split(", "))
            expect = np.mean(
                [
                    _curve(truth, method.label, s, metric_names.trm_accept_rate_bucket(lo, hi))[1].mean()
                    for s in spec.seeds
                ]
            )
            assert row[col] == pytest.approx(expect, abs=1e-12)
        # the fitted p: least squares of log(acceptance) = T_mid log(1 - p) through the origin (numpy lstsq)
        mids = np.array([np.mean([int(x) for x in c.strip("[)").split(", ")]) for c in table.values.columns[:-1]])
        acc = row.iloc[:-1].to_numpy(dtype=float)
        ok = acc > 0
        slope = np.linalg.lstsq(mids[ok, None], np.log(acc[ok]), rcond=None)[0][0]
        assert table.values.loc[(method.label, "i.i.d. fit"), "fitted p"] == pytest.approx(1 - np.exp(slope), rel=1e-9)
        if method.violation_p <= 1e-4:  # acceptance far from 0 in every bucket: the fit recovers the generating p
            assert 1 - np.exp(slope) == pytest.approx(method.violation_p, rel=0.2)


def test_fit_violation_p_inverts_the_model():
    T = np.array([128.0, 640.0, 2560.0])
    assert fit_violation_p(T, (1 - 3e-4) ** T) == pytest.approx(3e-4, rel=1e-9)


def test_generic_tables():
    spec = profile("demo", steps=10, seeds=(0, 1))
    spec = replace(spec, methods=spec.methods[:2])  # GRPO with Clip and with TROLL
    data, truth = synthetic_data(spec)
    over = overview_table(data)
    assert over.values.loc["GRPO+TROLL", "runs"] == 2
    final = final_metrics_table(data, metrics=[metric_names.SCORE_MEAN], last_n=3)
    expect = [np.mean(_curve(truth, "GRPO", s, metric_names.SCORE_MEAN)[1][-3:]) for s in spec.seeds]
    assert final.values.loc[metric_names.SCORE_MEAN, "GRPO"] == pytest.approx(np.mean(expect), abs=1e-12)
    assert final.aux["std"].loc[metric_names.SCORE_MEAN, "GRPO"] == pytest.approx(np.std(expect, ddof=1), abs=1e-12)
    diff = config_diff_table(data)
    # the only params that differ (seed is left out): the objective and its eps (clip range vs trust region)
    assert set(diff.values.index) == {"algorithm.objective", "objective.eps"}
    assert diff.values.loc["algorithm.objective", "GRPO+TROLL"] == "troll"
    assert (diff.values.loc["objective.eps", "GRPO"], diff.values.loc["objective.eps", "GRPO+TROLL"]) == ("0.2", "0.05")


def test_eval_start_end_table_matches_numpy():
    """First and last evaluation of each run, their difference, averaged over seeds (numpy on the known curves)."""
    spec = profile("demo", steps=10, seeds=(0, 1))
    data, truth = synthetic_data(spec)
    table = eval_start_end_table(data)
    (dataset, metric), *_ = sorted(eval_metrics(data.metric_names()).items())
    for label in ("GRPO", "GRPO+TROLL"):
        curves = [_curve(truth, label, s, metric)[1] for s in spec.seeds]
        starts, ends = [c[0] for c in curves], [c[-1] for c in curves]
        assert table.values.loc[label, (dataset, "start")] == pytest.approx(np.mean(starts), abs=1e-12)
        assert table.values.loc[label, (dataset, "end")] == pytest.approx(np.mean(ends), abs=1e-12)
        assert table.values.loc[label, (dataset, "change")] == pytest.approx(np.mean(ends) - np.mean(starts), abs=1e-12)


def test_renderers_escape_and_mark_sources():
    table = trm_table_d1()
    html = table.to_html()
    assert html.count('<td class="paper">') == table.values.shape[0] * table.values.shape[1] // 2
    assert 'colspan="2"' in html
    md = table.to_markdown()
    assert "| violation prob. | T = 256 / ours | T = 256 / paper |" in md
    tex = troll_table5(synthetic_data(profile("troll_table5", steps=6, seeds=(0,)))[0]).to_latex()
    body = "\n".join(line for line in tex.splitlines() if not line.startswith(r"\label"))
    assert r"\multicolumn{2}{c}" in tex and r"\%" in tex and r"perf/max\_memory\_allocated\_gb" in tex
    assert "_" not in body.replace(r"\_", "")  # every underscore escaped outside the label
