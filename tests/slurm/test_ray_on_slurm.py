"""slurm/ray_on_slurm.sh: the Ray-on-Slurm bootstrap the verl backend runs inside its allocation.

The slurm-marked test runs the real bootstrap on the test cluster (2 fake GPUs, on 2 emulated nodes
when the cluster has them) with a command that
prints ``ray.cluster_resources()``, and checks the Ray cluster against the Slurm allocation: as many
Ray nodes as allocated nodes, as many Ray GPUs as allocated GPUs, the command's exit status passed
through, and no Ray process left once the job ends. The other tests check the script's pure parts
(GPU counting, refusing to run outside an allocation) without a cluster.

Run:  pytest tests/slurm/test_ray_on_slurm.py      (the slurm test needs the cluster; ~35 s)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .cluster import free_ports, processes_mentioning

SCRIPT = Path(__file__).resolve().parents[2] / "slurm" / "ray_on_slurm.sh"

PROBE = """
import json, os, signal, sys, time, ray
ray.init()
alive = [n for n in ray.nodes() if n["Alive"]]
signal.signal(signal.SIGUSR1, lambda *_: (print("GOT_USR1", flush=True), sys.exit(5)))
print("RAY_PROBE " + json.dumps({"resources": ray.cluster_resources(), "alive_nodes": len(alive),
      "slurm_nodes": int(os.environ["SLURM_JOB_NUM_NODES"])}), flush=True)
time.sleep(60)
sys.exit(6)
"""


def _script(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CUDA_VISIBLE"))}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env={**clean, **env}, capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"CUDA_VISIBLE_DEVICES": "0,1,3"}, 3),
        ({"CUDA_VISIBLE_DEVICES": "2", "SLURM_GPUS_ON_NODE": "4"}, 1),
        ({"SLURM_GPUS_ON_NODE": "2"}, 2),
        ({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, 0),
        ({}, 0),
    ],
)
def test_count_gpus_follows_the_step_environment(env, expected):
    """A node counts the GPUs its Slurm step can see: CUDA_VISIBLE_DEVICES first (what CUDA will
    use), else SLURM_GPUS_ON_NODE, else none."""
    proc = _script("--count-gpus", **env)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) == expected


def test_refuses_to_run_outside_an_allocation():
    """Without SLURM_JOB_ID / SLURM_JOB_NODELIST the bootstrap stops with exit 2 and says why."""
    proc = _script("python", "-c", "print('never')")
    assert proc.returncode == 2
    assert "not inside a Slurm allocation" in proc.stderr
    assert "never" not in proc.stdout


@pytest.mark.slurm
@pytest.mark.slow
# every GPU of the test cluster, and a Ray head that must answer its nodes within Ray's fixed 30 s:
# before the background sweeps, which keep both cores busy (beside them it missed that deadline)
@pytest.mark.slurm_whole_cluster
@pytest.mark.parametrize("first_worker_fails", [False, True], ids=["plain", "worker-retried"])
def test_bootstrap_builds_ray_cluster_matching_allocation(slurm_cluster, tmp_path, first_worker_fails):
    """On an allocation of 2 (fake) GPUs -- one per node on 2 nodes when the test cluster emulates
    several, else 2 on one node -- the Ray cluster has as many alive nodes as Slurm allocated and 2
    GPUs, the command runs with RAY_ADDRESS set, gets the USR1 sent to the batch shell, and its
    exit status (5, from its USR1 handler) becomes the job's; no process of this Ray cluster
    outlives the job. ``worker-retried``: the worker's first ``ray start`` fails (as one that missed
    Ray's 30 s registration deadline on a loaded head): the bootstrap starts it again in a new step."""
    # Two GPUs in all: one per node on two nodes when the cluster emulates several, else both on one.
    if len(slurm_cluster.nodes) >= 2 and slurm_cluster.gpus >= 1:
        nodes, allocation = 2, ["--nodes=2", "--gpus-per-node=1"]
    elif slurm_cluster.gpus >= 2:
        nodes, allocation = 1, ["--nodes=1", "--gpus=2"]
    else:
        pytest.skip(f"slurm: the test cluster has {slurm_cluster.gpus} GPU(s) per node, this test needs 2 in all")
    if first_worker_fails and nodes < 2:
        pytest.skip("slurm: no worker node to fail (the test cluster has one node)")
    gcs_port, client_port, agent_port, worker_agent_port = free_ports(4)
    python_dir = os.path.dirname(sys.executable)
    ray_bin = shutil.which("ray", path=python_dir) or "ray"
    if first_worker_fails:  # a ray that fails the first worker start (the mark is shared: one host)
        wrapper = tmp_path / "ray-failing-once"
        wrapper.write_text(
            "#!/bin/bash\n"
            f'if [[ " $* " == *" --address="* ]] && mkdir "{tmp_path}/failed-once" 2>/dev/null; then\n'
            '    echo "simulated: the node timed out during startup" >&2; exit 1\n'
            f'fi\nexec {ray_bin} "$@"\n'
        )
        wrapper.chmod(0o755)
        ray_bin = str(wrapper)
    body = f"""export PATH={python_dir}:$PATH
export TB_RAY_BIN={ray_bin}
export TB_RAY_PORT={gcs_port} TB_RAY_CLIENT_PORT={client_port} TB_RAY_OBJECT_STORE_MB=100 TB_RAY_WAIT_S=240
export TB_RAY_PYTHON={sys.executable}
export TB_RAY_HEAD_START_ARGS="--dashboard-agent-listen-port={agent_port}"
export TB_RAY_WORKER_START_ARGS="--dashboard-agent-listen-port={worker_agent_port}"
exec bash {SCRIPT} {sys.executable} -c '{PROBE}'"""
    cpus = f"--cpus-per-task={min(2, slurm_cluster.cpus)}"
    job = slurm_cluster.sbatch(body, *allocation, "--ntasks-per-node=1", cpus, cwd=tmp_path)
    temp_dir = f"/tmp/ray-{job}"
    try:
        output_file = tmp_path / f"slurm-{job}.out"

        def probe_line() -> str | None:
            text = output_file.read_text() if output_file.exists() else ""
            lines = [line for line in text.splitlines() if line.startswith("RAY_PROBE ")]
            if not lines and slurm_cluster.job_info(job).get("JobState") not in (None, "PENDING", "RUNNING"):
                pytest.fail(f"job ended without a RAY_PROBE line; output:\n{text[-4000:]}")
            return lines[0] if lines else None

        line = slurm_cluster.wait(probe_line, 300, "the command's RAY_PROBE line")
        # The batch shell forwards USR1 (as sent before a time limit) to the command.
        slurm_cluster.run("scancel", "--batch", "--signal=USR1", str(job))
        info = slurm_cluster.wait_job(job, timeout=60)
        output = output_file.read_text()
        probe = json.loads(line.removeprefix("RAY_PROBE "))
        assert probe["resources"].get("GPU") == 2.0
        assert probe["alive_nodes"] == probe["slurm_nodes"] == nodes
        assert probe["resources"]["object_store_memory"] == nodes * 100 * 1024 * 1024
        assert "GOT_USR1" in output
        assert ("ray start failed (try 1 of 3)" in output) == first_worker_fails
        assert info["JobState"] == "FAILED"
        assert info["ExitCode"] == "5:0"
        deadline = time.monotonic() + 10  # the job ends when its steps do; give stragglers a moment
        while processes_mentioning(temp_dir) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert processes_mentioning(temp_dir) == []
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
