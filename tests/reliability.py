"""Helpers of the reliability tests: the real command in a subprocess, and MLflow read back independently.

The reference for "nothing lost" is MLflow's own client on the store (runs, statuses, tags, metric
histories), never trustbench's code; the reference for "one clear message" is the command's stderr.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# the embedded default, one step, no evaluation: a run takes seconds
FAST = [
    "trainer.total_steps=1",
    "trainer.eval_every=0",
    "dataset.eval_limit=4",
    "trainer.prompts_per_step=2",
    "trainer.n=4",
    "trainer.mini_batch_prompts=2",
    "progress=false",
]


@pytest.fixture(name="home")
def cli_home(tmp_path, monkeypatch):
    """A fresh trustbench home for commands run in this process (``cli.main``): no tracking URI from the
    environment, the working directory beside it. Test modules import it to use the ``home`` fixture."""
    home = tmp_path / "home"
    monkeypatch.setenv("TRUSTBENCH_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    return home


def command_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update({"PYTHONPATH": str(REPO), "TRUSTBENCH_HOME": str(home), "OMP_NUM_THREADS": "1", **extra})
    return env


def trustbench(args, home: Path, *, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """``trustbench ARGS`` in a subprocess started in ``home``'s parent (``timeout`` bounds a hang)."""
    home.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "runners.cli", *args],
        cwd=home.parent,
        env=command_env(home, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start(args, home: Path, **env: str) -> subprocess.Popen:
    home.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "runners.cli", *args],
        cwd=home.parent,
        env=command_env(home, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def one_message(stderr: str, *names: str) -> str:
    """The single ``trustbench:`` line of ``stderr`` (no traceback), which must name every ``names``."""
    assert "Traceback" not in stderr, stderr
    lines = [ln for ln in stderr.splitlines() if ln.startswith("trustbench:")]
    assert len(lines) == 1, stderr
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


def client(home: Path):
    from mlflow import MlflowClient

    return MlflowClient(f"sqlite:///{home / 'mlflow.db'}")


def runs(home: Path, uri: str | None = None) -> list:
    """Every active MLflow run of the store (all experiments), read with MLflow's client."""
    from mlflow import MlflowClient

    if uri is None and not (home / "mlflow.db").exists():
        return []
    c = MlflowClient(uri) if uri else client(home)
    ids = [e.experiment_id for e in c.search_experiments()]
    return list(c.search_runs(ids)) if ids else []


def steps(home: Path, run_id: str, key: str = "training/global_step") -> list[int]:
    return sorted(int(m.step) for m in client(home).get_metric_history(run_id, key))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def only_run_dir(home: Path) -> Path:
    (run_dir,) = [p for p in (home / "runs").iterdir() if p.is_dir()]
    return run_dir
