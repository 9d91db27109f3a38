"""Fixtures of the analysis tests: an isolated trustbench home and one real MLflow sqlite store,
holding synthetic sweeps with known curves (``analysis.synthetic``), shared by the whole session
(creating an MLflow sqlite store costs ~3 s of migrations), and an ``mlflow server`` on 127.0.0.1
serving that store (started once, on first use: ~5-10 s)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass

import pytest

from analysis.synthetic import SyntheticSpec, _m, log_synthetic_experiment, profile

TROLL_SPEC = SyntheticSpec(
    "troll_table1",
    [
        _m("GRPO", "grpo", final=0.6),
        _m("GRPO+TROLL", "grpo", "troll", final=0.7, rate=0.08),
        _m("GSPO", "gspo", final=0.2),
        _m("GSPO+TROLL", "gspo", "troll_seq", final=0.68, rate=0.08),
    ],
    seeds=(0, 1),
    steps=30,
    eval_every=5,
    eval_sets=("dapo_math", "math_eval"),
    model="qwen3_8b",
)
ENTROPY_SPEC = SyntheticSpec(
    "entropy_tables",
    profile("entropy_tables").methods[:3],
    seeds=(0, 1, 2),
    steps=30,
    eval_every=5,
    eval_sets=("aime24", "aime25"),
    model="qwen3_8b",
    noise=0.05,
)


@dataclass
class Store:
    uri: str
    truth: dict  # experiment -> {(method, seed): {"run_id", "curves"}}
    specs: dict  # experiment -> SyntheticSpec


@pytest.fixture(scope="session")
def tb_home(tmp_path_factory):
    """TRUSTBENCH_HOME in a temp dir for the session (paths, caches, artifacts); MLFLOW_TRACKING_URI unset."""
    home = tmp_path_factory.mktemp("trustbench_home")
    saved = {k: os.environ.get(k) for k in ("TRUSTBENCH_HOME", "MLFLOW_TRACKING_URI")}
    os.environ["TRUSTBENCH_HOME"] = str(home)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    yield home
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def store(tb_home):
    # on tmpfs when there is one: sqlite commits (one per MLflow call) are ~2x cheaper there
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    db_dir = tempfile.mkdtemp(prefix="tb-mlflow-", dir=shm)
    uri = f"sqlite:///{db_dir}/mlflow.db"
    specs = {s.experiment: s for s in (TROLL_SPEC, ENTROPY_SPEC)}
    truth = {name: log_synthetic_experiment(uri, spec) for name, spec in specs.items()}
    yield Store(uri, truth, specs)
    shutil.rmtree(db_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def mlflow_server(store, tmp_path_factory):
    """URL of an ``mlflow server`` (one worker) on ``store.uri`` that proxies artifacts: experiments
    created through it get ``mlflow-artifacts:`` locations, so artifacts travel over HTTP. Started as
    trustbench starts its servers (``SERVER_ENV``: no job runner, whose seven processes held 1.5 GiB
    for the rest of the test worker's session)."""
    from runners.tracking_server import SERVER_ENV

    artifacts = tmp_path_factory.mktemp("server_artifacts")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", store.uri, "--artifacts-destination", str(artifacts), "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **SERVER_ENV},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2)
                break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    pytest.fail("mlflow server did not start")
                time.sleep(0.25)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)
