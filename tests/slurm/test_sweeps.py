"""``trustbench sweep`` through ``launcher=slurm`` on the test cluster, end to end.

Four sweeps (tests/slurm/sweeps.py) start together in the background early in the Slurm stage
(the cluster runs them side by side, next to the other Slurm tests) and each test checks one of them:

- ``main``: 6 cells on 1 fake GPU each; every cell must be FINISHED in MLflow, and launching again
  submits nothing;
- ``fails``: a cell that raises (``debug.fail_at_step``), logging through an MLflow server the
  sweep starts (``tracking=server``; the job gets its URI from its environment): the command
  exits 1 naming the cell, and the server's store holds the FAILED run;
- ``preempted``: a cell sent submitit's preemption signal (USR2) after its first checkpoint;
- ``timelimit``: a cell with a 2-minute limit that gets the pre-timeout signal.

The last two must requeue, resume into the same MLflow run and leave a metric history with every
step exactly once. References: MLflow's store, Slurm's own records (squeue, the job environment),
and the cells' configs. Requests the cluster cannot satisfy fail before anything is queued.

Run:  pytest -m slurm tests/slurm/test_sweeps.py     (~1.5 min on the 2-core test machine)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runners import metric_names, tracking_server

from .sweeps import SLURM, TINY, Sweep, sweep_env

pytestmark = pytest.mark.slurm


def _mlflow_runs(sweep: Sweep) -> list[tuple[str, str, str]]:
    """(run id, status, run key) of every run in the sweep's store."""
    with sweep.db() as con:
        return con.execute(
            "SELECT r.run_uuid, r.status, t.value FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid "
            "WHERE t.key = 'trustbench.run_key'"
        ).fetchall()


def _steps(sweep: Sweep, run_id: str, key: str = "training/global_step") -> list[int]:
    with sweep.db() as con:
        rows = con.execute("SELECT step FROM metrics WHERE run_uuid = ? AND key = ? ORDER BY step", (run_id, key))
        return [r[0] for r in rows]


def _attempts(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "jobs.jsonl").read_text().splitlines()]


def test_sweep_finishes_every_cell_and_a_second_launch_submits_nothing(slurm_sweeps, slurm_cluster):
    """6 cells queued as one job array run to FINISHED in MLflow; launching the same sweep again
    finds them all finished and queues no job."""
    sweep = slurm_sweeps["main"]
    code, out = sweep.result()
    assert code == 0, out[-4000:]
    assert "queued 6 cell(s) as job" in out
    runs = _mlflow_runs(sweep)
    assert len(runs) == 6 and {status for _, status, _ in runs} == {"FINISHED"}
    keys = {json.loads((d / "status.json").read_text())["run_id"]: d.name for d in sweep.run_dirs()}
    assert {(rid, key) for rid, _, key in runs} == set(keys.items())

    again = subprocess.run(
        [sys.executable, "-m", "runners.cli", "sweep", "demo", *sweep.args],
        env={**sweep_env(), "TRUSTBENCH_HOME": str(sweep.home)},
        cwd=sweep.home,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "0 to run, 6 already finished in MLflow" in again.stdout and "nothing to run" in again.stdout
    assert "queued" not in again.stdout
    assert slurm_cluster.run("squeue", "-h", "--name=tb-slurm-main").stdout.strip() == ""


def test_gpu_cell_runs_with_its_device_visible(slurm_sweeps):
    """Each cell asked for 1 GPU (launcher.gpus_per_node=1): its job saw exactly one of the node's
    fake GPUs in CUDA_VISIBLE_DEVICES, and trained on the CPU as configured."""
    sweep = slurm_sweeps["main"]
    assert sweep.result()[0] == 0
    for run_dir in sweep.run_dirs():
        (attempt,) = _attempts(run_dir)
        assert attempt["cuda_visible_devices"] is not None, attempt
        assert len(attempt["cuda_visible_devices"].split(",")) == 1 and attempt["gpus_on_node"] == "1"
        assert "device: cpu" in (run_dir / "config.yaml").read_text()


def test_failing_cell_is_reported_failed_by_name(slurm_sweeps):
    """A cell that raises is a completed job for Hydra and submitit; the sweep still reports it as
    FAILED, names it and its reason, and exits 1. It logged through the MLflow server the sweep
    started on 127.0.0.1 (and stopped), whose sqlite store now holds the FAILED run."""
    code, out = slurm_sweeps["fails"].result()
    assert code == 1, out[-4000:]
    assert "MLflow server at http://127.0.0.1:" in out and "(started here)" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("!! "))
    assert "FAILED" in line and "GRPO · s0" in line and "debug.fail_at_step=0 reached" in line
    assert "1 of 1 cells did not finish" in out
    assert [status for _, status, _ in _mlflow_runs(slurm_sweeps["fails"])] == ["FAILED"]
    url = out.split("MLflow server at ", 1)[1].split()[0]
    assert not tracking_server.is_up(url)


def _assert_resumed_without_gaps(sweep: Sweep, total_steps: int) -> list[dict]:
    code, out = sweep.result()
    assert code == 0, out[-4000:]
    (run_dir,) = sweep.run_dirs()
    status = json.loads((run_dir / "status.json").read_text())
    attempts = _attempts(run_dir)
    assert status["status"] == "FINISHED" and status["attempts"] == len(attempts) >= 2, (status, attempts)
    assert [a["restart"] for a in attempts] == list(range(len(attempts)))
    assert len({a["job_id"] for a in attempts}) == 1  # requeued: the same Slurm job, not a new one
    ((run_id, mlflow_status, _),) = _mlflow_runs(sweep)
    assert run_id == status["run_id"] and mlflow_status == "FINISHED"
    for key in ("training/global_step", metric_names.SCORE_MEAN, metric_names.ENTROPY):
        assert _steps(sweep, run_id, key) == list(range(1, total_steps + 1)), key
    return attempts


def test_preempted_cell_requeues_and_resumes_into_the_same_run(slurm_sweeps):
    """USR2 (submitit's preemption signal) after the first checkpoint: the trainer finishes its step
    and checkpoints, the job requeues itself, the next run of the job resumes into the same MLflow
    run, and every step is logged exactly once."""
    sweep = slurm_sweeps["preempted"]
    attempts = _assert_resumed_without_gaps(sweep, 8)
    assert "error" not in sweep.notes, sweep.notes
    assert sweep.notes.get("signalled") == attempts[0]["job_id"]
    assert len(attempts) == 2


@pytest.mark.slow
def test_time_limit_signal_requeues_and_resumes(slurm_sweeps):
    """A 2-minute job gets USR2 60 s before its limit (sbatch --signal, from submitit's
    signal_delay_s): it checkpoints after (the slow) step 1, requeues and resumes into the same
    MLflow run for the last step, with every step logged once."""
    attempts = _assert_resumed_without_gaps(slurm_sweeps["timelimit"], 2)
    assert len(attempts) == 2


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("launcher.gpus_per_node=99", "launcher.gpus_per_node"),
        ("launcher.time_min=30", "launcher.time_min"),
        ("launcher.partition=no_such_partition", "launcher.partition"),
    ],
)
def test_unsatisfiable_request_fails_before_submission(slurm_cluster, tmp_path, override, key):
    """More GPUs per node than any node has, a time over the partition's MaxTime, an unknown
    partition: the sweep stops with exit 2 naming the launcher key, and nothing is queued."""
    out = subprocess.run(
        [sys.executable, "-m", "runners.cli", "sweep", "demo", *TINY, *SLURM, "+method=choice(grpo)", override,
         "experiment=slurm-refused"],
        env={**sweep_env(), "TRUSTBENCH_HOME": str(tmp_path)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"configuration error: config key '{key}'" in out.stderr and "GRPO · s0" in out.stderr
    assert "queued" not in out.stdout
    assert slurm_cluster.run("squeue", "-h", "--name=tb-slurm-refused").stdout.strip() == ""
