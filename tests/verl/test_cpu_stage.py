"""verl on CPU, end to end: eight methods in five cells, two real verl iterations each, into MLflow and a report.

Each cell is trained by ``runners.run.run`` with ``backend=verl`` on this CUDA-less machine (verl's
CPU mode: ``runners.backends.verl.cpu.mode``): the embedded model, 8 prompts x 4 responses, the
Hugging Face rollout, FSDP2 on CPU, the trustbench trainer. What is checked against what:

- every cell ends FINISHED in MLflow with ``actor/pg_loss`` at steps 1 and 2 and every metric name
  the built-in backend logs for the same cell (its own 2-iteration run, same experiment; the
  length / position buckets compared by family, since which buckets fill depends on the samples);
- GRPO runs verl's own estimator and loss (the command verl got says so), and the sampler's
  log-probs equal the training engine's at both steps (verl's ``training/rollout_probs_diff_max``),
  so the weights of step 1's update reached the rollout before step 2 (lr 1e-3 moves them far more);
- TROLL and exact-KL TRM-Max (on PPO with EGAE): the first (only) mini-batch of an iteration is on-policy, so the
  divergence between the sparse old distribution stored by the engine's old-log-prob pass and the
  update pass's logits is zero (``troll/kl_before``) or at most what the storage drops
  (``trm/max_kl`` <= -log(1 - tail_mass)) and TRM keeps every sequence: a misaligned top-K row
  would show at once;
- GTPO: the plugin loss with the current entropy (``calculate_entropy``) and its metrics;
- REPO-R on PPO (verl's GAE and critic), stopped after iteration 1 by a stop signal and resumed: see
  ``test_repo_r_requeue``;
- PPO's critic with verl's GAE (the REPO-R cell) and with EGAE (the trustbench estimator; the TRM-Max
  cell): the critic trains at both steps and gets the policy's model, optimiser and value clip;
- TROLL is README's command exactly (``README_COMMAND``, its own process and Ray): see
  ``test_the_readme_command_trains_troll_on_verl``;
- every cell ran verl's TaskRunner in the driver process (CPU mode's ``driver_entry``);
- ``trustbench report`` builds from the stage's runs (both backends).

Run: ``pytest -m verl_cpu tests/verl`` (the stage; its summary line gives the wall time, phase
times and memory peak).
"""

from __future__ import annotations

import math
import re

import pytest

from runners import metric_names
from tests.verl.cpu_stage import CELLS, EXPERIMENT, README_CELL, REQUEUE_CELL, STAGE_TEST_TIMEOUT_S, uses_cells

pytestmark = [pytest.mark.verl, pytest.mark.verl_cpu, pytest.mark.slow, pytest.mark.timeout(STAGE_TEST_TIMEOUT_S)]

BUCKET = re.compile(r"/(len|pos)_\d+_\d+$")
# the cells checked here (REPO-R is the requeue test's)
PLAIN_CELLS = [name for name in CELLS if name != REQUEUE_CELL]


def families(keys) -> set[str]:
    """Metric names with length / position buckets folded into their family (``trm/accept_rate/len_*``)."""
    return {BUCKET.sub(r"/\1_*", key) for key in keys}


def command(cell) -> str:
    return (cell.run_dir / "verl" / "command.1.txt").read_text()


def _last(stage, run_id, key):
    return stage.history(run_id, key)[-1][1]


def check_grpo(stage, cell, run):
    text = command(cell)
    assert "algorithm.adv_estimator=grpo" in text and "policy_loss.loss_mode=vanilla" in text
    for step, diff in stage.history(run.info.run_id, "training/rollout_probs_diff_max"):
        assert diff < 1e-4, (step, diff)


def check_troll(stage, cell, run):
    assert "policy_loss.loss_mode=trustbench_troll" in command(cell)
    kl_before = stage.history(run.info.run_id, metric_names.TROLL_KL_BEFORE)
    assert [s for s, _ in kl_before] == [1, 2] and all(abs(v) < 1e-6 for _, v in kl_before), kl_before
    assert 0.99 < _last(stage, run.info.run_id, metric_names.TROLL_KEPT_MASS) <= 1.0 + 1e-9


def check_trm_max(stage, cell, run):
    assert "+actor_rollout_ref.actor.policy_loss.mask=trm_max" in command(cell)
    # on-policy, the exact KL against the stored old distribution is what its storage drops: sparsify
    # keeps mass >= 1 - tail_mass and renormalises, so KL <= -log(1 - tail_mass) (+ float32 noise)
    from runners.algorithms.method import Method

    bound = -math.log(1.0 - Method.from_config(cell.cfg).sparse["delta"]) + 1e-6
    for step, value in stage.history(run.info.run_id, metric_names.TRM_MAX_KL):
        assert -1e-6 <= value <= bound, (step, value, bound)
    assert [v for _, v in stage.history(run.info.run_id, metric_names.TRM_ACCEPT_RATE)] == [1.0, 1.0]


def check_gtpo(stage, cell, run):
    text = command(cell)
    assert "policy_loss.loss_mode=trustbench_gtpo" in text and "actor.calculate_entropy=true" in text
    assert metric_names.GTPO_CONFLICT_FRAC in run.data.metrics


def check_critic(stage, cell, run):
    text = command(cell)
    model = re.search(r"actor_rollout_ref\.model\.path=(\S+)", text).group(1)
    assert f"critic.model.path={model}" in text and "critic.enable=true" in text
    t = cell.cfg.trainer
    assert f"critic.cliprange_value={t.value_clip_low}" in text and f"critic.optim.lr={t.critic_lr}" in text
    assert [s for s, _ in stage.history(run.info.run_id, "critic/vf_loss")] == [1, 2]
    assert metric_names.VALUES_MEAN in run.data.metrics


def check_trm_max_egae(stage, cell, run):
    check_trm_max(stage, cell, run)
    assert "algorithm.adv_estimator=trustbench_egae" in command(cell)
    check_critic(stage, cell, run)


CHECKS = {
    "grpo": check_grpo,
    "troll": check_troll,
    "trm_max_egae": check_trm_max_egae,
    "gtpo": check_gtpo,
}


@pytest.mark.parametrize("name", PLAIN_CELLS)
def test_cell_trains_two_verl_iterations(cpu_stage, name):
    """FINISHED in MLflow, two iterations, the built-in backend's metric names, the method's own checks."""
    cell = cpu_stage.verl(name)
    assert cell.result["status"] == "FINISHED"
    run = cpu_stage.client().get_run(cell.result["run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["backend"] == "verl"
    for key in (metric_names.PG_LOSS, metric_names.GRAD_NORM, metric_names.SCORE_MEAN, metric_names.TIMING_STEP):
        assert [s for s, _ in cpu_stage.history(run.info.run_id, key)] == [1, 2], key
    local = cpu_stage.local_keys(name)
    missing = sorted(families(local) - families(run.data.metrics))
    assert not missing, f"the verl run lacks metrics the built-in backend logs: {missing}"
    # CPU mode's entry point ran verl's TaskRunner in the driver: no actor of its own printed anything
    assert "runners.backends.verl.cpu.driver_entry" in command(cell)
    assert "(TaskRunnerV1 pid=" not in (cell.run_dir / "verl" / "verl.1.log").read_text(errors="replace")
    CHECKS[name](cpu_stage, cell, run)


@uses_cells(REQUEUE_CELL)
def test_repo_r_requeue(cpu_stage):
    """REPO-R on PPO with a requeue: SIGUSR1 to ``trustbench run`` while verl starts -> verl checkpoints after
    iteration 1 (its own checkpointing, plus the controller state) and stops; the run is PREEMPTED and
    the command exits 1. The rerun resumes from that checkpoint, trains iteration 2 only, into the same
    MLflow run: every metric at steps 1 and 2 exactly once. The REPO-R controller was fed verl's
    entropy and kept across the requeue: replaying the controller on the logged ``actor/entropy``
    gives the logged zeta and target, which a controller restarted at the rerun would not. The critic
    (verl's GAE) logs its loss at both steps, the second in the resumed attempt."""
    from runners.algorithms import ENTROPY_CONTROLLERS
    from runners.backends.verl.layout import VerlLayout
    from runners.backends.verl.metrics import MetricsFile
    from runners.run import run

    cell = cpu_stage.verl(REQUEUE_CELL)
    first = cell.first_attempt
    assert first["exit"] == 1 and first["status"] == "PREEMPTED", first["output"]
    assert first["checkpoint_step"] == 1 and first["state_file"]
    assert first["mlflow_status"] == "KILLED"
    assert first["pg_loss_steps"] == [1]
    run_id = first["run_id"]

    result = cell.result
    assert result["status"] == "FINISHED" and result["run_id"] == run_id
    layout = VerlLayout.of(cell.run_dir)
    attempts = [[step for step, _ in MetricsFile(layout.root / f"metrics.{a}.jsonl").read_new()] for a in (1, 2)]
    assert attempts == [[1], [2]]  # each attempt logged its own iteration: the rerun trained iteration 2 only
    for key in (metric_names.PG_LOSS, metric_names.SCORE_MEAN, metric_names.ENTROPY, metric_names.ENTROPY_ZETA):
        assert [s for s, _ in cpu_stage.history(run_id, key)] == [1, 2], key
    missing = sorted(
        families(cpu_stage.local_keys(REQUEUE_CELL)) - families(cpu_stage.client().get_run(run_id).data.metrics)
    )
    assert not missing, missing
    assert "algorithm.adv_estimator=gae" in command(cell)
    check_critic(cpu_stage, cell, cpu_stage.client().get_run(run_id))

    cfg = cell.cfg
    params = {k: v for k, v in dict(cfg.entropy_control).items() if k != "name"}
    entropy = [v for _, v in cpu_stage.history(run_id, metric_names.ENTROPY)]
    zeta = [v for _, v in cpu_stage.history(run_id, metric_names.ENTROPY_ZETA)]
    target = [v for _, v in cpu_stage.history(run_id, metric_names.ENTROPY_TARGET)]
    kept = ENTROPY_CONTROLLERS.get("repo_r")(**params)
    replay = [kept.update(h) for h in entropy]
    assert [m[metric_names.ENTROPY_ZETA] for m in replay] == pytest.approx(zeta, rel=1e-5)
    assert [m[metric_names.ENTROPY_TARGET] for m in replay] == pytest.approx(target, rel=1e-5)
    restarted = ENTROPY_CONTROLLERS.get("repo_r")(**params).update(entropy[1])
    assert not math.isclose(restarted[metric_names.ENTROPY_TARGET], target[1], rel_tol=1e-5)
    assert run(cfg, cell.choices)["status"] == "SKIPPED"  # finished: never relaunched into zero steps


@uses_cells(*PLAIN_CELLS)
def test_report_builds_from_the_stage(cpu_stage, tmp_path):
    """``trustbench report`` builds (HTML) from the stage's verl and built-in runs, for each experiment
    they are in (``verl_cpu``; ``default``, README's command)."""
    from runners.cli import main

    for name in PLAIN_CELLS:  # REPO-R's run is the requeue test's
        cpu_stage.verl(name)
    experiments = {str(cell.cfg.experiment) for cell in cpu_stage.runs.values()}
    assert EXPERIMENT in experiments
    for experiment in sorted(experiments):
        out = tmp_path / experiment
        argv = ["report", experiment, "--tracking-uri", cpu_stage.uri, "--out", str(out), "--no-pdf", "--quiet"]
        assert main(argv) == 0, experiment
        html = (out / "report.html").read_text()
        for cell in cpu_stage.runs.values():
            if str(cell.cfg.experiment) == experiment:
                assert cell.result["name"].split(" · ")[0] in html, (experiment, cell.name)


@uses_cells(README_CELL)
def test_the_readme_command_trains_troll_on_verl(cpu_stage):
    """The command a CPU-only user types, exactly, in a fresh process with its own Ray (no shared
    cluster, evaluation on as configured by default): ``trustbench run backend=verl algorithm=grpo
    objective=troll trainer.total_steps=2`` (``README_COMMAND``, the stage's TROLL cell) leaves a
    FINISHED MLflow run with ``troll/*`` metrics, ``actor/pg_loss`` at steps 1 and 2 and the evaluation
    before and after training."""
    cell = cpu_stage.verl(README_CELL)
    run = cpu_stage.client().get_run(cell.result["run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["backend"] == "verl"
    assert any(k.startswith("troll/") for k in run.data.metrics), sorted(run.data.metrics)
    assert [s for s, _ in cpu_stage.history(run.info.run_id, metric_names.PG_LOSS)] == [1, 2]
    t = cell.cfg.trainer
    assert t.eval_every and t.n == 8  # the default sizes, not the stage's COMMON
    accuracy = [k for k in run.data.metrics if k.startswith("val-core/")]
    assert accuracy and [s for s, _ in cpu_stage.history(run.info.run_id, accuracy[0])] == [0, 2], accuracy


# README's command on the terminal: trustbench's own lines only -- the log's path, verl starting, the
# evaluation before training, one line per step (2), the end: 6 lines, against about 2,200 lines (1,000
# of them Ray workers' warnings) when verl's output was echoed. The bound leaves room for the few
# warnings a library may print in trustbench's own process, not for any of verl's.
README_TERMINAL_LINES = 20


@uses_cells(README_CELL)
def test_the_readme_commands_terminal_is_short_and_the_log_holds_verls_output(cpu_stage):
    """README's command (its own process and Ray, ``progress`` on by default) prints at most
    ``README_TERMINAL_LINES`` lines: the first names the run's verl log, then one line per step (1/2,
    2/2, each with its score); no line of verl's or of a Ray worker's. The log holds them: verl's
    per-step console line (``step:1 - ...``), the driver's ``ray init kwargs`` and Ray workers' lines
    forwarded to the driver (``(Name pid=N) ...``, the prefix without colour codes)."""
    cell = cpu_stage.verl(README_CELL)
    lines = cell.output.splitlines()
    log = cell.run_dir / "verl" / "verl.1.log"
    assert len(lines) <= README_TERMINAL_LINES, cell.output[-4000:]
    assert lines[0].startswith("[trustbench] ") and lines[0].endswith(f": verl's output goes to {log}"), lines[0]
    for step in (1, 2):
        assert len([line for line in lines if re.search(rf": step {step}/2 score=\d\.\d\d\b", line)]) == 1, lines
    assert not [line for line in lines if re.search(r"pid=\d+|step:\d+ - |WARNING", line)], lines
    logged = log.read_text(errors="replace").splitlines()
    for step in (1, 2):
        assert any(line.startswith(f"step:{step} - ") for line in logged), step
    assert any(line.startswith("ray init kwargs:") for line in logged)
    assert any(re.match(r"\((\w+ )?pid=\d+\) ", line) for line in logged)
