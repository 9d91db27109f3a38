"""A verl cell's generated sbatch script on the test Slurm cluster, up to Ray on the allocated nodes.

The script ``render_sbatch`` writes for a cell (resources from the model size and ``launcher.*``)
is submitted to the test cluster (``slurm/testcluster``, fake GPUs, several emulated nodes). In the
job, ``run-cell`` composes the cell, opens its MLflow run and runs ``VerlBackend``, which starts
``slurm/ray_on_slurm.sh`` with the generated verl overrides. The verl entry point is replaced by
the stand-in of test_backend.py (``FAKE_VERL``) which connects to the Ray cluster and reports it --
everything before vLLM/FSDP is real. Checked against Slurm's allocation: as many Ray nodes and Ray
GPUs as allocated, the translation told the allocated nodes x GPUs, the cell's metrics reached its
MLflow run, the job COMPLETED, and no process of its Ray cluster is left.

Run:  pytest tests/verl/test_launch_slurm.py      (needs the test cluster; ~1 min)
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

from tests.slurm.cluster import free_ports, processes_mentioning
from tests.verl.test_backend import FAKE_VERL

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def test_sbatch_runs_the_cell_through_ray_on_the_allocated_nodes(slurm_cluster, tmp_path, monkeypatch):
    """2 nodes x 1 fake GPU (1 node if the cluster has one): Ray sees them all, verl is told them."""
    from mlflow import MlflowClient

    from runners import metric_names, paths
    from runners.backends.verl.hydra import format_value
    from runners.cluster.verl_batch import render_sbatch
    from runners.config import compose, run_key

    node_names = slurm_cluster.run("sinfo", "-h", "-N", "-o", "%N").stdout.split()
    nodes = min(2, len(set(node_names)))
    gcs, client, agent, worker_agent = free_ports(4)
    fake = tmp_path / "fake_verl.py"
    fake.write_text(FAKE_VERL)
    home = tmp_path / "home"
    monkeypatch.setenv("TRUSTBENCH_HOME", str(home))
    ray_env = {
        "TB_RAY_PORT": gcs,
        "TB_RAY_CLIENT_PORT": client,
        "TB_RAY_OBJECT_STORE_MB": 100,
        "TB_RAY_WAIT_S": 120,
        # the test cluster's nodes share this host: each agent on its own port
        "TB_RAY_HEAD_START_ARGS": f"--dashboard-agent-listen-port={agent}",
        "TB_RAY_WORKER_START_ARGS": f"--dashboard-agent-listen-port={worker_agent}",
    }
    overrides = [
        "backend=verl",
        "model=qwen3_1.7b",
        f"launcher.nodes={nodes}",
        "launcher.gpus_per_node=1",
        "launcher.cpus_per_task=1",
        "launcher.mem_gb=1",
        # Slurm's USR1 comes min(stop_timeout_s + 60, 30 x time_min) s before the limit: at 10 minutes (the
        # test partition's most), 5 minutes in. At 5 it came 2.5 minutes in, which CI's loaded machine reached
        "launcher.time_min=10",
        "dataset.train_limit=16",
        "dataset.eval_limit=4",
        "trainer.total_steps=2",
        "trainer.prompts_per_step=2",
        "trainer.mini_batch_prompts=2",
        "trainer.n=2",
        "trainer.checkpoint_every=1",
        "trainer.eval_every=1",
        "progress=false",
        f"tracking.uri=sqlite:///{home}/mlflow.db",
        f"backend.options.entrypoint={fake}",
        f"++backend.options.ray_env={format_value(ray_env)}",
    ]
    cfg, _ = compose(overrides)
    script = tmp_path / "cell.sbatch"
    script.write_text(render_sbatch(cfg, overrides))
    assert f"#SBATCH --nodes={nodes}" in script.read_text() and "#SBATCH --gpus-per-node=1" in script.read_text()
    env = {
        **slurm_cluster.env,
        "TRUSTBENCH_HOME": str(home),
        "FAKE_VERL_RAY": "1",
        "PYTHONPATH": str(REPO),
        "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
    }
    submitted = subprocess.run(
        ["sbatch", "--parsable", f"--chdir={tmp_path}", f"--output={tmp_path}/slurm-%j.out", str(script)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    job = int(submitted.stdout.strip().split(";")[0])
    slurm_cluster.submitted.append(job)
    temp_dir = f"/tmp/ray-{job}"
    try:
        info = slurm_cluster.wait_job(job, timeout=300)
        output = (tmp_path / f"slurm-{job}.out").read_text()
        job_record = {k: info.get(k) for k in ("JobState", "ExitCode", "Reason", "RunTime")}
        assert info["JobState"] == "COMPLETED", f"{job_record}\n{output[-4000:]}"
        verl_log = paths.run_dir(run_key(cfg)) / "verl" / "verl.1.log"  # verl's output: in the run, not the job's
        assert f"verl's output goes to {verl_log}" in output and "FAKE_VERL " not in output
        record = json.loads(
            next(line for line in verl_log.read_text().splitlines() if line.startswith("FAKE_VERL "))[10:]
        )
        assert record["alive_nodes"] == nodes and record["resources"].get("GPU") == float(nodes)
        assert record["args"]["trainer.nnodes"] == str(nodes) and record["args"]["trainer.n_gpus_per_node"] == "1"
        assert (
            record["env"]["RAY_ADDRESS"]
            and record["env"]["VERL_USE_EXTERNAL_MODULES"] == "runners.backends.verl.plugins.register"
        )
        status = json.loads((paths.run_dir(run_key(cfg)) / "status.json").read_text())
        assert status["status"] == "FINISHED"
        history = MlflowClient(tracking_uri=cfg.tracking.uri).get_metric_history(
            status["run_id"], metric_names.SCORE_MEAN
        )
        assert sorted(m.step for m in history) == [1, 2]
        deadline = time.monotonic() + 15  # the job ends when its steps do; give stragglers a moment
        while processes_mentioning(temp_dir) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert processes_mentioning(temp_dir) == []
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
