"""One Ray cluster for the verl-on-CPU tests (session fixture ``cpu_ray``), shared by every verl launch.

Design: each ``VerlBackend`` launch of ``verl.trainer.main_ppo`` would start and stop its own Ray
(about 5 s each on 2 cores, more under load). The fixture starts one head node with its own
``--temp-dir`` and free ports (so it never meets another Ray on the machine), with the logical GPU
verl's resource pools ask for and the logical CPUs its helper actors need, and exports
``RAY_ADDRESS`` (and ``RAY_AUTH_MODE``, which cluster and clients must share): verl's ``ray.init()`` joins it and the backend leaves Ray's resources out of the
overrides (``cpu_mode.CPUPlacement.ray_address``). The workers inherit the head's environment, so
``PYTHONPATH`` points at this checkout. At the end every process whose command line names the
cluster's temp dir is terminated (never ``ray stop``, which would stop other users' clusters), and
the fixture checks that none is left.

Registered once, from tests/verl/conftest.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.slurm.cluster import free_ports, processes_mentioning

REPO_ROOT = Path(__file__).resolve().parents[2]
LOGICAL_CPUS = 8
LOGICAL_GPUS = 1
# the cluster and every client must agree (a driver expecting a token refuses the GCS's calls without one)
AUTH_MODE = "disabled"


@dataclass
class RayCluster:
    """A running head node: its address and the temp dir that names its processes."""

    address: str
    temp_dir: Path
    started_s: float


def start_cluster(env: dict[str, str] | None = None) -> RayCluster:
    """``ray start --head`` on 127.0.0.1 with free ports and a private temp dir (short: Ray's sockets live there)."""
    ray = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"
    temp_dir = Path(tempfile.mkdtemp(prefix="tbray-", dir="/tmp"))
    ports = free_ports(9)
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["RAY_AUTH_MODE"] = AUTH_MODE
    started = time.monotonic()
    subprocess.run(
        [
            ray,
            "start",
            "--head",
            "--node-ip-address=127.0.0.1",
            f"--port={ports[0]}",
            f"--object-manager-port={ports[1]}",
            f"--node-manager-port={ports[2]}",
            f"--ray-client-server-port={ports[3]}",
            f"--dashboard-agent-listen-port={ports[4]}",
            f"--dashboard-agent-grpc-port={ports[5]}",
            f"--runtime-env-agent-port={ports[6]}",
            f"--metrics-export-port={ports[7]}",
            f"--min-worker-port={20000 + ports[8] % 20000}",
            f"--max-worker-port={20000 + ports[8] % 20000 + 200}",
            f"--num-cpus={LOGICAL_CPUS}",
            f"--num-gpus={LOGICAL_GPUS}",
            "--object-store-memory=268435456",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={temp_dir}",
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=180,
    )
    return RayCluster(address=f"127.0.0.1:{ports[0]}", temp_dir=temp_dir, started_s=time.monotonic() - started)


def stop_cluster(cluster: RayCluster, grace_s: float = 15.0) -> list[int]:
    """Terminate every process of ``cluster`` (by its temp dir); returns the pids still alive after KILL."""
    marker = str(cluster.temp_dir)

    def alive() -> list[int]:
        return [pid for pid in processes_mentioning(marker) if pid != os.getpid()]

    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        for pid in alive():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and alive():
            time.sleep(0.2)
    left = alive()
    shutil.rmtree(cluster.temp_dir, ignore_errors=True)
    return left


@pytest.fixture(scope="session")
def cpu_ray() -> Iterator[RayCluster]:
    """A shared Ray head for the session's verl-on-CPU launches (``RAY_ADDRESS`` set while it runs)."""
    cluster = start_cluster()
    previous = {key: os.environ.get(key) for key in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    os.environ.update(RAY_ADDRESS=cluster.address, RAY_AUTH_MODE=AUTH_MODE)
    try:
        yield cluster
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        left = stop_cluster(cluster)
        assert not left, f"Ray processes of {cluster.temp_dir} still alive: {left}"


__all__ = ["RayCluster", "cpu_ray", "start_cluster", "stop_cluster"]
