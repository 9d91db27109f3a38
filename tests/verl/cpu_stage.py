"""The "verl on CPU" stage: real verl cells run once per session, shared by the tests that check them.

Design: a verl launch costs about a minute and a half on 2 cores, most of it process start-up (every
Ray worker imports torch, transformers and verl, one process after another), so each cell of the
stage runs once, as ``trustbench run backend=verl ...`` in a process of its own, and the tests read
what it left: the MLflow run, the run directory (verl's logs, metrics files, checkpoints) and the
actor micro-batches verl trained on (``TRUSTBENCH_VERL_DUMP_DIR``, ``runners.backends.verl.plugins.batch_dump``).
One launch keeps only about 1.2 of the 2 cores busy, so the cells the session's tests read start
when the stage does, ``PARALLEL`` at a time, longest first (``LAUNCH_ORDER``), on the session's shared
Ray clusters (``cpu_ray``: one per parallel launch, since TransferQueue allows one verl launch per
cluster); a test waits for its cell.
``CpuStage.local_keys`` runs the same cell on the built-in backend, in this process, for the
metric-name comparison. All runs of the stage are in one MLflow store under a temporary
``TRUSTBENCH_HOME``, the cells in experiment ``verl_cpu``.

While the stage runs, a sampler thread records every second the proportional set size (PSS) of
the stage's processes (the ``trustbench run`` processes, the Ray cluster's, verl's drivers and this
one); tests/verl/conftest.py prints the stage's wall time, verl launches, phase times
(``timing_s/*``) and the memory peak.

Cells: 2 iterations of 8 prompts x 4 responses of the embedded model, no evaluation, lr 1e-3; except
TROLL, which is README's verl command exactly as a CPU-only user types it (``README_COMMAND``: the
default 8 x 8 with evaluation, lr 1e-4): no Ray address, so it starts its own Ray, into the stage's
home and MLflow store (experiment ``default``): one verl launch checks both the command and the TROLL
cell. REPO-R on PPO (``REQUEUE_CELL``) is launched twice: stopped by SIGUSR1 as verl starts, then resumed.
Six launches in all: where two methods act on different parts of the update (a mask on the loss, an
estimator on the advantages, a controller on the entropy coefficient) they share a cell.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from runners import metric_names
from tests.slurm.cluster import processes_mentioning
from tests.verl.cpu_ray import RayClusters

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
    # exact-KL TRM-Max and EGAE share a launch: the mask acts on the loss, the estimator on the
    # advantages (from verl's critic); the cross-backend test reads the advantages from verl's batch
    "trm_max_egae": ("algorithm=ppo", "mask=trm_max", "estimator=egae"),
    "gtpo": ("algorithm=gtpo",),
    # REPO-R's controller on PPO (verl's own GAE and critic): the requeue resumes the critic too
    "repo_r_gae": ("algorithm=repo_r", "estimator=gae"),
}
# the cell stopped by a signal after iteration 1 and resumed (test_repo_r_requeue): two launches
REQUEUE_CELL = "repo_r_gae"
# cells launched at once (one Ray cluster each): one verl launch keeps about 1.2 of 2 cores busy
# (start-up is mostly one process importing at a time), two keep both; each adds about 4.5 GiB at peak
PARALLEL = max(1, int(os.environ.get("TRUSTBENCH_VERL_STAGE_PARALLEL", "2")))
# launch order, longest first (the requeued cell is two launches, README's cell evaluates too)
LAUNCH_ORDER = [REQUEUE_CELL, README_CELL, *(name for name in CELLS if name not in (REQUEUE_CELL, README_CELL))]
# a hang guard, not a target: alone a cell takes 1.5-2 minutes; beside the rest of the suite on 2 cores the
# GRPO cross-backend cell took 592 s (at a6e64ca), so 600 s left no margin, and the requeued cell's first
# attempt passed 900 s once (CI at 0a88c29, while the stage's own PSS sampler and the runs' memory guards
# still took about a core between them)
CELL_TIMEOUT_S = 1200
# a stage test waits for its cell, which may queue behind other cells (PARALLEL at a time) that share
# the machine with the rest of the suite: the per-test limit is that of the whole stage
STAGE_TEST_TIMEOUT_S = 2400
COMPOSE_LOCK = threading.Lock()


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
    exit_code: int = 0
    output: str = ""
    # the requeued cell: what its stopped first attempt left
    first_attempt: dict | None = None


class MemorySampler(threading.Thread):
    """Peak summed PSS of the processes whose command line names one of ``markers``, their
    descendants, and this process."""

    MAX_SHARE = 0.03  # of one core, at most, for the samples

    def __init__(self, markers: list[str], every_s: float = 1.0) -> None:
        super().__init__(name="verl-cpu-memory", daemon=True)
        self.markers, self.every_s = markers, every_s
        self.pids: set[int] = set()  # the stage's own subprocesses (``trustbench run``), added as they start
        self.peak_bytes = 0
        self.cpu_s = 0.0  # this thread's CPU time in its samples (the stage's summary line)
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
        roots = {pid for marker in self.markers for pid in processes_mentioning(marker)} | set(self.pids)
        for pid in roots:
            pids.add(pid)
            try:
                pids.update(child.pid for child in psutil.Process(pid).children(recursive=True))
            except psutil.Error:
                continue
        return sum(self.pss_bytes(pid) for pid in pids)

    def run(self) -> None:
        """A sample every ``every_s``, or less often: reading a torch process's ``smaps_rollup`` costs about
        12 ms of kernel time, and the stage has 20-40 of them, so every second would take a fifth to a half of
        a core from the cells it measures; the wait is at least ``1 / MAX_SHARE`` times the last sample's CPU."""
        wait_s = self.every_s
        while not self.stopped.wait(wait_s):
            started = time.thread_time()
            self.peak_bytes = max(self.peak_bytes, self.sample())
            spent = time.thread_time() - started
            self.cpu_s += spent
            wait_s = max(self.every_s, spent / self.MAX_SHARE)


@dataclass
class CpuStage:
    """The session's verl-on-CPU cells (module docstring)."""

    home: Path
    uri: str
    sampler: MemorySampler
    clusters: RayClusters
    runs: dict[str, CellRun] = field(default_factory=dict)
    local: dict[str, set] = field(default_factory=dict)
    launches: int = 0
    pool: ThreadPoolExecutor | None = None
    pending: dict[str, Future] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # seconds ``prepare_model`` took (the embedded model's build, when the cache lacked it)
    model_s: float = 0.0

    def overrides(self, name: str, backend: str = "verl") -> list[str]:
        """The ``trustbench run`` arguments of cell ``name`` (README's cell: README_COMMAND alone, unless
        another backend is asked for: then the stage's sizes with the same method)."""
        if name == README_CELL and backend == "verl":
            return list(README_COMMAND)
        out = [*COMMON, *CELLS[name], f"tracking.uri={self.uri}"]
        return out if backend == "verl" else [o for o in out if not o.startswith("backend=")] + [f"backend={backend}"]

    def compose(self, name: str, backend: str = "verl"):
        from runners.config import compose

        with COMPOSE_LOCK:  # Hydra's compose API keeps global state: one thread at a time
            cfg, choices = compose(self.overrides(name, backend))
        return cfg, dict(choices)

    def layout(self, cfg) -> Path:
        from runners import paths
        from runners.config import run_key

        return paths.run_dir(run_key(cfg))

    def prepare_model(self) -> None:
        """The cells' model built (or loaded from the cache) and exported for verl, here, before any cell
        starts. In a fresh HOME the first cell would build the embedded model inside its own launch: under
        the whole suite's load that took 6.4 minutes, counted against that cell's ``CELL_TIMEOUT_S``, and
        README's cell printed the build's progress bar instead of verl's first line. Every cell uses the
        same model (``model_path`` of README's cell)."""
        from runners.backends.verl.process import model_path

        cfg, _ = self.compose(README_CELL)
        started = time.monotonic()
        model_path(cfg)
        self.model_s = time.monotonic() - started

    def start(self, names) -> None:
        """Launch cells ``names`` in the background, ``PARALLEL`` at a time, in ``LAUNCH_ORDER``."""
        self.pool = ThreadPoolExecutor(PARALLEL, thread_name_prefix="verl-cell")
        for name in sorted(set(names), key=LAUNCH_ORDER.index):
            self.pending[name] = self.pool.submit(self.launch, name)

    def verl(self, name: str) -> CellRun:
        """Cell ``name``'s run: waited for when it was started in the background, else launched now."""
        if name not in self.runs:
            future = self.pending.get(name)
            self.runs[name] = future.result() if future is not None else self.launch(name)
        return self.runs[name]

    def launch(self, name: str) -> CellRun:
        return self.requeue(name) if name == REQUEUE_CELL else self.command(name)

    def command(self, name: str, *, stop_when: Path | None = None) -> CellRun:
        """``trustbench run`` + the cell's arguments in a process of its own, its micro-batches dumped.
        README's cell runs as a user runs it: no Ray address (it starts its own Ray), no MLflow
        variables, the stage's home (so its run is in the stage's store); the others lease one of the
        session's Ray clusters. ``stop_when``: a file whose appearance sends the process SIGUSR1 (a stop signal);
        otherwise a non-zero exit fails with the command's output."""
        if name != README_CELL:
            with self.clusters.lease() as ray_env:
                return self._command(name, ray_env, stop_when)
        return self._command(name, {}, stop_when)

    def _command(self, name: str, ray_env: dict[str, str], stop_when: Path | None) -> CellRun:
        from runners.backends.verl.plugins.batch_dump import DUMP_ENV
        from runners.status import read_status

        cfg, choices = self.compose(name)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_"))}
        dump = self.home / "dumps" / name
        env.update({"TRUSTBENCH_HOME": str(self.home), DUMP_ENV: str(dump), **ray_env})
        exe = shutil.which("trustbench", path=os.path.dirname(sys.executable)) or "trustbench"
        with self.lock:
            self.launches += 1
            log = self.home / f"{name}.{self.launches}.out"
        started = time.monotonic()
        with log.open("w") as out:
            proc = subprocess.Popen(
                [exe, "run", *self.overrides(name)], cwd=self.home, env=env, stdout=out, stderr=subprocess.STDOUT
            )
            self.sampler.pids.add(proc.pid)
            if stop_when is not None:
                signal_on_file(proc, stop_when)
            timed_out = False
            try:
                code = proc.wait(timeout=CELL_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                timed_out = True
                code = end_tree(proc)
        wall = time.monotonic() - started
        output = log.read_text(errors="replace")
        what = f"timed out after {CELL_TIMEOUT_S} s (then exit {code})" if timed_out else f"exit {code}"
        assert not timed_out and (stop_when is not None or code == 0), f"cell {name}: {what}\n{output[-4000:]}"
        status = read_status(self.layout(cfg)) or {}
        result = {key: status.get(key) for key in ("status", "run_id", "name")}
        return CellRun(name, cfg, choices, result, self.layout(cfg), dump, wall, code, output)

    def requeue(self, name: str) -> CellRun:
        """A requeued run: the first attempt gets a stop signal as soon as verl is launched (its log file
        exists), the second resumes. What the first left (exit, status, checkpoint, MLflow) is recorded
        in ``first_attempt`` before the second starts."""
        from runners.backends.verl.checkpoints import latest_checkpoint_step
        from runners.backends.verl.layout import VerlLayout
        from runners.backends.verl.plugins.controllers import STATE_FILE

        cfg, _ = self.compose(name)
        layout = VerlLayout.of(self.layout(cfg))
        first = self.command(name, stop_when=layout.log_file(1))
        run_id = first.result["run_id"]
        snapshot = {
            "exit": first.exit_code,
            "status": first.result["status"],
            "run_id": run_id,
            "checkpoint_step": latest_checkpoint_step(layout.checkpoints),
            "state_file": (layout.checkpoints / "global_step_1" / STATE_FILE).is_file(),
            "mlflow_status": self.client().get_run(run_id).info.status if run_id else None,
            "pg_loss_steps": [s for s, _ in self.history(run_id, metric_names.PG_LOSS)] if run_id else [],
            "output": first.output[-4000:],
        }
        second = self.command(name)
        second.wall_s += first.wall_s
        second.first_attempt = snapshot
        return second

    def local_keys(self, name: str) -> set[str]:
        """Metric names the built-in backend logs for the same cell (2 iterations; for README_CELL the
        stage's sizes with the same method), run in this process."""
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
            run_id = (cell.result or {}).get("run_id")
            if not run_id:
                continue
            for key in self.client().get_run(run_id).data.metrics:
                if key.startswith("timing_s/"):
                    out.setdefault(key, []).extend(v for _, v in self.history(run_id, key))
        return out

    def close(self) -> None:
        """Wait for launches still running, start no new one."""
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


def end_tree(proc: subprocess.Popen, grace_s: float = 60.0) -> int:
    """End a cell's ``trustbench run`` and everything it started; returns its exit status.

    SIGTERM first: trustbench ends verl's process group itself (``process.terminate``). Whatever of the
    tree is left after ``grace_s`` is SIGKILLed, verl's driver included: it runs in a session of its own,
    so killing trustbench alone would leave it holding the leased Ray cluster's logical GPU, and every
    later launch on that cluster would fail in verl's resource check ("Total available GPUs 0").
    """
    import psutil

    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.Error:
        tree = []
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    try:
        tree += [p for p in psutil.Process(proc.pid).children(recursive=True) if p not in tree]
    except psutil.Error:
        pass
    for process in tree:
        try:
            process.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(tree, timeout=30)
    return proc.wait()


def signal_on_file(proc: subprocess.Popen, path: Path, timeout_s: float = CELL_TIMEOUT_S) -> threading.Thread:
    """SIGUSR1 to ``proc`` as soon as ``path`` exists (while it runs, at most ``timeout_s``: the cell's
    own limit; in a fresh HOME under the whole suite's load the command once took 5.5 minutes, the
    embedded model's build included, to reach verl, and a 300 s watch had given up by then)."""

    def wait_and_signal():
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and proc.poll() is None:
            if path.exists():
                proc.send_signal(signal.SIGUSR1)
                return
            time.sleep(0.2)

    thread = threading.Thread(target=wait_and_signal, daemon=True)
    thread.start()
    return thread


def cells_of(items) -> list[str]:
    """The cells the selected tests read: a ``name`` parameter, else the test's ``uses_cells``, else all."""
    out: list[str] = []
    for item in items:
        if "cpu_stage" not in getattr(item, "fixturenames", ()):
            continue
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "name" in callspec.params:
            out.append(callspec.params["name"])
        else:
            out.extend(getattr(getattr(item, "function", None), "stage_cells", LAUNCH_ORDER))
    return out


def uses_cells(*names: str):
    """Declare the stage cells a test reads (so that running it alone launches only those)."""

    def mark(fn):
        fn.stage_cells = names
        return fn

    return mark


# the session's stage (read by tests/verl/conftest.py for its summary)
STAGE: dict[str, CpuStage] = {}


@pytest.fixture(scope="session")
def cpu_stage(request, tmp_path_factory, cpu_ray) -> Iterator[CpuStage]:
    """The verl-on-CPU stage under a temporary ``TRUSTBENCH_HOME`` (restored afterwards); the cells the
    session's selected tests read start at once in the background."""
    from runners import tracking
    from runners.backends.verl.translate import CPU_ENTRYPOINT, ENTRYPOINT

    home = tmp_path_factory.mktemp("verl_cpu_home")
    previous = os.environ.get("TRUSTBENCH_HOME")
    os.environ["TRUSTBENCH_HOME"] = str(home)
    sampler = MemorySampler([*(str(c.temp_dir) for c in cpu_ray.clusters), ENTRYPOINT, CPU_ENTRYPOINT])
    sampler.start()
    uri = tracking.ensure_store(f"sqlite:///{home}/mlflow.db")
    stage = CpuStage(home=home, uri=uri, sampler=sampler, clusters=cpu_ray)
    STAGE["stage"] = stage
    stage.prepare_model()
    stage.start(cells_of(request.session.items))
    try:
        yield stage
    finally:
        stage.close()
        sampler.stopped.set()
        stage.finished = time.monotonic()
        if previous is None:
            os.environ.pop("TRUSTBENCH_HOME", None)
        else:
            os.environ["TRUSTBENCH_HOME"] = previous


__all__ = [
    "CELLS",
    "CELL_TIMEOUT_S",
    "COMMON",
    "EXPERIMENT",
    "LAUNCH_ORDER",
    "PARALLEL",
    "README_CELL",
    "README_COMMAND",
    "REQUEUE_CELL",
    "STAGE",
    "STAGE_TEST_TIMEOUT_S",
    "CellRun",
    "CpuStage",
    "cells_of",
    "cpu_stage",
    "uses_cells",
]
