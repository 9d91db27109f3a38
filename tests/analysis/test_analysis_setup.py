"""The setup box: every row read from the runs' logged config, shared values shown once, differing ones
listed with their run counts, nothing assumed where a run logged nothing."""

from __future__ import annotations

import pandas as pd

from analysis.frames import ExperimentData, empty_metrics
from analysis.tables.setup import setup_table
from runners import metric_names

BASE = {
    "model.name": "embedded",
    "model.params_b": "0.001",
    "model.dtype": "float32",
    "dataset.name": "embedded",
    "dataset.train_limit": "512",
    "dataset.eval_limit": "128",
    "trainer.eval_every": "10",
    "trainer.eval_n": "4",
    "trainer.eval_temperature": "1.0",
    "trainer.total_steps": "20",
    "trainer.prompts_per_step": "16",
    "trainer.n": "8",
    "trainer.mini_batch_prompts": "8",
    "trainer.ppo_epochs": "2",
    "trainer.lr": "0.0001",
    "trainer.grad_clip": "1.0",
    "trainer.kl_coef": "0.0",
    "rollout.max_response_length": "48",
    "rollout.max_prompt_length": "64",
    "rollout.temperature": "1.0",
    "rollout.staleness": "1",
    "rollout.dtype": "auto",
    "backend.name": "local",
    "backend.device": "auto",
    "backend.num_threads": "1",
}


def _data(per_run: list[dict[str, str]], regimes: list[str], sweep: str = "no_such_sweep") -> ExperimentData:
    rows = []
    for i, (params, regime) in enumerate(zip(per_run, regimes)):
        row = {
            "run_id": f"r{i}",
            "experiment": "x",
            "run_name": f"r{i}",
            "status": "FINISHED",
            f"tags.{metric_names.TAG_METHOD}": "GRPO" if i % 2 == 0 else "GRPO+TROLL",
            f"tags.{metric_names.TAG_SEED}": str(i // 2),
            f"tags.{metric_names.TAG_REGIME}": regime,
            f"tags.{metric_names.TAG_HOST}": "node7",
            f"tags.{metric_names.TAG_SWEEP}": sweep,
            f"tags.{metric_names.TAG_GIT_REVISION}": "abc123",
            f"tags.{metric_names.TAG_PACKAGE_VERSION}": "0.1.0",
        }
        row.update({f"params.{k}": v for k, v in params.items()})
        rows.append(row)
    return ExperimentData(pd.DataFrame(rows), empty_metrics())


def test_shared_settings_are_stated_once_from_the_logged_config():
    table = setup_table(_data([BASE] * 4, ["stale k=1"] * 4)).display["setting"]
    assert table["Model"] == "embedded (0.001 B parameters, float32)"
    assert table["Updates"].startswith("2 epoch(s) x 2 mini-batch(es) per step, AdamW lr 0.0001")
    assert table["Sampler"].startswith("1 iteration(s) behind")
    assert table["Evaluation"].startswith("every 10 steps and at step 0: pass@1 = mean success of 4 samples")
    assert table["Seeds"] == "2 (0, 1); per compared configuration 2"
    assert table["Regime"] == "stale k=1"
    assert "node7" in table["Machine"]
    assert table["Code"].endswith("(4 runs)")


def test_a_setting_the_runs_do_not_share_lists_its_values_with_counts():
    other = {**BASE, "trainer.ppo_epochs": "4", "trainer.mini_batch_prompts": "4"}
    data = _data([BASE, BASE, BASE, other], ["a", "a", "a", "b"])
    table = setup_table(data).display["setting"]
    assert table["Updates"].startswith("differs: 2 epoch(s) x 2 mini-batch(es)")
    assert "(3 runs); 4 epoch(s) x 4 mini-batch(es)" in table["Updates"]
    assert table["Regime"] == "differs: a (3 runs); b (1 runs)"
    # what was not logged is not invented
    missing = {k: v for k, v in BASE.items() if k != "model.params_b"}
    assert "(– B parameters" in setup_table(_data([missing] * 2, ["a"] * 2)).display["setting"]["Model"]


def test_config_diff_shows_the_component_a_run_used_not_the_presets_declaration():
    from analysis.tables.generic import config_diff_table

    runs = [
        {**BASE, "algorithm.components.objective": "clip", "objective.name": "clip"},  # GRPO
        {**BASE, "algorithm.components.objective": "clip", "objective.name": "troll"},  # GRPO + TROLL
        {**BASE, "algorithm.components.objective": "dapo_clip", "objective.name": "dapo_clip"},  # DAPO
    ]
    data = _data(runs, ["a"] * 3)
    data.runs[f"tags.{metric_names.TAG_METHOD}"] = ["GRPO", "GRPO+TROLL", "DAPO"]
    diff = config_diff_table(data).display
    assert "algorithm.components.objective" not in diff.index
    assert list(diff.loc["objective.name"]) == ["clip", "troll", "dapo_clip"]


def test_a_sweep_stopped_early_says_how_many_of_its_seeds_ran():
    """The stability map's sweep file sweeps 10 seeds: a report of 2 of them says so."""
    table = setup_table(_data([BASE] * 4, ["a"] * 4, sweep="stability_map_cpu")).display["setting"]
    assert table["Seeds"].endswith("; 2 of the 10 seeds of sweeps/stability_map_cpu.yaml ran")
    assert "of the" not in setup_table(_data([BASE] * 4, ["a"] * 4)).display["setting"]["Seeds"]
