"""The "verl on CPU" stage: real verl cells run once per session, shared by the tests that check them.

Design: a verl launch costs about a minute on 2 cores (most of it process start-up: every Ray worker
imports torch, transformers and verl), so each cell of the stage runs once, through
``runners.run.run`` with ``backend=verl`` on the session's shared Ray cluster (``cpu_ray``), and the
tests read what it left: the MLflow run, the run directory (verl's logs, metrics files,
checkpoints) and the actor micro-batches verl trained on (``TRUSTBENCH_VERL_DUMP_DIR``,
``runners.backends.verl.batch_dump``). ``CpuStage.local_keys`` runs the same cell on the built-in
backend for the metric-name comparison. All runs of the stage are in one MLflow experiment,
``verl_cpu``, under a temporary ``TRUSTBENCH_HOME``.

While the stage runs, a sampler thread records every second the proportional set size (PSS) of
the stage's processes (the Ray cluster's, verl's drivers and this one); tests/verl/conftest.py
prints the stage's wall time, verl launches, phase times (``timing_s/*``) and the memory peak.

Cells: 2 iterations of 8 prompts x 4 responses of the embedded model, no evaluation, lr 1e-3; except
TROLL, which is README's verl command exactly as a CPU-only user types it (``README_COMMAND``: the
default 8 x 8 with evaluation, lr 1e-4), run in a process of its own that starts its own Ray, into the
stage's home and MLflow store (experiment ``default``): one verl launch checks both the command and
the TROLL cell.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.slurm.cluster import processes_mentioning

EXPERIMENT = "verl_cpu"
COMMON = (
    "backend=verl",
    f"experiment={EXPERIMENT}",
    "trainer.total_steps=2",
    "trainer.prompts_per_step=8",
    "trainer.n=4",
    "trainer.mini_batch_prompts=8",
    "trainer.eval_every=0",
    "trainer.lr=1e-3",
    "dataset.train_limit=64",
    "dataset.eval_limit=8",
    "progress=false",
)
# README's verl-on-CPU command (``trustbench run ...``), exactly; the stage's TROLL cell
README_COMMAND = ("backend=verl", "algorithm=grpo", "objective=troll", "trainer.total_steps=2")
README_CELL = "troll"
# the stage's cells: name -> overrides after COMMON (README_CELL: README_COMMAND alone)
CELLS: dict[str, tuple[str, ...]] = {
    "grpo": ("algorithm=grpo",),
    README_CELL: ("algorithm=grpo", "objective=troll"),
    "trm_max": ("algorithm=grpo", "mask=trm_max"),
    "gtpo": ("algorithm=gtpo",),
    "repo_r": ("algorithm=repo_r",),
    "ppo": ("algorithm=ppo",),
    "egae": ("algorithm=ppo", "estimator=egae"),
}


@dataclass
class CellRun:
    """What one verl cell left behind."""

    name: str
    cfg: Any
    choices: dict
    result: dict | None
    run_dir: Path
    dump_dir: Path
    wall_s: float


class MemorySampler(threading.Thread):
    """Peak summed PSS of the processes whose command line names one of ``markers``, their
    descendants, and this process."""

    def __init__(self, markers: list[str], every_s: float = 1.0) -> None:
        super().__init__(name="verl-cpu-memory", daemon=True)
        self.markers, self.every_s = markers, every_s
        self.peak_bytes = 0
        self.stopped = threading.Event()

    @staticmethod
    def pss_bytes(pid: int) -> int:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def sample(self) -> int:
        """Summed PSS of the marked processes and all their descendants (Ray's workers rename
        themselves ``ray::...``, so they are found as children of the raylet), and this process."""
        import psutil

        pids = {os.getpid()}
        for marker in self.markers:
            for pid in processes_mentioning(marker):
                pids.add(pid)
                try:
                    pids.update(child.pid for child in psutil.Process(pid).children(recursive=True))
                except psutil.Error:
                    continue
        return sum(self.pss_bytes(pid) for pid in pids)

    def run(self) -> None:
        while not self.stopped.wait(self.every_s):
            self.peak_bytes = max(self.peak_bytes, self.sample())


@dataclass
class CpuStage:
    """The session's verl-on-CPU cells (module docstring)."""

    home: Path
    uri: str
    sampler: MemorySampler
    runs: dict[str, CellRun] = field(default_factory=dict)
    local: dict[str, set] = field(default_factory=dict)
    launches: int = 0
    started: float = field(default_factory=time.monotonic)

    def compose(self, name: str, *extra: str, backend: str = "verl"):
        from runners.config import compose

        overrides = [*COMMON, *CELLS[name], f"tracking.uri={self.uri}", *extra]
        if backend != "verl":
            overrides = [o for o in overrides if not o.startswith("backend=")] + [f"backend={backend}"]
        cfg, choices = compose(overrides)
        return cfg, dict(choices)

    def layout(self, cfg) -> Path:
        from runners import paths
        from runners.config import run_key

        return paths.run_dir(run_key(cfg))

    def verl(self, name: str) -> CellRun:
        """Run verl cell ``name`` (once per session) with its micro-batches dumped."""
        if name not in self.runs:
            from runners.run import run

            if name == README_CELL:
                self.runs[name] = self.readme_command()
                return self.runs[name]
            cfg, choices = self.compose(name)
            dump = self.home / "dumps" / name
            started = time.monotonic()
            with dump_env(dump):
                self.launches += 1
                result = run(cfg, choices)
            self.runs[name] = CellRun(name, cfg, choices, result, self.layout(cfg), dump, time.monotonic() - started)
        return self.runs[name]

    def readme_command(self) -> CellRun:
        """``trustbench run`` + README_COMMAND in a fresh process, as a user runs it: no Ray address (it
        starts its own Ray), no MLflow variables; the stage's home, so its MLflow run is in the stage's
        store. Its micro-batches are dumped like every cell's; a failure shows the command's output."""
        from runners.backends.verl.batch_dump import DUMP_ENV
        from runners.config import compose

        dump = self.home / "dumps" / README_CELL
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_"))}
        env.update({"TRUSTBENCH_HOME": str(self.home), DUMP_ENV: str(dump)})
        exe = shutil.which("trustbench", path=os.path.dirname(sys.executable)) or "trustbench"
        started = time.monotonic()
        self.launches += 1
        done = subprocess.run(
            [exe, "run", *README_COMMAND], cwd=self.home, env=env, capture_output=True, text=True, timeout=540
        )
        wall = time.monotonic() - started
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        cfg, choices = compose(list(README_COMMAND))
        (found,) = self.client().search_runs([self.client().get_experiment_by_name(str(cfg.experiment)).experiment_id])
        result = {"status": found.info.status, "run_id": found.info.run_id, "name": found.info.run_name}
        return CellRun(README_CELL, cfg, dict(choices), result, self.layout(cfg), dump, wall)

    def local_keys(self, name: str) -> set[str]:
        """Metric names the built-in backend logs for the same cell (2 iterations; for README_CELL the
        stage's sizes with the same method)."""
        if name not in self.local:
            from runners.run import run

            cfg, choices = self.compose(name, backend="local")
            result = run(cfg, choices)
            self.local[name] = set(self.client().get_run(result["run_id"]).data.metrics)
        return self.local[name]

    def client(self):
        from mlflow import MlflowClient

        return MlflowClient(tracking_uri=self.uri)

    def history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        return sorted((m.step, m.value) for m in self.client().get_metric_history(run_id, key))

    def timings(self) -> dict[str, list[float]]:
        """``timing_s/*`` of every iteration of the stage's verl runs."""
        out: dict[str, list[float]] = {}
        for cell in self.runs.values():
            if not cell.result:
                continue
            for key in self.client().get_run(cell.result["run_id"]).data.metrics:
                if key.startswith("timing_s/"):
                    out.setdefault(key, []).extend(v for _, v in self.history(cell.result["run_id"], key))
        return out


class dump_env:
    """``TRUSTBENCH_VERL_DUMP_DIR`` set for the duration of a block (the backend forwards it to verl's workers)."""

    def __init__(self, folder: Path) -> None:
        from runners.backends.verl.batch_dump import DUMP_ENV

        self.key, self.folder, self.previous = DUMP_ENV, folder, None

    def __enter__(self):
        self.previous = os.environ.get(self.key)
        os.environ[self.key] = str(self.folder)
        return self

    def __exit__(self, *exc):
        if self.previous is None:
            os.environ.pop(self.key, None)
        else:
            os.environ[self.key] = self.previous


# the session's stage (read by tests/verl/conftest.py for its summary)
STAGE: dict[str, CpuStage] = {}


@pytest.fixture(scope="session")
def cpu_stage(tmp_path_factory, cpu_ray) -> Iterator[CpuStage]:
    """The verl-on-CPU stage under a temporary ``TRUSTBENCH_HOME`` (restored afterwards)."""
    from runners import tracking
    from runners.backends.verl.translate import CPU_ENTRYPOINT, ENTRYPOINT

    home = tmp_path_factory.mktemp("verl_cpu_home")
    previous = os.environ.get("TRUSTBENCH_HOME")
    os.environ["TRUSTBENCH_HOME"] = str(home)
    sampler = MemorySampler([str(cpu_ray.temp_dir), ENTRYPOINT, CPU_ENTRYPOINT])
    sampler.start()
    stage = CpuStage(home=home, uri=tracking.ensure_store(f"sqlite:///{home}/mlflow.db"), sampler=sampler)
    STAGE["stage"] = stage
    try:
        yield stage
    finally:
        sampler.stopped.set()
        stage.finished = time.monotonic()
        if previous is None:
            os.environ.pop("TRUSTBENCH_HOME", None)
        else:
            os.environ["TRUSTBENCH_HOME"] = previous


__all__ = [
    "CELLS",
    "COMMON",
    "EXPERIMENT",
    "README_CELL",
    "README_COMMAND",
    "STAGE",
    "CellRun",
    "CpuStage",
    "cpu_stage",
    "dump_env",
]
