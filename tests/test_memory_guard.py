"""The memory limit of a run (``launcher.memory_limit_gb``, ``runners.memory_guard``).

References: the kernel's own figures read by psutil (a process's RSS), a child process whose size is
known (it allocates a given number of MiB), and the real ``trustbench run`` in a subprocess with its
memory growing step after step (``debug.grow_memory_mb``), its outcome read back with MLflow's client.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

from runners import memory_guard
from runners.memory_guard import GIB, MemoryGuard, MemoryLimitExceeded
from tests.reliability import FAST, REPO, one_message, only_run_dir, runs, steps, trustbench

MIB = 2**20


def test_resident_memory_of_a_process_is_its_rss():
    """Alone (a fresh process without children: a test worker may run servers of other tests), a process's
    figure is the kernel's RSS of it (psutil reads /proc/<pid>/status)."""
    code = "import psutil; from runners import memory_guard as g; print(g.resident_bytes(), psutil.Process().memory_info().rss)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    ours, kernel = map(int, out.split())
    assert abs(ours - kernel) < 8 * MIB, (ours, kernel)


def test_resident_memory_counts_child_processes():
    """With a child holding 200 MiB: the sum of the proportional set sizes of this process and every
    descendant (the child, and whatever other tests of this worker left running), as psutil reads them."""
    code = "import sys, time; x = b'\\1' * (200 * 2**20); print('ready', flush=True); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        me, kid = psutil.Process(), psutil.Process(child.pid)
        total = memory_guard.resident_bytes()
        family = [me, *me.children(recursive=True)]
        expected, theirs = sum(p.memory_full_info().pss for p in family), kid.memory_full_info().pss
        assert child.pid in memory_guard.descendants(me.pid)
        assert {p.pid for p in family[1:]} == set(memory_guard.descendants(me.pid))
        assert abs(total - expected) < 16 * MIB and theirs > 200 * MIB, (total, expected, theirs)
    finally:
        child.kill()
        child.wait()


# pieces above glibc's largest mmap threshold (32 MiB): each is fresh pages from the kernel, so the
# resident size grows with every piece whatever this process freed before (smaller pieces can reuse
# freed heap pages that are still resident, and a long-lived test worker has many)
PIECE = 40 * MIB


def test_the_guard_stops_the_thread_that_grows_past_the_limit():
    """The guarded block is interrupted once it holds ~150 MiB more than at the start, with a message naming
    the limit, the memory measured and the key; the watch thread ends with the block."""
    limit = memory_guard.resident_bytes() + 150 * MIB
    held = []
    with pytest.raises(MemoryLimitExceeded) as caught:
        with MemoryGuard(limit, "launcher.memory_limit_gb=test", interval_s=0.02):
            for _ in range(50):  # 2 GiB at most, in 40 MiB pieces, over at least 4 s
                held.append(b"\1" * PIECE)
                time.sleep(0.08)
    message = str(caught.value)
    assert "passed the limit of" in message and "launcher.memory_limit_gb" in message, message
    measured = float(message.split("resident memory ")[1].split(" GiB")[0]) * GIB
    # stopped before the block's end; how far past the limit depends on how long a loaded machine keeps the
    # watch thread waiting (770 MiB once beside the whole suite on 2 cores, 150-200 MiB when quiet)
    assert measured > limit and len(held) < 50
    held.clear()
    assert not [t for t in threading.enumerate() if t.name == "trustbench-memory-guard"]


def test_under_its_limit_or_with_no_limit_the_guard_changes_nothing():
    with MemoryGuard(memory_guard.resident_bytes() + GIB, "test", interval_s=0.01) as guard:
        time.sleep(0.1)
        value = sum(range(1000))
    assert value == 499500 and guard.fired is None and guard.checks > 0
    with MemoryGuard(None, "off") as guard:
        held = b"\1" * (50 * MIB)
    assert guard.fired is None and guard._thread is None and len(held) == 50 * MIB


FORKED_FAMILY = """
import os, sys, time
x = bytearray(b"\\1" * (200 * 2**20))  # 200 MiB, touched: resident, then shared copy-on-write by 3 forks
for _ in range(3):
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
print("ready", flush=True)
time.sleep(60)
"""


def wait_for_checks(guard: MemoryGuard, checks: int, timeout_s: float = 60) -> None:
    """Until ``guard`` has made ``checks`` whole checks (a loaded machine makes each one slow)."""
    deadline = time.monotonic() + timeout_s
    while guard.checks <= checks and time.monotonic() < deadline:
        time.sleep(0.02)
    assert guard.checks > checks, guard.checks


def test_the_exact_figure_is_read_only_when_the_rss_bound_passes_the_limit(monkeypatch):
    """A child that forked 3 processes after touching 200 MiB: 4 x 200 MiB of RSS, ~200 MiB of PSS (the
    pages are shared). Under a limit above the RSS sum no ``smaps_rollup`` is read; under a limit between
    the two sums the exact figure is read and the guard does not fire (an RSS guard would); under a
    limit below the PSS sum it fires."""
    child = subprocess.Popen([sys.executable, "-c", FORKED_FAMILY], stdout=subprocess.PIPE, text=True)
    reads = []
    real_pss = memory_guard._pss
    monkeypatch.setattr(memory_guard, "_pss", lambda pid: reads.append(pid) or real_pss(pid))
    try:
        assert child.stdout.readline().strip() == "ready"
        rss = memory_guard.rss_bound()
        pss = memory_guard.resident_bytes()
        assert rss - pss > 450 * MIB, (rss, pss)  # the forks' shared pages count 4 times in the RSS sum
        reads.clear()
        with MemoryGuard(rss + 200 * MIB, "test", interval_s=0.01) as guard:
            wait_for_checks(guard, 3)
        assert guard.fired is None and reads == []
        with MemoryGuard((rss + pss) // 2, "test", interval_s=0.01) as guard:
            wait_for_checks(guard, 3)
        assert guard.fired is None and len(reads) >= 5 * 3, len(reads)  # 5 processes at least, each check
        with pytest.raises(MemoryLimitExceeded):
            with MemoryGuard(pss - 100 * MIB, "test", interval_s=0.01):
                time.sleep(5)
    finally:
        for proc in psutil.Process(child.pid).children():
            proc.kill()
        child.kill()
        child.wait()


def test_a_thread_that_does_not_stop_is_ended_with_its_failure_recorded(tmp_path):
    """The training thread stuck in one native call (here a sleep, which no Python exception interrupts):
    after the grace period the process records the failure and exits with status 1, naming the limit."""
    marker = tmp_path / "marker.txt"
    script = textwrap.dedent(f"""
        import time
        from runners.memory_guard import MemoryGuard
        record = lambda reason: open({str(marker)!r}, "w").write(reason)
        x = b"\\1" * (100 * 2**20)
        with MemoryGuard(50 * 2**20, "launcher.memory_limit_gb=0.05", on_hard_stop=record,
                         interval_s=0.05, grace_s=0.5):
            time.sleep(20)
        print("not stopped")
    """)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "not stopped" not in proc.stdout, proc
    assert time.monotonic() - start < 15
    assert "launcher.memory_limit_gb=0.05" in proc.stderr and "did not stop within 0.5 s" in proc.stderr
    assert "passed the limit" in marker.read_text()


def test_the_default_limit_is_a_share_of_what_the_cell_may_use(monkeypatch):
    """null: 90% of the least of the available memory (/proc/meminfo, read here independently), the
    cgroup's limit, and the share a parallel sweep gives (SHARE_ENV); 0: no limit. A Slurm request that
    Slurm does not enforce (no cgroup limit) is not a limit: the test cluster's 1 GB requests run as before."""
    monkeypatch.delenv(memory_guard.SHARE_ENV, raising=False)
    before = psutil.virtual_memory().available
    limit, how = memory_guard.resolve_limit(None)
    most = max(before, psutil.virtual_memory().available) + psutil.Process().memory_info().rss  # others' use moves
    assert limit <= 0.9 * most + 64 * MIB and "90%" in how, (limit, most, how)
    monkeypatch.setenv(memory_guard.SHARE_ENV, str(3 * GIB))
    if memory_guard.cell_memory(share=False)[0] > 3 * GIB:
        limit, how = memory_guard.resolve_limit(None)
        assert limit == int(0.9 * 3 * GIB) and "share" in how, how
    assert memory_guard.resolve_limit(0) == (None, "launcher.memory_limit_gb=0")
    assert memory_guard.resolve_limit(1.5) == (int(1.5 * GIB), "launcher.memory_limit_gb=1.5")
    assert memory_guard.share_bytes(4) == memory_guard.cell_memory(share=False)[0] // 4


def test_a_negative_limit_is_a_config_error(tmp_path):
    home = tmp_path / "home"
    proc = trustbench(["run", *FAST, "launcher.memory_limit_gb=-1"], home, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    one_message(proc.stderr, "launcher.memory_limit_gb")
    assert runs(home) == [] and not (home / "runs").exists()


@pytest.mark.slow
@pytest.mark.e2e
def test_a_run_past_its_memory_limit_fails_in_one_line_and_the_rerun_resumes(tmp_path):
    """``trustbench run`` whose memory grows 400 MiB a step (``debug.grow_memory_mb``) under a 2.5 GiB limit:
    exit 1 (not the kernel's kill, -9) with one line naming the limit, the memory measured and the key; the
    MLflow run and the marker say FAILED with that reason, no more memory was taken than the limit and a
    step's growth. The rerun, under the default limit, resumes the same MLflow run from the last checkpoint
    and finishes, each step logged once."""
    home = tmp_path / "home"
    args = ["run", *FAST, "trainer.total_steps=10", "trainer.checkpoint_every=1", "backend.device=cpu"]
    proc = trustbench([*args, "debug.grow_memory_mb=400", "launcher.memory_limit_gb=2.5"], home)
    assert proc.returncode == 1, proc.stderr[-3000:]
    message = one_message(
        proc.stderr, "MemoryLimitExceeded", "passed the limit of 2.50 GiB", "launcher.memory_limit_gb"
    )
    measured = float(message.split("resident memory ")[1].split(" GiB")[0])
    assert 2.5 < measured < 2.5 + 0.6, message  # at most a step's growth past it
    (run,) = runs(home)
    assert run.info.status == "FAILED" and "launcher.memory_limit_gb" in run.data.tags["trustbench.failure"]
    status = json.loads((only_run_dir(home) / "status.json").read_text())
    assert status["status"] == "FAILED" and "passed the limit" in status["reason"]
    done = steps(home, run.info.run_id)
    assert 1 <= len(done) < 10, done  # some steps ran, the limit stopped the run long before the end
    again = trustbench(args, home)
    assert again.returncode == 0, again.stderr[-3000:]
    (rerun,) = runs(home)
    assert rerun.info.run_id == run.info.run_id and rerun.info.status == "FINISHED"
    assert steps(home, run.info.run_id) == list(range(1, 11))


def test_each_cell_of_a_parallel_local_sweep_gets_its_share_in_its_environment(tmp_path, monkeypatch):
    """``launcher.parallel=N``: the child process of a cell starts with SHARE_ENV in its environment."""
    import io

    from runners.sweep import local_pool

    seen = {}

    class _Popen:
        def __init__(self, args, env, **kwargs):
            seen.update(env)
            self.stdin, self.pid = io.BytesIO(), 0

    monkeypatch.setattr(local_pool.subprocess, "Popen", _Popen)
    share = {memory_guard.SHARE_ENV: str(memory_guard.share_bytes(4))}
    local_pool._start(local_pool.LocalJob(0, None, tmp_path / "cell-0.log"), {"index": 0}, share)
    assert int(seen[memory_guard.SHARE_ENV]) == int(share[memory_guard.SHARE_ENV]) > 0
    assert seen["PYTHONPATH"] and seen.get("PATH") == os.environ.get("PATH")  # the rest of the environment kept
