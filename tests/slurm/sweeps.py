"""The four ``trustbench sweep`` commands the Slurm tests check, started in the background.

Design: the sweeps are the slow part of the Slurm stage (the time-limit one waits on Slurm's 30 s
time-limit checks and a requeue), so ``slurm_sweeps`` is session-scoped and tests/conftest.py
starts it once the Slurm tests marked ``slurm_whole_cluster`` are done: the cluster and verl-launch
tests then run while the sweeps do, and tests/slurm/test_sweeps.py only collects results. The tests
marked ``slurm_whole_cluster`` need every GPU of the cluster, which the main sweep's GPU cells would
otherwise hold: the preemption test, and the Ray-on-Slurm bootstrap, whose Ray head must also answer
its nodes within Ray's fixed 30 s (beside the sweeps, on 2 cores, it missed that deadline).

The fixture is registered once, from tests/conftest.py (see tests/slurm/cluster.py for why).

- ``main``: 6 cells on 1 fake GPU each;
- ``fails``: a cell that raises, logging through an MLflow server the sweep starts;
- ``preempted``: a cell sent submitit's preemption signal (USR2) after its first checkpoint;
- ``timelimit``: a cell with a 2-minute limit that gets the pre-timeout signal.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .cluster import REPO_ROOT, SlurmCluster, free_ports, wait_for

# tiny model, a few steps, CPU only; the embedded task's own reward (jobs do not import tests/)
TINY = [
    "model=tiny_qwen2",
    "trainer.prompts_per_step=2",
    "trainer.n=4",
    "trainer.mini_batch_prompts=1",
    "trainer.eval_every=0",
    "rollout.max_response_length=8",
    "rollout.max_prompt_length=32",
    "dataset.eval_limit=4",
    "dataset.train_limit=64",
    "progress=false",
    "backend.device=cpu",
    "backend.num_threads=1",
    "seed=0",  # the demo sweeps 3 seeds; one cell per method here
]
# what the test cluster can give: 2 CPUs and ~22 GB per node, MaxTime 10 min
SLURM = ["launcher=slurm", "launcher.cpus_per_task=1", "launcher.mem_gb=1", "launcher.time_min=10"]
METHODS = "+method=grpo,grpo_troll,grpo_trm,gtpo,repo_r,dapo"
TIMEOUT_S = 420


@dataclass
class Sweep:
    name: str
    home: Path
    args: list[str]
    proc: subprocess.Popen | None = None
    out: str = ""
    code: int | None = None
    notes: dict = field(default_factory=dict)

    def start(self, env: dict[str, str]) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runners.cli", "sweep", "demo", *self.args],
            env={**env, "TRUSTBENCH_HOME": str(self.home)},
            cwd=self.home,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def result(self) -> tuple[int, str]:
        if self.code is None:
            try:
                self.out, _ = self.proc.communicate(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.out = self.proc.communicate()[0]
                pytest.fail(f"sweep {self.name} did not end in {TIMEOUT_S} s:\n{self.out[-4000:]}")
            self.code = self.proc.returncode
        return self.code, self.out

    def run_dirs(self) -> list[Path]:
        return sorted((self.home / "runs").glob("*"))

    def db(self) -> sqlite3.Connection:
        return sqlite3.connect(self.home / "mlflow.db")


def sweep_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), HYDRA_FULL_ERROR="1")
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _signal_after_checkpoint(sweep: Sweep, cluster: SlurmCluster) -> None:
    """Send submitit's preemption signal to the preempted cell's job once it checkpointed."""
    try:
        ckpt = wait_for(lambda: next(sweep.home.glob("runs/*/checkpoint.pt"), None), 300, "a first checkpoint")
        job = json.loads((ckpt.parent / "job.json").read_text())["job_id"]
        cluster.run("scancel", "--signal=USR2", job)
        sweep.notes["signalled"] = job
    except BaseException as err:  # noqa: BLE001 - reported by the test
        sweep.notes["error"] = repr(err)


@pytest.fixture(scope="session")
def slurm_sweeps(slurm_cluster, tmp_path_factory) -> Iterator[dict[str, Sweep]]:
    """Start the four sweeps at once; tests then wait for the one they check."""
    root = tmp_path_factory.mktemp("sweeps")
    (port,) = free_ports(1)
    runs = {
        # 2-minute limit, USR2 60 s before it: due 60 s into each attempt, sent 30-60 s in
        # (slurmctld checks time limits every 30 s and sends the warning up to 30 s early). Step 1
        # is followed by a pause of up to 100 s that the signal cuts short, so the first attempt
        # stops after step 1; the second runs step 2 at full speed and is done before a signal.
        "timelimit": Sweep("timelimit", root / "timelimit", [*TINY, *SLURM, "+method=choice(grpo)",
                           "trainer.total_steps=2", "trainer.checkpoint_every=0", "debug.step_delay_s=100",
                           "debug.delay_steps_below=1", "launcher.time_min=2", "launcher.signal_delay_s=60",
                           "launcher.max_requeues=2", "experiment=slurm-timelimit"]),
        "main": Sweep("main", root / "main", [*TINY, *SLURM, METHODS, "trainer.total_steps=2",
                      "trainer.checkpoint_every=0", "launcher.gpus_per_node=1", "experiment=slurm-main"]),
        "fails": Sweep("fails", root / "fails", [*TINY, *SLURM, "+method=choice(grpo)", "trainer.total_steps=2",
                       "trainer.checkpoint_every=0", "debug.fail_at_step=0", "experiment=slurm-fails",
                       "tracking=server", f"tracking.port={port}"]),
        "preempted": Sweep("preempted", root / "preempted", [*TINY, *SLURM, "+method=choice(grpo)",
                           "trainer.total_steps=8", "trainer.checkpoint_every=2", "debug.step_delay_s=1",
                           "experiment=slurm-preempted"]),
    }  # fmt: skip
    env = sweep_env()
    for sweep in runs.values():
        sweep.start(env)
    watcher = threading.Thread(target=_signal_after_checkpoint, args=(runs["preempted"], slurm_cluster), daemon=True)
    watcher.start()
    yield runs
    for sweep in runs.values():
        if sweep.proc is not None and sweep.proc.poll() is None:
            sweep.proc.kill()
    for name in runs:
        slurm_cluster.run("scancel", f"--name=tb-slurm-{name}", check=False)
