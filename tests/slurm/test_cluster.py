"""The test Slurm cluster behaves like the GPU clusters trustbench sweeps run on.

Each test checks Slurm's observable behaviour -- what a job sees, what sacct records, what the
controller refuses -- against what the job script did, so a broken daemon, a missing plugin or a
wrong slurm.conf setting fails here before it fails a launcher test. The last test submits through
submitit, as the Hydra submitit launcher will. The wait for a signal before the time limit (~30 s:
slurmctld checks time limits every 30 s) overlaps the other tests: a module fixture submits its
job first.

Run:  pytest -m slurm tests/slurm/test_cluster.py     (needs slurm/testcluster installed; ~45 s)
"""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.slurm

# Keeps a job alive yet lets bash run a trap at once (a trap waits for a foreground child to end).
IDLE = "sleep 120 & wait $!"


@pytest.fixture(scope="module", autouse=True)
def timelimit_job(slurm_cluster, tmp_path_factory):
    """A 1-minute job asking for USR1 50 s before its limit (submitted before the other tests)."""
    cwd = tmp_path_factory.mktemp("timelimit")
    body = f"""start=$(date +%s)
trap 'echo $(( $(date +%s) - start )) > signalled_after_s; exit 0' USR1
{IDLE}"""
    job_id = slurm_cluster.sbatch(body, "--time=1", "--signal=B:USR1@50", cwd=cwd, name="timelimit")
    return job_id, cwd, time.monotonic()


def test_job_completes_and_sacct_records_it(slurm_cluster, tmp_path):
    """A job's output and its accounting record match the script: exit 0 gives COMPLETED 0:0 and
    exit 3 gives FAILED 3:0 in sacct (so slurmdbd and MariaDB store what slurmctld reports)."""
    ok = slurm_cluster.sbatch('echo "ran $SLURM_JOB_ID on $SLURMD_NODENAME" > out.txt', cwd=tmp_path, name="ok")
    bad = slurm_cluster.sbatch("exit 3", cwd=tmp_path, name="bad")

    assert slurm_cluster.wait_job(ok)["JobState"] == "COMPLETED"
    assert slurm_cluster.wait_job(bad)["JobState"] == "FAILED"
    ran, job_id, on, node = (tmp_path / "out.txt").read_text().split()
    assert (ran, job_id, on) == ("ran", str(ok), "on")
    assert node in slurm_cluster.nodes
    [ok_record] = slurm_cluster.wait_sacct(ok, lambda r: r[-1]["State"] == "COMPLETED")
    [bad_record] = slurm_cluster.wait_sacct(bad, lambda r: r[-1]["State"] == "FAILED")
    assert ok_record["ExitCode"] == "0:0"
    assert bad_record["ExitCode"] == "3:0"


@pytest.mark.parametrize(("option", "count"), [("--gpus=1", 1), ("--gres=gpu:2", 2)])
def test_gpu_job_sees_its_devices(slurm_cluster, tmp_path, option, count):
    """A job asking for GPUs gets CUDA_VISIBLE_DEVICES with that many distinct indices of the node's
    fake GPUs (gres/gpu with File= devices), and SLURM_GPUS_ON_NODE agrees."""
    job = slurm_cluster.sbatch('echo "$CUDA_VISIBLE_DEVICES $SLURM_GPUS_ON_NODE" > gpus.txt', option, cwd=tmp_path)
    assert slurm_cluster.wait_job(job)["JobState"] == "COMPLETED"
    visible, on_node = (tmp_path / "gpus.txt").read_text().split()
    indices = [int(i) for i in visible.split(",")]
    assert len(set(indices)) == count
    assert all(0 <= i < slurm_cluster.gpus for i in indices)
    assert int(on_node) == count


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (lambda c: [f"--gpus-per-node={c.gpus + 1}"], "Requested node configuration is not available"),
        (lambda c: [f"--gpus={c.gpus * len(c.nodes) + 1}"], "Requested node configuration is not available"),
        (lambda c: [f"--nodes={len(c.nodes) + 1}"], "Node count specification invalid"),
        (lambda c: ["--time=30"], "Requested time limit is invalid"),
        (lambda c: ["--partition=no_such_partition"], "Invalid partition name specified"),
    ],
    ids=["too-many-gpus-per-node", "too-many-gpus", "too-many-nodes", "over-partition-max-time", "unknown-partition"],
)
def test_unsatisfiable_request_is_refused_at_submission(slurm_cluster, tmp_path, options, message):
    """Requests the cluster can never satisfy are rejected by sbatch itself (not left pending
    forever): more GPUs or nodes than exist, a time over the partition's MaxTime (EnforcePartLimits),
    an unknown partition."""
    with pytest.raises(RuntimeError, match=message):
        slurm_cluster.sbatch("true", *options(slurm_cluster), cwd=tmp_path, name="refused")
    assert slurm_cluster.run("squeue", "-h", "--name=refused", "-o", "%i").stdout.strip() == ""


def test_scancel_signal_reaches_batch_shell(slurm_cluster, tmp_path):
    """`scancel --batch --signal=USR1` is delivered to the running batch shell, whose trap then
    ends the job normally (COMPLETED, not CANCELLED)."""
    body = f"""trap 'echo USR1 > got_signal; exit 0' USR1
touch ready
{IDLE}"""
    job = slurm_cluster.sbatch(body, cwd=tmp_path)
    slurm_cluster.wait_job(job, states={"RUNNING"})
    slurm_cluster.wait_file(tmp_path / "ready", 30)
    slurm_cluster.run("scancel", "--batch", "--signal=USR1", str(job))
    assert slurm_cluster.wait_job(job, timeout=30)["JobState"] == "COMPLETED"
    assert (tmp_path / "got_signal").read_text().strip() == "USR1"


def test_requeue_from_job_increments_restart_count(slurm_cluster, tmp_path):
    """A job that runs `scontrol requeue $SLURM_JOB_ID` runs again with SLURM_RESTART_COUNT=1;
    scontrol counts the restart and sacct -D keeps both runs (REQUEUED, then COMPLETED)."""
    body = f"""echo "${{SLURM_RESTART_COUNT:-0}}" >> runs.txt
if [ "${{SLURM_RESTART_COUNT:-0}}" = 0 ]; then scontrol requeue "$SLURM_JOB_ID"; {IDLE}; fi"""
    job = slurm_cluster.sbatch(body, cwd=tmp_path)
    info = slurm_cluster.wait_job(job, timeout=60)
    assert info["JobState"] == "COMPLETED"
    assert info["Restarts"] == "1"
    assert (tmp_path / "runs.txt").read_text().split() == ["0", "1"]
    records = slurm_cluster.wait_sacct(job, lambda r: r[-1]["State"] == "COMPLETED", duplicates=True)
    assert [r["State"] for r in records] == ["REQUEUED", "COMPLETED"]


@pytest.mark.slurm_whole_cluster
def test_preemption_requeues_lower_tier_job(slurm_cluster, tmp_path):
    """A job in the preempting partition that needs a GPU while a default-partition job holds all
    of them makes the controller requeue that job (PreemptMode=REQUEUE); it then runs again with SLURM_RESTART_COUNT=1
    after the preemptor finished."""
    body = f"""echo "${{SLURM_RESTART_COUNT:-0}}" >> runs.txt
if [ "${{SLURM_RESTART_COUNT:-0}}" = 0 ]; then touch holding; {IDLE}; fi"""
    every_gpu = [f"--nodes={len(slurm_cluster.nodes)}", f"--gpus-per-node={slurm_cluster.gpus}"]
    low = slurm_cluster.sbatch(body, *every_gpu, cwd=tmp_path, name="low")
    slurm_cluster.wait_file(tmp_path / "holding", 30)
    high = slurm_cluster.sbatch(
        "echo $SLURM_JOB_PARTITION > high.txt", f"--partition={slurm_cluster.preempting_partition}", "--gpus=1",
        cwd=tmp_path, name="high",
    )  # fmt: skip
    assert slurm_cluster.wait_job(high, timeout=30)["JobState"] == "COMPLETED"
    info = slurm_cluster.wait_job(low, timeout=60)
    assert info["JobState"] == "COMPLETED"
    assert info["Restarts"] == "1"
    assert (tmp_path / "runs.txt").read_text().split() == ["0", "1"]
    records = slurm_cluster.wait_sacct(low, lambda r: r[-1]["State"] == "COMPLETED", duplicates=True)
    assert [r["State"] for r in records] == ["PREEMPTED", "COMPLETED"]


@pytest.mark.slow
def test_signal_before_time_limit(slurm_cluster, timelimit_job):
    """`--signal=B:USR1@50` with `--time=1` delivers USR1 to the batch shell before the time limit
    (slurmctld checks every 30 s and sends a warning at the first check within 30 s of its due
    time, here the first check after the job starts: within 30 s, 30 in whole seconds), and the job
    ends COMPLETED by its trap instead of TIMEOUT."""
    job_id, cwd, _ = timelimit_job
    info = slurm_cluster.wait_job(job_id, timeout=75)
    elapsed = int((cwd / "signalled_after_s").read_text())
    assert info["JobState"] == "COMPLETED"
    assert 0 <= elapsed <= 30  # whole seconds: a start at x.9 s and a signal 29.2 s later read 30


def _double_and_report(x: int) -> tuple[int, str | None, str | None]:
    import os

    return 2 * x, os.environ.get("SLURM_JOB_ID"), os.environ.get("CUDA_VISIBLE_DEVICES")


def test_submitit_job_runs_on_the_cluster(slurm_cluster, tmp_path):
    """submitit (the Hydra launcher's backend) reaches the cluster through the fixture's SLURM_CONF
    alone: a pickled function runs as a Slurm job with the GPU it asked for and returns its value."""
    submitit = pytest.importorskip("submitit")
    executor = submitit.AutoExecutor(folder=tmp_path / "%j", cluster="slurm")
    # 5 minutes: submitit's default USR2 90 s before the limit (which Slurm may send up to 30 s
    # early) then never comes while the job starts, when no handler is installed yet
    executor.update_parameters(timeout_min=5, slurm_partition=slurm_cluster.default_partition, gpus_per_node=1)
    job = executor.submit(_double_and_report, 21)
    slurm_cluster.submitted.append(int(job.job_id))
    value, job_id, visible = job.result()
    assert (value, job_id) == (42, job.job_id)
    assert visible is not None and len(visible.split(",")) == 1
