"""Ray clusters for the verl-on-CPU tests (session fixture ``cpu_ray``), shared by the stage's verl launches.

Design: each ``VerlBackend`` launch of ``verl.trainer.main_ppo`` would start and stop its own Ray
(about 5 s each on 2 cores, more under load). The fixture starts ``clusters`` head nodes, one per
verl launch that may run at once, each with its own ``--temp-dir`` and ports (a free block below the
kernel's ephemeral range, ``port_block``; so it never meets another Ray on the machine), the logical
GPU verl's resource pools ask for and the logical CPUs its
helper actors need. One cluster runs one verl launch at a time: TransferQueue (verl 0.9.1's
trainer data plane) keeps its controller as a named actor of a fixed namespace, one per cluster, so a
second launch on the same cluster takes over the first's controller and kills it when it ends. A
launch leases a cluster (``RayClusters.lease``) and joins it through ``RAY_ADDRESS`` (with
``RAY_AUTH_MODE``, which cluster and clients must share): verl's ``ray.init()`` joins it and the
backend leaves Ray's resources out of the overrides (``cpu_mode.CPUPlacement.ray_address``). The
workers inherit the head's environment, so ``PYTHONPATH`` points at this checkout. At the end every
process whose command line names a cluster's temp dir is terminated (never ``ray stop``, which would
stop other users' clusters), and the fixture checks that none is left.

Registered once, from tests/verl/conftest.py.
"""

from __future__ import annotations

import os
import queue
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.slurm.cluster import processes_mentioning

REPO_ROOT = Path(__file__).resolve().parents[2]
LOGICAL_CPUS = 8
LOGICAL_GPUS = 1
# the cluster and every client must agree (a driver expecting a token refuses the GCS's calls without one)
AUTH_MODE = "disabled"


# every port of a cluster is taken between Ray's default worker ports (10002-19999, those of a Ray that
# verl starts itself, as README's cell does) and the kernel's ephemeral range: a port picked in the
# ephemeral range (free when picked) can be handed to an outgoing connection before the server binds it
# (a raylet that cannot bind its port dies, and every driver then fails with "No node info found").
# A cluster's block: SERVER_PORTS for its head's servers, then WORKER_PORTS + 1 for its workers.
SERVER_PORTS = 8
WORKER_PORTS = 200
WORKER_PORTS_FROM = 20000
_BLOCKS: list[int] = []  # starts of the blocks this process gave out
BLOCK = SERVER_PORTS + WORKER_PORTS + 1


def port_block() -> int:
    """The first of ``BLOCK`` consecutive ports that are free now, above ``WORKER_PORTS_FROM`` and below the
    ephemeral range, and apart from every block given to this process's other clusters (two clusters
    never share a port)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(100):
        start = rng.randrange(WORKER_PORTS_FROM, max(low - BLOCK, WORKER_PORTS_FROM + 1))
        if any(abs(start - other) < BLOCK for other in _BLOCKS):
            continue
        if all(_bindable(port) for port in range(start, start + BLOCK)):
            _BLOCKS.append(start)
            return start
    raise RuntimeError("no free range of Ray worker ports below the ephemeral range")


def block_ports(start: int) -> tuple[list[int], tuple[int, int]]:
    """The head's ``SERVER_PORTS`` server ports and the (first, last) worker port of the block at ``start``."""
    workers = start + SERVER_PORTS
    return list(range(start, workers)), (workers, workers + WORKER_PORTS)


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class RayCluster:
    """A running head node: its address and the temp dir that names its processes."""

    address: str
    temp_dir: Path
    started_s: float


def start_cluster(env: dict[str, str] | None = None) -> RayCluster:
    """``ray start --head`` on 127.0.0.1 with a free block of ports (``port_block``) and a private temp dir
    (short: Ray's sockets live there)."""
    ray = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"
    temp_dir = Path(tempfile.mkdtemp(prefix="tbray-", dir="/tmp"))
    ports, (min_worker, max_worker) = block_ports(port_block())
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["RAY_AUTH_MODE"] = AUTH_MODE
    started = time.monotonic()
    done = subprocess.run(
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
            f"--min-worker-port={min_worker}",
            f"--max-worker-port={max_worker}",
            f"--num-cpus={LOGICAL_CPUS}",
            f"--num-gpus={LOGICAL_GPUS}",
            "--object-store-memory=268435456",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={temp_dir}",
        ],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=180,
    )
    if done.returncode != 0:
        raise RuntimeError(f"ray start failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return RayCluster(address=f"127.0.0.1:{ports[0]}", temp_dir=temp_dir, started_s=time.monotonic() - started)


def stop_cluster(cluster: RayCluster, grace_s: float = 15.0) -> list[int]:
    """Terminate every process of ``cluster``: those naming its temp dir and their descendants (Ray's
    agents and workers rename themselves ``ray::...``), found before the first signal, since a
    descendant whose parent dies is re-parented; returns the pids still alive after KILL."""
    import psutil

    marker = str(cluster.temp_dir)
    members: set[psutil.Process] = set()
    for pid in processes_mentioning(marker):
        if pid == os.getpid():
            continue
        try:
            root = psutil.Process(pid)
            members.update([root, *root.children(recursive=True)])
        except psutil.Error:
            continue

    def alive() -> list[int]:
        found = {pid for pid in processes_mentioning(marker) if pid != os.getpid()}
        for proc in members:
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    found.add(proc.pid)
            except psutil.Error:
                continue
        return sorted(found)

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


def raylet_gone(cluster: RayCluster) -> str:
    """'' while ``cluster``'s raylet process runs; else the last lines of its raylet and GCS logs."""
    for pid in processes_mentioning(str(cluster.temp_dir)):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"/raylet"):
                return ""
        except OSError:
            continue
    logs = cluster.temp_dir / "session_latest" / "logs"
    tails = []
    for name in ("raylet.err", "raylet.out", "gcs_server.err"):
        try:
            lines = (logs / name).read_text(errors="replace").splitlines()[-5:]
        except OSError:
            lines = ["(no log)"]
        tails.append(f"{name}: " + " | ".join(lines))
    return "; ".join(tails)


class RayClusters:
    """Running clusters, each leased to one launch at a time."""

    def __init__(self, clusters: list[RayCluster]) -> None:
        self.clusters = clusters
        self.free: queue.Queue[RayCluster] = queue.Queue()
        for cluster in clusters:
            self.free.put(cluster)

    @contextmanager
    def lease(self) -> Iterator[dict[str, str]]:
        """A free cluster for the block (waits for one): the environment variables that join it. A cluster
        whose raylet is gone fails here, with the end of its logs, not in verl's ``ray.init``."""
        cluster = self.free.get()
        problem = raylet_gone(cluster)
        if problem:
            self.free.put(cluster)
            raise RuntimeError(f"the Ray cluster at {cluster.address} ({cluster.temp_dir}) lost its raylet: {problem}")
        try:
            yield {"RAY_ADDRESS": cluster.address, "RAY_AUTH_MODE": AUTH_MODE}
        finally:
            self.free.put(cluster)


def ray_clusters(count: int) -> Iterator[RayClusters]:
    """``count`` clusters for the duration of the generator; all their processes stopped afterwards."""
    clusters: list[RayCluster] = []
    try:
        for _ in range(count):
            clusters.append(start_cluster())
        yield RayClusters(clusters)
    finally:
        left = [pid for cluster in clusters for pid in stop_cluster(cluster)]
        assert not left, f"Ray processes of {[str(c.temp_dir) for c in clusters]} still alive: {left}"


@pytest.fixture(scope="session")
def cpu_ray() -> Iterator[RayClusters]:
    """Ray heads for the session's verl-on-CPU launches, one per launch the stage runs at once."""
    from tests.verl.cpu_stage import PARALLEL

    yield from ray_clusters(PARALLEL)


__all__ = ["RayCluster", "RayClusters", "cpu_ray", "ray_clusters", "start_cluster", "stop_cluster"]
