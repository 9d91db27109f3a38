"""The papers' numbers beside ours for arms that ran a paper table's setting (``analysis.paper_match``,
``analysis.tables.paper_match``), on hand-built sweeps with known final evaluations.

Independent references: the paper's numbers are read here from ``analysis/data/*.csv`` with the csv module
(as printed, not through ``analysis.paper_data``); ours are the last logged value of each run, averaged with
numpy (ddof 1); each run logs its preset's components as real runs do (``algorithm.components.<group>``), read
here from ``conf/algorithm/*.yaml``; the TROLL variants the matcher names are checked against
``conf/method/*_troll.yaml``."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from analysis.frames import ExperimentData, normalize_metrics
from analysis.names import algorithm_name
from analysis.paper_match import COMPONENT_GROUPS, TROLL_OF, paper_matches
from analysis.skip import SkipItem
from analysis.synthetic import profile, synthetic_data
from analysis.tables.paper_match import paper_numbers_table
from runners import metric_names

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "analysis" / "data"
STEPS = (0, 10, 20)
SEEDS = (0, 1, 2)


def paper_csv(name: str) -> list[dict[str, str]]:
    """The rows of analysis/data/<name>.csv as printed (``#`` header lines dropped)."""
    lines = [line for line in (DATA / f"{name}.csv").read_text().splitlines() if not line.startswith("#")]
    return list(csv.DictReader(lines))


def paper_cell(name: str, **keys: str) -> dict[str, str]:
    (row,) = [r for r in paper_csv(name) if all(r[k] == v for k, v in keys.items())]
    return row


def tags(algorithm: str, objective: str, estimator: str, **more: str) -> dict[str, str]:
    out = {
        metric_names.TAG_MODEL: "qwen3_8b",
        metric_names.TAG_DATASET: "dapo_math",
        metric_names.TAG_ALGORITHM: algorithm,
        metric_names.TAG_OBJECTIVE: objective,
        metric_names.TAG_ESTIMATOR: estimator,
        metric_names.TAG_MASK: "none",
        metric_names.TAG_ENTROPY_CONTROL: "none",
        metric_names.TAG_ROLLOUT_CORRECTION: "none",
        metric_names.TAG_REGIME: "1 epoch x 8 mini-batches",
    }
    out.update(more)
    return out


GRPO = tags("grpo", "clip", "grpo")
GRPO_TROLL = tags("grpo", "troll", "grpo")


def sweep(arms: dict[str, dict[str, str]], evals=("dapo_math",), n: int = 4, run_tags=None):
    """ExperimentData of ``arms`` ({label: tags}) x SEEDS, each evaluating ``evals`` (mean_at_n) at STEPS with
    values drawn from a seeded generator, and {(label, metric): [last value per seed]}.
    ``run_tags`` ({(label, seed): tags}) overrides the tags of single runs."""
    rng = np.random.default_rng(7)
    runs, points, last = [], [], {}
    for label, arm_tags in arms.items():
        for seed in SEEDS:
            rid = f"{label}-s{seed}"
            t = {**arm_tags, metric_names.TAG_METHOD: label, metric_names.TAG_SEED: str(seed)}
            t.update((run_tags or {}).get((label, seed), {}))
            runs.append({"run_id": rid, "experiment": "mine", "run_name": rid, "status": "FINISHED",
                         **{f"tags.{k}": v for k, v in t.items()},
                         **{f"params.algorithm.components.{g}": c for g, c in components(t).items()}})  # fmt: skip
            for data in evals:
                metric = metric_names.val_acc_mean(data, n)
                values = rng.uniform(0.1, 0.9, size=len(STEPS))
                points.append(pd.DataFrame({"run_id": rid, "metric": metric, "step": STEPS, "value": values,
                                            "timestamp": np.arange(len(STEPS))}))  # fmt: skip
                last.setdefault((label, metric), []).append(float(values[-1]))
    metrics = normalize_metrics(pd.concat(points, ignore_index=True))
    return ExperimentData(runs=pd.DataFrame(runs), metrics=metrics), last


def components(run_tags: dict[str, str]) -> dict[str, str]:
    """The components a run of ``run_tags``' algorithm preset logs: those its conf/algorithm YAML selects (none
    for a preset that does not exist)."""
    from omegaconf import OmegaConf

    from runners.config import preset_components

    return OmegaConf.to_container(preset_components(run_tags[metric_names.TAG_ALGORITHM]))


def ours_text(values: list[float]) -> str:
    x = np.asarray(values)
    return f"{x.mean():.3f} ± {x.std(ddof=1):.3f}"


def rows_of(table, arm: str) -> pd.DataFrame:
    return table.display.xs(arm, level="Arm")


# -- (a) a user's sweep of Qwen3-8B with GRPO, Clip and TROLL, on DAPO-Math -----------------------------
def test_troll_table1_cells_print_the_papers_number_beside_ours():
    data, last = sweep({"GRPO": GRPO, "GRPO+TROLL": GRPO_TROLL})
    table = paper_numbers_table(data)
    metric = metric_names.val_acc_mean("dapo_math", 4)
    for arm, objective in (("GRPO", "Clip"), ("GRPO+TROLL", "TROLL")):
        rows = rows_of(table, arm)
        (row,) = [r for key, r in rows.iterrows() if key[1] == "TROLL (arXiv 2510.03817) Table 1"]
        cell = paper_cell("troll_table1", model="Qwen3-8B", split="DAPO Eval", objective=objective, method="GRPO")
        assert row[("score", "paper")] == cell["value"]  # "0.640", "0.691": as printed
        assert row[("score", "ours")] == ours_text(last[(arm, metric)])
        assert row[("seeds", "ours")] == "3" and row[("evaluated at", "ours")] == "step 20"
    index = table.display.index
    assert set(index.get_level_values("Evaluation")) == {metric}
    assert set(index.get_level_values("Paper setting")) == {
        "Qwen3-8B, GRPO, Clip, DAPO Eval",
        "Qwen3-8B, GRPO, TROLL, DAPO Eval",
    }  # no MATH Eval (not logged), never DAPO Train (training success, not an evaluation)
    assert table.values[("score", "paper")].tolist() == [0.640, 0.691]


def test_the_paper_column_is_italic_and_triggers_the_legend():
    data, _ = sweep({"GRPO": GRPO})
    table = paper_numbers_table(data)
    # reports/build.py: the legend mentions the papers' numbers when a table has a column named "paper"
    assert any("paper" in str(c) for c in table.display.columns)
    html = table.to_html()
    value = paper_cell("troll_table1", model="Qwen3-8B", split="DAPO Eval", objective="Clip", method="GRPO")["value"]
    assert f'<td class="paper">{value}</td>' in html  # report.css: td.paper is italic
    assert "last logged evaluation" in table.caption and "DAPO-Math" in table.caption


def test_an_arm_whose_runs_disagree_is_not_matched_and_named():
    data, _ = sweep(
        {"GRPO": GRPO, "GRPO+TROLL": GRPO_TROLL},
        run_tags={("GRPO+TROLL", 2): {metric_names.TAG_DATASET: "gsm8k"}},
    )
    table = paper_numbers_table(data)
    assert set(table.display.index.get_level_values("Arm")) == {"GRPO"}
    assert any("GRPO+TROLL" in note for note in table.notes)


# -- (b) near misses: one key differs, nothing is printed -----------------------------------------------
NEAR_MISSES = {
    "another model size": tags("grpo", "clip", "grpo", model="qwen3_4b"),
    "the base model": tags("grpo", "clip", "grpo", model="qwen3_8b_base"),
    "another estimator": tags("grpo", "clip", "rloo"),
    "another objective": tags("grpo", "token_is", "grpo"),
    "a mask": tags("grpo", "clip", "grpo", mask="trm_max"),
    "an entropy control": tags("grpo", "clip", "grpo", entropy_control="repo_r"),
    "a rollout correction": tags("grpo", "clip", "grpo", rollout_correction="token_tis"),
    "other training data": tags("grpo", "clip", "grpo", dataset="gsm8k"),
    "stale rollouts": tags("grpo", "troll", "grpo", regime="stale k=2"),
    "a bf16 sampler": tags("grpo", "clip", "grpo", regime="bfloat16 sampler"),
    "GSPO with a token clip": tags("gspo", "clip", "grpo"),
    "GSPO with token TROLL": tags("gspo", "troll", "grpo"),
    "a method no paper has": tags("gtpo", "gtpo", "grpo"),
}


@pytest.mark.parametrize("what", sorted(NEAR_MISSES))
def test_a_near_miss_prints_nothing(what):
    evals = ("dapo_math", "math500", "aime24", "aime25")
    if what == "other training data":  # Entropy-preserving RL's AIME tables do not name theirs (next test)
        evals = ("dapo_math", "math500")
    data, _ = sweep({"arm": NEAR_MISSES[what]}, evals=evals)
    assert paper_matches(data).empty
    with pytest.raises(SkipItem, match="no arm's model, method, objective and evaluation set match"):
        paper_numbers_table(data)


def test_training_data_is_a_key_only_where_the_paper_names_it():
    data, _ = sweep({"GRPO": tags("grpo", "clip", "grpo", dataset="gsm8k")}, evals=("aime24", "math500"))
    table = paper_numbers_table(data)
    assert set(table.display.index.get_level_values("Paper table")) == {
        "Entropy-preserving RL (arXiv 2603.11682) Table 3"
    }  # not TROLL's Table 4 (trained on DAPO-Math)
    assert "the training data (the tables name only the AIME evaluation)" in table.caption


@pytest.mark.parametrize("evals", [("gsm8k",), ("dapo_math_hard",), ("aime",), ("math_suite",)])
def test_an_evaluation_set_named_otherwise_is_not_the_papers(evals):
    data, _ = sweep({"GRPO": GRPO}, evals=evals)
    with pytest.raises(SkipItem):
        paper_numbers_table(data)


def test_the_same_arm_matches_only_the_benchmarks_it_logged():
    data, _ = sweep({"GRPO": GRPO, "GTPO": tags("gtpo", "gtpo", "grpo")}, evals=("gsm8k", "dapo_math"))
    matches = paper_matches(data)
    assert set(matches["arm"]) == {"GRPO"} and set(matches["benchmark"]) == {"DAPO Eval"}


# -- (c) TROLL Table 4, Entropy-preserving RL Tables 1-4, T-PPO Table 1 ----------------------------------
def test_troll_table4_per_benchmark():
    ppo_troll = tags("ppo", "troll", "gae", model="Qwen/Qwen2.5-7B-Instruct")
    data, last = sweep({"PPO+TROLL": ppo_troll}, evals=("math500", "aime24", "gsm8k"))
    table = paper_numbers_table(data)
    rows = rows_of(table, "PPO+TROLL")
    assert set(rows.index.get_level_values("Paper table")) == {"TROLL (arXiv 2510.03817) Table 4"}
    for data_name, bench in (("math500", "MATH"), ("aime24", "AIME24")):
        metric = metric_names.val_acc_mean(data_name, 4)
        (row,) = [r for key, r in rows.iterrows() if key[0] == metric]
        cell = paper_cell("troll_table4", model="Qwen2.5-7B-Instruct", method="PPO", objective="TROLL", benchmark=bench)
        assert row[("score", "paper")] == cell["value"]
        assert row[("score", "ours")] == ours_text(last[("PPO+TROLL", metric)])
    assert len(rows) == 2  # gsm8k is no benchmark of the papers' tables


def test_gspo_matches_with_its_own_objectives():
    data, _ = sweep({"GSPO": tags("gspo", "gspo", "grpo"), "GSPO+TROLL": tags("gspo", "troll_seq", "grpo")})
    matches = paper_matches(data, tables=["troll_table1"]).set_index("arm")
    for arm, objective in (("GSPO", "Clip"), ("GSPO+TROLL", "TROLL")):
        cell = paper_cell("troll_table1", model="Qwen3-8B", split="DAPO Eval", objective=objective, method="GSPO")
        assert matches.loc[arm, "value"] == float(cell["value"]) and matches.loc[arm, "objective"] == objective


def test_entropy_aime_tables_and_troll_table4_for_the_same_arm():
    data, last = sweep({"GRPO": GRPO}, evals=("aime24",))
    rows = rows_of(paper_numbers_table(data), "GRPO")
    by_table = {key[1]: r for key, r in rows.iterrows()}
    assert set(by_table) == {"TROLL (arXiv 2510.03817) Table 4", "Entropy-preserving RL (arXiv 2603.11682) Table 3"}
    mean = paper_cell("entropy_tables", table="3", algorithm="GRPO", test_set="AIME 2024", stat="mean")["value"]
    std = paper_cell("entropy_tables", table="3", algorithm="GRPO", test_set="AIME 2024", stat="std")["value"]
    assert by_table["Entropy-preserving RL (arXiv 2603.11682) Table 3"][("score", "paper")] == f"{mean} ± {std}"
    aime = paper_cell("troll_table4", model="Qwen3-8B", method="GRPO", objective="Clip", benchmark="AIME24")["value"]
    assert by_table["TROLL (arXiv 2510.03817) Table 4"][("score", "paper")] == aime


def test_entropy_tables_for_an_entropy_controller_on_qwen3_32b():
    adapo = tags("adapo", "dapo_clip", "grpo", model="qwen3_32b", entropy_control="adapo")
    data, last = sweep({"ADAPO": adapo}, evals=("aime24", "aime25"))
    table = paper_numbers_table(data)
    rows = rows_of(table, "ADAPO")
    assert set(rows.index.get_level_values("Paper table")) == {"Entropy-preserving RL (arXiv 2603.11682) Table 4"}
    for data_name, test_set in (("aime24", "AIME 2024"), ("aime25", "AIME 2025")):
        metric = metric_names.val_acc_mean(data_name, 4)
        (row,) = [r for key, r in rows.iterrows() if key[0] == metric]
        keys = dict(table="4", algorithm="ADAPO", test_set=test_set)
        paper = f"{paper_cell('entropy_tables', stat='mean', **keys)['value']} ± {paper_cell('entropy_tables', stat='std', **keys)['value']}"
        assert row[("score", "paper")] == paper
        assert row[("score", "ours")] == ours_text(last[("ADAPO", metric)])
    assert "best checkpoint" in table.caption  # the paper's statistic differs from our final value


def test_entropy_appworld_tables_need_appworld_training():
    gspo = tags("gspo", "gspo", "grpo", dataset="appworld")
    data, _ = sweep({"GSPO": gspo}, evals=("test_normal", "test_challenge"))
    matches = paper_matches(data).set_index("benchmark")
    assert set(matches["title"]) == {"Entropy-preserving RL (arXiv 2603.11682) Table 1"}
    for test_set in ("Test Normal", "Test Challenge"):
        keys = dict(table="1", algorithm="GSPO", test_set=test_set)
        assert matches.loc[test_set, "value"] == float(paper_cell("entropy_tables", stat="mean", **keys)["value"])
        assert matches.loc[test_set, "std"] == float(paper_cell("entropy_tables", stat="std", **keys)["value"])
    elsewhere, _ = sweep({"GSPO": {**gspo, metric_names.TAG_DATASET: "dapo_math"}}, evals=("test_normal",))
    assert paper_matches(elsewhere).empty


def test_tppo_table1_only_its_own_row():
    tppo = tags("tppo", "dapo_clip", "egae", model="qwen2.5_32b")
    dapo = tags("dapo", "dapo_clip", "grpo", model="qwen2.5_32b")
    data, _ = sweep({"T-PPO": tppo, "DAPO": dapo}, evals=("aime24",), n=32)
    matches = paper_matches(data)
    assert matches["arm"].tolist() == ["T-PPO"]  # its DAPO row is the DAPO system, not our preset
    pct = paper_cell("tppo_table1", method="T-PPO")["aime24_avg32_pct"]
    assert matches["value"].iloc[0] == pytest.approx(float(pct) / 100)
    assert rows_of(paper_numbers_table(data), "T-PPO")[("score", "paper")].iloc[0] == f"{float(pct) / 100:.2f}"


# -- (d) the demo and the stability map: embedded model, nothing matches -------------------------------
@pytest.mark.parametrize("shape", ["demo", "stability_map"])
def test_embedded_sweeps_skip(shape):
    data, _ = synthetic_data(profile(shape, steps=20, seeds=(0, 1)))
    with pytest.raises(SkipItem, match="TROLL Table 1/4"):
        paper_numbers_table(data)


# -- the preset's components come from the runs; the TROLL variants from the configuration ------------------
def test_runs_that_did_not_log_their_presets_components_are_not_matched():
    data, _ = sweep({"GRPO": GRPO})
    assert not paper_matches(data).empty
    runs = data.runs.drop(columns=[f"params.algorithm.components.{g}" for g in COMPONENT_GROUPS])
    assert paper_matches(ExperimentData(runs=runs, metrics=data.metrics)).empty


def _overrides(path: Path) -> dict[str, str]:
    out = {}
    for entry in yaml.safe_load(path.read_text()).get("defaults", []):
        if isinstance(entry, dict):
            for key, value in entry.items():
                out[key.replace("override /", "")] = value
    return out


@pytest.mark.parametrize("path", sorted((ROOT / "conf" / "method").glob("*_troll.yaml")), ids=lambda p: p.stem)
def test_troll_variants_match_the_configuration(path):
    algorithm = path.stem.removesuffix("_troll")
    own = components({metric_names.TAG_ALGORITHM: algorithm})["objective"]
    assert _overrides(path)["objective"] == TROLL_OF.get(own, "troll")
    names = {r.get("method") or r.get("algorithm") for t in ("troll_table1", "entropy_tables", "tppo_table1")
             for r in paper_csv(t)}  # fmt: skip
    assert algorithm_name(algorithm) in names  # a method of a paper table
