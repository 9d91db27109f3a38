"""The stage's helpers that need no Ray: the port blocks of parallel clusters, which cells the selected tests read."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

from tests.verl import cpu_ray
from tests.verl.cpu_stage import LAUNCH_ORDER, README_CELL, cells_of, uses_cells


def test_port_blocks_are_disjoint_free_and_below_the_ephemeral_range(monkeypatch):
    """Each cluster's ports (its head's servers and its workers) are one block, apart from every other
    cluster's, above Ray's default worker ports and below the kernel's ephemeral range, where a port
    free when picked can go to an outgoing connection before the server binds it."""
    monkeypatch.setattr(cpu_ray, "_BLOCKS", [])
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    clusters = []
    for start in (cpu_ray.port_block() for _ in range(4)):
        servers, (first, last) = cpu_ray.block_ports(start)
        clusters.append([*servers, *range(first, last + 1)])  # every port ray start is given
    used = [port for ports in clusters for port in ports]
    assert len(used) == len(set(used))  # no port shared by two clusters, or by a server and a worker
    assert all(cpu_ray.WORKER_PORTS_FROM <= port < low for port in used)  # clear of Ray's defaults and the kernel's
    assert all(len(ports) == cpu_ray.SERVER_PORTS + cpu_ray.WORKER_PORTS + 1 for ports in clusters)


def test_cells_of_reads_the_name_parameter_the_declaration_or_takes_every_cell():
    @uses_cells(README_CELL)
    def declared(cpu_stage):
        pass

    def undeclared(cpu_stage):
        pass

    def unrelated():
        pass

    items = [
        SimpleNamespace(fixturenames=("cpu_stage", "name"), callspec=SimpleNamespace(params={"name": "gtpo"})),
        SimpleNamespace(fixturenames=("cpu_stage",), function=declared),
        SimpleNamespace(fixturenames=(), function=unrelated),
    ]
    assert cells_of(items) == ["gtpo", README_CELL]
    assert sorted(cells_of([SimpleNamespace(fixturenames=("cpu_stage",), function=undeclared)])) == sorted(LAUNCH_ORDER)


def test_a_cluster_without_its_raylet_is_named_with_its_logs(tmp_path):
    """``raylet_gone``: no process of the cluster's temp dir is a raylet -> the end of its raylet log."""
    logs = tmp_path / "session_latest" / "logs"
    logs.mkdir(parents=True)
    (logs / "raylet.out").write_text("starting\nFailed to bind node manager port 20001: Address already in use\n")
    cluster = cpu_ray.RayCluster(address="127.0.0.1:1", temp_dir=tmp_path, started_s=0.0)
    problem = cpu_ray.raylet_gone(cluster)
    assert "raylet.out: starting | Failed to bind node manager port 20001" in problem
    assert "raylet.err: (no log)" in problem


def test_a_cluster_whose_raylet_runs_is_not_named(tmp_path):
    """A process whose program is ``<temp dir>/raylet`` (``sleep`` under that name) counts as the raylet."""
    raylet = tmp_path / "raylet"
    raylet.symlink_to(shutil.which("sleep"))
    proc = subprocess.Popen([str(raylet), "30"])
    # Popen returns once the child's close-on-exec pipe closes, which the kernel does before it writes
    # the new program's arguments: under load /proc/<pid>/cmdline can still be empty for a moment.
    deadline = time.monotonic() + 10.0
    while not Path(f"/proc/{proc.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        cluster = cpu_ray.RayCluster(address="127.0.0.1:1", temp_dir=tmp_path, started_s=0.0)
        assert cpu_ray.raylet_gone(cluster) == ""
    finally:
        proc.kill()
        proc.wait()
    assert cpu_ray.raylet_gone(cluster).startswith("raylet.err: (no log)")


def test_a_timed_out_cell_ends_with_the_process_it_started_in_a_session_of_its_own(tmp_path):
    """``end_tree``: a ``trustbench run`` that outlives its limit is ended with what it started, verl's
    driver included, though that runs in a session of its own and ignores SIGTERM (here: a stand-in
    child that does). A killed leader alone would leave the child holding the leased Ray cluster."""
    import psutil

    from tests.verl.cpu_stage import end_tree

    child_pid = tmp_path / "child.pid"
    parent = (
        "import signal, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'], "
        "start_new_session=True)\n"
        f"open({str(child_pid)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen(["python3", "-c", parent])
    deadline = time.monotonic() + 30
    while not (child_pid.exists() and child_pid.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = psutil.Process(int(child_pid.read_text()))
    assert end_tree(proc, grace_s=2) == -15  # the leader ends on SIGTERM (its default action)
    child.wait(timeout=30)  # the child, which ignores SIGTERM, was SIGKILLed (TimeoutExpired otherwise)
    assert not child.is_running()
