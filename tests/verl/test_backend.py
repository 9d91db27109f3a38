"""The verl backend around verl: metric mapping, metrics file, data export, reward entry, launch, resume, stop.

What is checked against what:
- metric mapping: a hand-recorded step of verl 0.9.1's v1 trainer (names as its metric_utils,
  losses and engine workers emit them) against hand-computed schema values, every name accepted by
  MLflow's own metric-name validator;
- the metrics file: records written by verl's own ``FileLogger`` (the writer) read back, also
  while a line is half written;
- the reward entry: loaded by verl's own loader (``get_custom_reward_fn``) and called with the
  keywords verl's reward manager passes, on rows of the exported parquet, against
  ``runners.data.rewards`` directly, on adversarial responses (echoes, several boxes, no box);
- ``VerlBackend`` inside ``runners.run.run`` with a stand-in for ``verl.trainer.main_ppo``
  (``FAKE_VERL``: verl's loop, checkpoint tracker, file logger, and the trustbench stop hook
  ``check_stop_request``): metrics land in the cell's MLflow run under schema names, each step
  once; SIGUSR1 checkpoints and stops (PREEMPTED), the next attempt resumes from the checkpoint
  without repeating the first evaluation; a checkpoint at total_steps does not launch verl; one
  beyond it is a ConfigError; verl exiting early is a failure.

Run: ``pytest tests/verl/test_backend.py``.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from runners import metric_names
from runners.backends.verl.metrics import MetricsFile, map_metrics

# A step of verl 0.9.1's v1 trainer (GRPO, 8 prompts x 8 responses, 8 GPUs), as its Tracking logs it.
VERL_STEP = {
    "training/global_step": 3,
    "training/epoch": 0,
    "actor/entropy": 0.61,
    "actor/pg_loss": -0.012,
    "actor/pg_clipfrac": 0.003,
    "actor/ppo_kl": 1.0e-4,
    "actor/pg_clipfrac_lower": 0.0,
    "actor/grad_norm": 0.42,
    "actor/lr": 1.0e-6,
    "actor/loss": -0.011,
    "actor/perf/max_memory_allocated_gb": 41.25,
    "actor/perf/max_memory_reserved_gb": 60.0,
    "actor/perf/cpu_memory_used_gb": 120.5,
    "perf/mfu/actor": 0.31,
    "critic/score/mean": 0.375,
    "critic/score/max": 1.0,
    "critic/score/min": 0.0,
    "critic/rewards/mean": 0.375,
    "critic/advantages/mean": 0.0,
    "critic/advantages/max": 1.87,
    "critic/advantages/min": -1.2,
    "critic/returns/mean": 0.0,
    "response_length/mean": 412.5,
    "response_length/max": 1024,
    "response_length/min": 37,
    "response_length/clip_ratio": 0.0625,
    "prompt_length/mean": 98.0,
    "timing_s/gen": 21.4,
    "timing_s/reward": 0.8,
    "timing_s/old_log_prob": 3.1,
    "timing_s/adv": 0.05,
    "timing_s/update_actor": 9.7,
    "timing_s/update_weights": 1.2,
    "timing_s/step": 36.9,
    "timing_per_token_ms/gen": 0.052,
    "perf/total_num_tokens": 130560,
    "perf/time_per_step": 36.9,
    "perf/throughput": 442.27642276422765,
    "kl_loss": 0.001,
    "kl_coef": 0.001,
    "training/num_turns/mean": 2.0,
    "response/aborted_ratio": 0.0,
    "variance_proxy/expected_w": float("nan"),
    "val-core/gsm8k/acc/mean@4": 0.71,
    "val-aux/gsm8k/acc/std@4": 0.12,
    "val-core/gsm8k/acc/best@4/mean": 0.86,
    "val-core/gsm8k/acc/best@4/std": 0.05,
    "val-core/gsm8k/acc/maj@4/mean": 0.8,
    "val-aux/gsm8k/acc/best@2/mean": 0.8,
    "val-aux/gsm8k/reward/mean@4": 0.71,
    "val-aux/num_turns/mean": 2,
    "rollout/moe/layers": [1, 2],
}


def test_a_non_finite_verl_metric_reaches_the_tracker_which_stops_the_run(tmp_path):
    """A NaN loss from verl is kept by the mapping (never dropped silently); the tracker refuses it,
    naming the metric and step, which ends the run as FAILED."""
    from runners import tracking
    from runners.backends.base import NonFiniteMetric

    out = map_metrics({"actor/pg_loss": float("nan"), "actor/grad_norm": float("inf"), "critic/vf_loss": 0.5})
    assert math.isnan(out["actor/pg_loss"]) and math.isinf(out["actor/grad_norm"])
    tracker = tracking.RunTracker.open(
        uri=f"sqlite:///{tmp_path}/mlflow.db", experiment="nan", run_key="k", run_name="nan", tags={}, params={}
    )
    with pytest.raises(NonFiniteMetric, match="'actor/grad_norm' is inf at step 3"):
        tracker.log_metrics(out, step=3)
    tracker.finish("FAILED")


def test_metric_mapping_on_a_recorded_verl_step():
    """Renames and derived schema metrics against hand-computed values; all names valid in MLflow."""
    from mlflow.utils.validation import _validate_metric_name

    out = map_metrics(VERL_STEP, responses_per_step=64)
    expected = {
        metric_names.ENTROPY: 0.61,
        metric_names.PG_CLIPFRAC: 0.003,
        metric_names.SCORE_MEAN: 0.375,
        metric_names.RESPONSE_LENGTH_MEAN: 412.5,
        metric_names.TIMING_GEN: 21.4,
        metric_names.TIMING_UPDATE_ACTOR: 9.7,
        metric_names.val_acc_mean("gsm8k", 4): 0.71,
        metric_names.val_acc_best("gsm8k", 4): 0.86,
        metric_names.val_acc_maj("gsm8k", 4): 0.8,
        "val-aux/gsm8k/acc/std_at_4": 0.12,
        metric_names.THROUGHPUT: 130560 / 36.9,  # whole step, not per GPU
        "perf/throughput_per_gpu": 130560 / 36.9 / 8,
        metric_names.GEN_THROUGHPUT: 412.5 * 64 / 21.4,
        metric_names.MAX_MEMORY_ALLOCATED_GB: 41.25,
        metric_names.CPU_MEMORY_USED_GB: 120.5,
        "actor/kl_loss": 0.001,
        "training/global_step": 3,
    }
    for key, value in expected.items():
        assert out[key] == pytest.approx(value), key
    assert "rollout/moe/layers" not in out  # not a number
    assert "variance_proxy/expected_w" not in out  # verl's NaN for a diagnostic it did not compute
    assert not any("@" in key for key in out) and "kl_loss" not in out
    for key in out:
        _validate_metric_name(key)
    # memory: the maximum over the roles present
    both = map_metrics({"actor/perf/max_memory_allocated_gb": 40.0, "critic/perf/max_memory_allocated_gb": 52.5})
    assert both[metric_names.MAX_MEMORY_ALLOCATED_GB] == 52.5


@pytest.mark.verl
def test_metrics_file_reads_what_verls_file_logger_writes(tmp_path, monkeypatch):
    """verl's FileLogger appends; MetricsFile returns each record once, keeps a half-written line."""
    import numpy as np
    from verl.utils.tracking import FileLogger

    path = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    writer = FileLogger("project", "experiment")
    reader = MetricsFile(path)
    assert reader.read_new() == []
    writer.log({"critic/score/mean": np.float32(0.5), "val-core/x/acc/mean@2": 1.0}, step=0)
    writer.log({"critic/score/mean": 0.75}, step=1)
    first = reader.read_new()
    assert [s for s, _ in first] == [0, 1] and first[0][1]["val-core/x/acc/mean@2"] == 1.0
    writer.fp.write(b'{"step": 2, "data": {"critic/sc')  # the writer is mid-line
    assert reader.read_new() == []
    writer.fp.write(b'ore/mean": 1.0}}\n')
    writer.log({"critic/score/mean": 0.0}, step=3)
    assert [(s, d["critic/score/mean"]) for s, d in reader.read_new()] == [(2, 1.0), (3, 0.0)]
    writer.finish()


@pytest.fixture(autouse=True)
def gpu_node(monkeypatch):
    """These tests drive the GPU path with a stand-in for verl, so the machine is taken to have CUDA
    (verl's CPU mode is tested in tests/verl/test_cpu_mode.py and by the verl_cpu stage)."""
    monkeypatch.setattr("runners.backends.verl.cpu.mode.cuda_available", lambda: True)


# -- data ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One MLflow sqlite store for the module (creating its schema takes seconds)."""
    from runners import tracking

    return tracking.ensure_store(f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db")


def _cell(tmp_path, *extra, store: str | None = None):
    from runners.config import compose

    cfg, choices = compose(
        [
            "backend=verl",
            "model=qwen3_1.7b",
            "dataset.train_limit=40",
            "dataset.eval_limit=8",
            "trainer.total_steps=4",
            "trainer.prompts_per_step=2",
            "trainer.mini_batch_prompts=2",
            "trainer.checkpoint_every=2",
            "trainer.eval_every=2",
            "progress=false",
            f"tracking.uri={store or f'sqlite:///{tmp_path}/mlflow.db'}",
            *extra,
        ]
    )
    return cfg, choices


def test_prepare_datasets_writes_once_and_refuses_too_few_examples(tmp_path):
    """The parquet files hold the cell's examples; a second attempt reuses them; a changed dataset
    config re-exports; fewer training examples than one step's prompts is a ConfigError."""
    from runners.backends.verl.data import prepare_datasets
    from runners.config.validate import ConfigError
    from runners.data.datasets import load_examples

    cfg, _ = _cell(tmp_path)
    files = prepare_datasets(cfg, tmp_path / "data")
    frame = pd.read_parquet(files.train)
    assert (files.n_train, files.n_val) == (40, 8) and len(frame) == 40
    gold = [e.answer for e in load_examples("embedded", split="train", limit=40, seed=0)]
    assert list(frame["reward_model"].map(lambda r: r["ground_truth"])) == gold
    stamp = files.train.stat().st_mtime_ns
    assert prepare_datasets(cfg, tmp_path / "data").train.stat().st_mtime_ns == stamp
    cfg2, _ = _cell(tmp_path, "dataset.train_limit=30", "dataset.reward=math")
    again = prepare_datasets(cfg2, tmp_path / "data")
    rows = pd.read_parquet(again.train)
    assert again.n_train == 30 and set(rows["extra_info"].map(lambda x: x["reward_fn"])) == {"math"}
    with pytest.raises(ConfigError) as err:
        prepare_datasets(_cell(tmp_path, "dataset.train_limit=1")[0], tmp_path / "data")
    assert err.value.key == "trainer.prompts_per_step"


ADVERSARIAL = [
    ("embedded", "\\boxed{632}", "632"),
    ("embedded", "\\boxed{347+285} = 632", "632"),  # echo: not a bare integer
    ("embedded", "\\boxed{631} then \\boxed{632}", "632"),
    ("embedded", "632", "632"),  # no box
    ("math500", "so \\boxed{\\frac{1}{2}}", "0.5"),
    ("math500", "\\boxed{1/2} no wait \\boxed{2}", "\\frac12"),
    ("gsm8k", "She has 72 apples.\n#### 72", "72"),
    ("gsm8k", "#### 70\nactually \\boxed{72}", "72"),
]


@pytest.mark.verl
def test_reward_entry_through_verls_loader_matches_runners_rewards(tmp_path):
    """verl loads ``compute_score`` from the configured file and calls it as its reward manager
    does; scores equal runners.data.rewards on the same response, gold and question."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    import runners.backends.verl.data as data_module
    from runners.backends.verl.data import REWARD_FUNCTION_NAME, REWARD_FUNCTION_PATH
    from runners.backends.verl.layout import VerlPaths
    from runners.backends.verl.translate.run import data_overrides
    from runners.data.datasets import PRESETS
    from runners.data.rewards import compute_reward
    from runners.data.types import Example
    from runners.data.verl_format import write_verl_parquet

    # what the translation puts in the config
    emitted = data_overrides(OmegaConf.create({"seed": 0}), VerlPaths.under(tmp_path))
    assert emitted["reward.custom_reward_function.name"] == REWARD_FUNCTION_NAME
    emitted = emitted["reward.custom_reward_function.path"]
    assert emitted == REWARD_FUNCTION_PATH
    loaded = [
        get_custom_reward_fn(
            OmegaConf.create({"reward": {"custom_reward_function": {"path": path, "name": REWARD_FUNCTION_NAME}}})
        )
        for path in (emitted, data_module.__file__)  # as a package module, and by file path
    ]
    examples = [
        Example(
            prompt="347+285=?\n" if src == "embedded" else "What is it?",
            answer=gold,
            data_source=src,
            reward_fn=PRESETS[src].reward_fn,
        )
        for src, _, gold in ADVERSARIAL
    ]
    rows = pd.read_parquet(write_verl_parquet(tmp_path / "rows.parquet", examples))
    scores = []
    for (_, row), (src, response, gold), example in zip(rows.iterrows(), ADVERSARIAL, examples):
        got = [
            fn(
                data_source=row["data_source"],
                solution_str=response,
                ground_truth=row["reward_model"]["ground_truth"],
                extra_info=dict(row["extra_info"]),
            )
            for fn in loaded
        ]
        assert got[0] == got[1] == compute_reward(example.reward_fn, response, gold, prompt=example.prompt_text()), src
        scores.append(got[0])
    assert scores == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]


# -- launch ------------------------------------------------------------------------------------------
def test_slurm_allocation_and_launch_command(tmp_path):
    """Inside an allocation verl runs through the Ray-on-Slurm bootstrap with the allocation's
    GPUs; outside, directly; the sbatch script asks for the cell's resources and requeues itself."""
    from runners.backends.verl.process import RAY_BOOTSTRAP, launch_argv
    from runners.cluster.verl_batch import render_sbatch
    from runners.perf.hardware import slurm_allocation

    assert slurm_allocation({}) is None
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_ON_NODE": "4"}
    assert slurm_allocation(env) == (2, 4)
    env.pop("SLURM_GPUS_ON_NODE")
    assert slurm_allocation({**env, "CUDA_VISIBLE_DEVICES": "0,2"}) == (2, 2)
    cfg, _ = _cell(tmp_path, "launcher.partition=gpu", "launcher.time_min=120")
    inside = launch_argv(cfg, ["a=1"], in_slurm=True, python="/py")
    assert inside == ["bash", str(RAY_BOOTSTRAP), "/py", "-m", "verl.trainer.main_ppo", "a=1"]
    assert launch_argv(cfg, ["a=1"], in_slurm=False, python="/py") == ["/py", "-m", "verl.trainer.main_ppo", "a=1"]
    script = render_sbatch(cfg, ["backend=verl", "model=qwen3_1.7b"], python="/py")
    for line in (
        "#SBATCH --nodes=1",
        "#SBATCH --gpus-per-node=2",
        "#SBATCH --partition=gpu",
        "#SBATCH --requeue",
        "#SBATCH --time=120",
        "#SBATCH --signal=B:USR1@960",
    ):
        assert line in script.splitlines()
    assert "/py -m runners.cli verl run-cell backend=verl model=qwen3_1.7b &" in script


# the model and data of ``_cell``'s cell as command-line overrides, on GPUs wherever the test runs (nothing
# is opened or loaded)
CELL_ARGS = [
    "backend=verl",
    "model=qwen3_1.7b",
    "dataset.train_limit=40",
    "trainer.total_steps=4",
    "backend.device=cuda",
]


def _trustbench(capsys, *argv: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``trustbench ARGV`` in this process (argparse's exit caught)."""
    from runners import cli

    capsys.readouterr()
    try:
        code = cli.main(list(argv))
    except SystemExit as exit_:
        code = exit_.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_trustbench_verl_commands(tmp_path, monkeypatch, capsys):
    """``trustbench verl``: its help lists the commands, ``overrides`` prints what ``build_overrides`` gives
    for the cell, ``sbatch`` the script ``render_sbatch`` writes (and the directory its output goes to); a
    mistyped command or config is one line and exit 2, no traceback. ``trustbench --help`` and the other
    commands do not import the verl backend, nor ``trustbench verl --help`` (``runners.cluster.verl_batch``
    reaches it through the registry)."""
    from runners import paths as tb_paths
    from runners.backends.verl.layout import VerlLayout
    from runners.backends.verl.process import cpu_placement
    from runners.backends.verl.translate import build_overrides
    from runners.cluster.verl_batch import COMMANDS, render_sbatch
    from runners.config import compose, run_key

    monkeypatch.setenv("TRUSTBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "160")  # argparse's help width: one line per command
    probe = (
        "import contextlib, sys; from runners import cli; cli.main(['list', 'backend'])\n"
        "with contextlib.suppress(SystemExit): cli.main(['--help'])\n"
        "with contextlib.suppress(SystemExit): cli.main(['verl', '--help'])\nprint(sorted(sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert "runners.backends.verl" not in loaded and "'verl" not in loaded
    code, out, _ = _trustbench(capsys, "--help")
    assert code == 0 and "trustbench verl COMMAND" in out
    code, out, _ = _trustbench(capsys, "verl", "--help")
    assert code == 0 and out.startswith("usage: trustbench verl")
    for name, text in COMMANDS.items():
        assert re.search(rf"^ +{name}\n? +{re.escape(text)}$", out, re.M), (name, out)

    cfg, _ = compose(CELL_ARGS)
    layout = VerlLayout.of(tb_paths.run_dir(run_key(cfg)))
    path = str(cfg.model.path or cfg.model.name)
    assert cpu_placement(cfg, path) is None  # backend.device=cuda: the GPU overrides
    expected = build_overrides(cfg, layout.paths(1), model_path=path, cpu=None)
    code, out, err = _trustbench(capsys, "verl", "overrides", *CELL_ARGS)
    assert code == 0, err
    assert out.splitlines() == expected
    assert "actor_rollout_ref.model.path=Qwen/Qwen3-1.7B" in expected

    code, out, err = _trustbench(capsys, "verl", "sbatch", *CELL_ARGS, "launcher.partition=gpu")
    assert code == 0, err
    assert out == render_sbatch(
        compose([*CELL_ARGS, "launcher.partition=gpu"])[0], [*CELL_ARGS, "launcher.partition=gpu"]
    )
    assert f"-m runners.cli verl run-cell {' '.join(CELL_ARGS)} launcher.partition=gpu &" in out
    assert tb_paths.run_dir(run_key(cfg)).is_dir()  # Slurm opens the job's output file there

    for argv, words in (
        (["verl", "nope"], ["trustbench verl: error:", "invalid choice: 'nope'", "overrides"]),
        (["verl"], ["trustbench verl: error:", "COMMAND"]),
        (["verl", "overrides", "model=nope"], ["trustbench: configuration error:", "'model'", "'nope'"]),
    ):
        code, out, err = _trustbench(capsys, *argv)
        messages = [line for line in err.splitlines() if not line.startswith("usage:")]
        assert code == 2 and "Traceback" not in err and len(messages) == 1, (argv, code, err)
        assert all(word in messages[0] for word in words), (argv, messages)


FAKE_VERL = r'''
"""Stand-in for verl.trainer.main_ppo: verl's step loop, checkpoint tracker, file logger and stop hook."""
import json, os, sys, time
from pathlib import Path
from types import SimpleNamespace

args = dict(a.lstrip("+").split("=", 1) for a in sys.argv[1:])
probe = {}
if os.environ.get("FAKE_VERL_RAY") == "1":
    import ray
    ray.init(logging_level="ERROR", log_to_driver=False)
    probe = {"resources": ray.cluster_resources(), "alive_nodes": len([n for n in ray.nodes() if n["Alive"]])}
    ray.shutdown()
ckpt = Path(args["trainer.default_local_dir"])
total, save_freq = int(args["trainer.total_training_steps"]), int(args["trainer.save_freq"])
tracker = ckpt / "latest_checkpointed_iteration.txt"
start = int(tracker.read_text()) if tracker.exists() else 0
names = ("VERL_USE_EXTERNAL_MODULES", "MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI", "VERL_FILE_LOGGER_PATH",
         "TRUSTBENCH_VERL_STOP_FILE", "RAY_ADDRESS")
print("FAKE_VERL " + json.dumps({"args": args, "start": start, "env": {k: os.environ.get(k) for k in names}, **probe}), flush=True)
log = open(os.environ["VERL_FILE_LOGGER_PATH"], "ab", buffering=0)

def emit(step, data):
    log.write((json.dumps({"step": step, "data": data}) + "\n").encode())

def save(step):
    (ckpt / f"global_step_{step}").mkdir(parents=True, exist_ok=True)
    tracker.write_text(str(step))

trainer = SimpleNamespace(global_steps=start, total_training_steps=total,
                          config=SimpleNamespace(trainer=SimpleNamespace(save_freq=save_freq)))
trainer._save_checkpoint = lambda: save(trainer.global_steps)
from runners.backends.verl.checkpoints import check_stop_request
if args["trainer.val_before_train"] == "true":
    emit(start, {"val-core/embedded/acc/mean@4": 0.25})
step = start + 1
while step <= trainer.total_training_steps:
    trainer.global_steps = step
    time.sleep(float(os.environ.get("FAKE_VERL_STEP_S", "0")))
    if save_freq > 0 and (step % save_freq == 0 or step == total):
        save(step)
    check_stop_request(trainer)
    data = {"critic/score/mean": step / 10, "timing_s/gen": 1.0, "response_length/mean": 20.0, "training/global_step": step}
    if step % int(args["trainer.test_freq"]) == 0 or step == total:
        data["val-core/embedded/acc/mean@4"] = step / 10
    emit(step, data)
    step += 1
sys.exit(int(os.environ.get("FAKE_VERL_EXIT", "0")))
'''


@pytest.fixture
def fake_verl(tmp_path, monkeypatch):
    path = tmp_path / "fake_verl.py"
    path.write_text(FAKE_VERL)
    monkeypatch.setenv("TRUSTBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for var in [v for v in os.environ if v.startswith("SLURM_")]:
        monkeypatch.delenv(var)
    return path


def _history(cfg, run_id, key):
    from mlflow import MlflowClient

    return sorted(
        (m.step, m.value) for m in MlflowClient(tracking_uri=cfg.tracking.uri).get_metric_history(run_id, key)
    )


@pytest.mark.slow
def test_run_stop_resume_and_finish_into_one_mlflow_run(tmp_path, fake_verl, monkeypatch, capfd, store):
    """run() with the verl backend: SIGUSR1 during step 2 -> verl checkpoints step 2 and stops ->
    PREEMPTED; the next attempt resumes from step 2 (no repeated first evaluation) and finishes;
    MLflow holds each step once, under schema names; a third call skips the finished cell."""
    from runners import paths
    from runners.backends.verl.checkpoints import latest_checkpoint_step
    from runners.backends.verl.layout import VerlLayout
    from runners.config import run_key
    from runners.run import Preempted, read_status, run

    cfg, choices = _cell(tmp_path, f"backend.options.entrypoint={fake_verl}", "trainer.checkpoint_every=3", store=store)
    layout = VerlLayout.of(paths.run_dir(run_key(cfg)))
    monkeypatch.setenv("FAKE_VERL_STEP_S", "1.5")

    def stop_when_step_1_is_logged():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            files = list(layout.root.glob("metrics.1.jsonl"))
            if files and '"step": 1' in files[0].read_text():
                os.kill(os.getpid(), signal.SIGUSR1)
                return
            time.sleep(0.1)

    threading.Thread(target=stop_when_step_1_is_logged, daemon=True).start()
    with pytest.raises(Preempted):
        run(cfg, choices)
    status = read_status(layout.root.parent)
    assert status["status"] == "PREEMPTED"
    assert latest_checkpoint_step(layout.checkpoints) == 2  # the hook saved step 2 (save_freq is 3)
    first = json.loads(
        next(line for line in layout.log_file(1).read_text().splitlines() if line.startswith("FAKE_VERL "))[10:]
    )
    assert first["start"] == 0 and first["args"]["trainer.val_before_train"] == "true"
    assert first["env"]["VERL_USE_EXTERNAL_MODULES"] == "runners.backends.verl.plugins.register"
    assert first["env"]["MLFLOW_RUN_ID"] == status["run_id"]
    assert first["args"]["trainer.default_local_dir"] == str(layout.checkpoints)

    monkeypatch.setenv("FAKE_VERL_STEP_S", "0")
    import runners.run as run_module

    if hasattr(run_module._StopFlag, "received"):  # a requeued attempt is a new process: no signal yet
        monkeypatch.setattr(run_module._StopFlag, "received", None)
    result = run(cfg, choices)
    assert result["status"] == "FINISHED" and result["run_id"] == status["run_id"]
    second = json.loads(
        next(line for line in layout.log_file(2).read_text().splitlines() if line.startswith("FAKE_VERL "))[10:]
    )
    assert second["start"] == 2 and second["args"]["trainer.val_before_train"] == "false"
    assert _history(cfg, result["run_id"], metric_names.SCORE_MEAN) == [(s, s / 10) for s in (1, 2, 3, 4)]
    assert _history(cfg, result["run_id"], metric_names.val_acc_mean("embedded", 4)) == [(0, 0.25), (2, 0.2), (4, 0.4)]
    assert [s for s, _ in _history(cfg, result["run_id"], metric_names.GEN_THROUGHPUT)] == [1, 2, 3, 4]
    assert result["metrics"][metric_names.SCORE_MEAN] == 0.4
    assert run(cfg, choices)["status"] == "SKIPPED"


def _tracker(cfg, key: str, *, new: bool):
    from runners import tracking

    uri = tracking.ensure_store(cfg.tracking.uri)
    return tracking.RunTracker.open(
        uri=uri, experiment="guards", run_key=key, run_name=key, tags={}, params={}, new=new
    )


@pytest.mark.parametrize(
    ("case", "checkpoint", "extra", "error"),
    [
        ("done", 4, (), None),  # checkpoint at total_steps: finished, verl not launched
        ("beyond", 6, (), "trainer.total_steps"),  # total changed between attempts
        ("short", None, ("backend.options.overrides=['trainer.total_training_steps=3']",), "not total_steps=4"),
        ("crash", None, (), "exited with status 3"),
        ("stale", 2, (), None),  # a new MLflow run: an old checkpoint is discarded, training starts at 0
    ],
)
def test_resume_guards(tmp_path, fake_verl, monkeypatch, capfd, store, case, checkpoint, extra, error):
    """verl is never launched into zero training steps, a checkpoint beyond total_steps is a
    ConfigError naming the key, verl ending early or failing is an error (not a silent success),
    and a fresh MLflow run never resumes another run's checkpoint."""
    from runners.backends.verl.backend import VerlBackend
    from runners.backends.verl.checkpoints import latest_checkpoint_step
    from runners.backends.verl.layout import VerlLayout
    from runners.config.validate import ConfigError

    cfg, _ = _cell(tmp_path, f"backend.options.entrypoint={fake_verl}", *extra, store=store)
    run_dir = tmp_path / case
    layout = VerlLayout.of(run_dir)
    if checkpoint is not None:
        (layout.checkpoints / f"global_step_{checkpoint}").mkdir(parents=True)
        (layout.checkpoints / "latest_checkpointed_iteration.txt").write_text(str(checkpoint))
    if case == "crash":
        monkeypatch.setenv("FAKE_VERL_EXIT", "3")
    _tracker(cfg, case, new=True)
    tracker = _tracker(cfg, case, new=case == "stale")
    backend = VerlBackend(cfg, tracker, run_dir, "GRPO")
    if error is None:
        backend.train()
    else:
        with pytest.raises(ConfigError if case == "beyond" else RuntimeError, match=error) as err:
            backend.train()
        if case == "beyond":
            assert err.value.key == "trainer.total_steps"
    verl_output = "".join(log.read_text() for log in sorted(layout.root.glob("verl.*.log")))
    launched = [line for line in verl_output.splitlines() if line.startswith("FAKE_VERL ")]
    assert len(launched) == (0 if case in ("done", "beyond") else 1)
    if case == "stale":
        assert json.loads(launched[0][10:])["start"] == 0 and latest_checkpoint_step(layout.checkpoints) == 4


def test_ray_auth_mode_is_decided_once_for_cluster_and_clients(tmp_path, monkeypatch):
    """Ray starts a cluster with token auth when a token file exists and RAY_AUTH_MODE is unset,
    but its clients then do not send the token: the backend sets the mode explicitly (an
    explicit setting wins)."""
    from runners.backends.verl.process import launch_env

    cfg, _ = _cell(tmp_path)
    kw = {"tracking_uri": "sqlite:///x.db", "run_id": "r", "metrics_file": "m", "stop_file": "s"}
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    assert launch_env(cfg, **kw)["RAY_AUTH_MODE"] == "disabled"
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("t" * 32)
    assert launch_env(cfg, **kw)["RAY_AUTH_MODE"] == "token"
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert launch_env(cfg, **kw)["RAY_AUTH_MODE"] == "disabled"
