"""The single-node test Slurm cluster of `slurm/testcluster`, as a pytest fixture.

Design: one session-scoped fixture, ``slurm_cluster``, owns the cluster's lifecycle. It reuses a
cluster that passes ``health.sh`` (a developer may keep one running) and otherwise, when the
Slurm, munge and MariaDB binaries are installed and we are root, runs
``up.sh`` and tears the cluster down at the end of the session -- only if it started it, and only if
no other pytest session still uses it (a shared flock on ``$TB_SLURM_DIR.lock``). It exports
``SLURM_CONF`` for the whole session, so code under test that shells out to sbatch / squeue / sacct
(submitit, the Hydra submitit launcher) finds the cluster without further setup.

The fixture is registered once, from tests/conftest.py, so every test directory shares the same
instance (importing it into a second conftest or test module would create a second session fixture
that waits forever on the lock the first one holds).

Tests get a ``SlurmCluster`` handle with small helpers (submit a script, wait for a job state, read
accounting records). tests/conftest.py already skips ``slurm``-marked tests when sbatch is absent.

Run:  pytest -m slurm tests/slurm        (TB_SLURM_KEEP=1 leaves a cluster it started running)
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
TESTCLUSTER = REPO_ROOT / "slurm" / "testcluster"
REQUIRED_BINARIES = ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd", "sbatch", "sacct")
# Job states after which a job never runs again (scontrol's JobState).
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "DEADLINE", "BOOT_FAIL"}


# seconds up.sh and down.sh took in this session (reported in the test summary by tests/conftest.py)
TIMINGS: dict[str, float] = {}
# whether a test of this session got the cluster (else there is no Slurm stage to report)
USED = False


@dataclass
class SlurmCluster:
    """A running test cluster: where it lives, what it offers, and helpers to drive it."""

    # $TB_SLURM_DIR: state, logs and rendered configs
    state_dir: Path
    # environment for Slurm commands (SLURM_CONF set)
    env: dict[str, str]
    # node names; the first is this machine's short hostname, others are extra slurmd on it
    nodes: list[str]
    # fake GPUs configured per node (gres gpu)
    gpus: int
    # CPUs per node
    cpus: int
    # partitions: the default one and the one that preempts it
    default_partition: str = "debug"
    preempting_partition: str = "urgent"
    # whether this session brought the cluster up (and so tears it down)
    started_here: bool = False
    submitted: list[int] = field(default_factory=list)

    def run(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run a Slurm client command against this cluster; raise with its stderr if check fails."""
        proc = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def sbatch(self, body: str, *options: str, cwd: Path, name: str = "tb-test") -> int:
        """Submit a bash batch script whose body is ``body``; output goes to ``cwd/slurm-<id>.out``.

        Returns the job id; raises RuntimeError (with sbatch's message) when submission is refused.
        """
        script = cwd / f"{name}.sh"
        script.write_text("#!/bin/bash\n" + body + "\n")
        proc = self.run(
            "sbatch",
            "--parsable",
            f"--job-name={name}",
            f"--chdir={cwd}",
            f"--output={cwd}/slurm-%j.out",
            *options,
            str(script),
        )
        job_id = int(proc.stdout.strip().split(";")[0])
        self.submitted.append(job_id)
        return job_id

    def job_info(self, job_id: int) -> dict[str, str]:
        """``scontrol show job`` as a dict (JobState, Restarts, ExitCode, ...); {} once forgotten."""
        proc = self.run("scontrol", "show", "job", "-o", str(job_id), check=False)
        if proc.returncode != 0:
            return {}
        return dict(re.findall(r"(\w+)=(\S*)", proc.stdout))

    def wait_job(self, job_id: int, timeout: float = 60, states: set[str] = FINAL_STATES) -> dict[str, str]:
        """Poll until the job's state is in ``states``; returns its ``scontrol`` record."""

        def probe() -> dict[str, str] | None:
            info = self.job_info(job_id)
            return info if info.get("JobState") in states else None

        return wait_for(probe, timeout, f"job {job_id} in {sorted(states)}")

    def wait(self, probe: Callable[[], object], timeout: float, what: str):
        """Poll ``probe`` until it returns something truthy (returned); fail the test after ``timeout`` s."""
        return wait_for(probe, timeout, what)

    def wait_file(self, path: Path, timeout: float = 30) -> Path:
        """Wait until ``path`` exists (a file a running job writes: the nodes share this filesystem)."""
        return wait_for(lambda: path if path.exists() else None, timeout, f"{path} to appear")

    def sacct(self, job_id: int, duplicates: bool = False) -> list[dict[str, str]]:
        """Accounting records of the job allocation (not its steps) from slurmdbd, oldest first.

        With ``duplicates`` every run of a requeued job is listed (sacct -D)."""
        fields = "JobID,State,ExitCode,Partition,Start,End"
        args = ["sacct", "-n", "-X", "-P", "-j", str(job_id), "-o", fields] + (["-D"] if duplicates else [])
        lines = self.run(*args).stdout.splitlines()
        return [dict(zip(fields.split(","), line.split("|"))) for line in lines if line]

    def wait_sacct(
        self,
        job_id: int,
        predicate: Callable[[list[dict[str, str]]], bool],
        timeout: float = 30,
        duplicates: bool = False,
    ) -> list[dict[str, str]]:
        """Poll sacct until ``predicate(records)`` holds (slurmdbd receives records asynchronously)."""

        def probe() -> list[dict[str, str]] | None:
            records = self.sacct(job_id, duplicates)
            return records if records and predicate(records) else None

        return wait_for(probe, timeout, f"sacct records of job {job_id}")


def wait_for(probe: Callable[[], object], timeout: float, what: str, interval: float = 0.25):
    """Call ``probe`` until it returns something truthy (returned); fail the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that were free a moment ago."""
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def processes_mentioning(text: str) -> list[int]:
    """Pids whose command line contains ``text`` (to check that a test left no process behind)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _state_dir() -> Path:
    return Path(os.environ.get("TB_SLURM_DIR", "/tmp/trustbench-slurm"))


def _script(name: str, env: dict[str, str], timeout: float, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(TESTCLUSTER / name), *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def _describe(env: dict[str, str], state_dir: Path, started: bool) -> SlurmCluster:
    out = subprocess.run(["scontrol", "show", "node", "-o"], env=env, capture_output=True, text=True, check=True)
    nodes = [dict(re.findall(r"(\w+)=(\S*)", line)) for line in out.stdout.splitlines() if line.strip()]
    gpus = re.search(r"gpu(?::[^:,(]+)?:(\d+)", nodes[0].get("Gres", ""))
    return SlurmCluster(
        state_dir=state_dir,
        env=env,
        nodes=[n["NodeName"] for n in nodes],
        gpus=int(gpus.group(1)) if gpus else 0,
        cpus=int(nodes[0]["CPUTot"]),
        started_here=started,
    )


def _lock_exclusive(lock, state_dir: Path, timeout: float) -> None:
    """Take the cluster lock exclusively, failing (not hanging) if another session holds it too long."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                lock.close()
                pytest.fail(f"slurm: {state_dir}.lock held by another pytest session for {timeout:.0f} s")
            time.sleep(0.5)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """The test cluster, reused if healthy, else brought up here (and then torn down at the end)."""
    state_dir = _state_dir()
    env = dict(os.environ, TB_SLURM_DIR=str(state_dir), SLURM_CONF=str(state_dir / "etc" / "slurm.conf"))
    lock = open(f"{state_dir}.lock", "a+")  # held (shared) for the whole session
    _lock_exclusive(lock, state_dir, timeout=600)  # one session at a time checks / brings up
    started = False
    try:
        health = _script("health.sh", env, 90)
        if health.returncode != 0:
            missing = [b for b in REQUIRED_BINARIES if shutil.which(b) is None]
            if missing:
                pytest.skip(
                    f"slurm: test cluster not running and {', '.join(missing)} not installed "
                    "(run slurm/testcluster/install.sh)"
                )
            if os.geteuid() != 0:
                pytest.skip(
                    f"slurm: test cluster not running (health.sh exit {health.returncode}) and not root, "
                    "so it cannot be started here (run slurm/testcluster/up.sh as root)"
                )
            t0 = time.monotonic()
            up = _script("up.sh", env, 240)
            TIMINGS["up"] = time.monotonic() - t0
            if up.returncode != 0:
                pytest.fail(
                    f"slurm/testcluster/up.sh failed (exit {up.returncode}):\n{up.stderr[-3000:]}\n"
                    f"logs: {state_dir}/log"
                )
            started = True
        cluster = _describe(env, state_dir, started)
    except BaseException:
        lock.close()
        raise
    fcntl.flock(lock, fcntl.LOCK_SH)  # other sessions may share it from now on
    global USED
    USED = True
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLURM_CONF", env["SLURM_CONF"])
        mp.setenv("TB_SLURM_DIR", str(state_dir))
        yield cluster
    for job_id in cluster.submitted:  # jobs a failed test left behind
        cluster.run("scancel", str(job_id), check=False)
    try:
        if started and os.environ.get("TB_SLURM_KEEP") != "1":
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print(f"slurm_cluster: another session still uses {state_dir}; leaving the cluster up")
            else:
                t0 = time.monotonic()
                down = _script("down.sh", env, 120)
                TIMINGS["down"] = time.monotonic() - t0
                if down.returncode != 0:
                    print(f"slurm/testcluster/down.sh failed (exit {down.returncode}):\n{down.stderr}")
    finally:
        lock.close()
