"""``launcher=local launcher.parallel=2``: cells run two at a time, each in its own process.

The real command (``python -m runners.cli sweep``) on the embedded default, one-step cells slowed by
``debug.step_delay_s`` so that runs started together surely overlap. MLflow's own client is the
reference: the runs' start and end times overlap (run one after another they cannot), every cell
that should finish is FINISHED, and each metric step is logged once. Ctrl-C (SIGINT to the sweep
process only, as a terminal sends it) stops the running children after their current step: the
command exits 130, the children are gone, their runs are KILLED with a PREEMPTED marker, and the next
sweep resumes them to the end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reliability import FAST, command_env, runs, steps, trustbench

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(900)]

SWEEP = ["sweep", "demo", "+method=choice(grpo)", "launcher.parallel=2", "experiment=par", *FAST]
SWEEP = [o for o in SWEEP if not o.startswith("trainer.total_steps")]


def _interval(run) -> tuple[int, int]:
    return run.info.start_time, run.info.end_time


def test_two_cells_at_a_time_overlap_finish_and_a_failure_is_named(tmp_path):
    """Three cells, two at a time: the first two run at once (their MLflow runs overlap) and finish;
    the third fails at its third step and is named, with its reason and its log, and the command
    exits 1. Each cell's output is kept in the sweep's log folder."""
    home = tmp_path / "home"
    # every step sleeps 20 s: two runs started together overlap by far more than start-up jitter
    args = [*SWEEP, "seed=0", "trainer.total_steps=1,2,3", "debug.fail_at_step=2", "debug.step_delay_s=20"]
    out = trustbench(args, home, timeout=800)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "2 at a time" in out.stdout
    by_steps = {int(r.data.params["trainer.total_steps"]): r for r in runs(home)}
    assert sorted(by_steps) == [1, 2, 3]
    assert [by_steps[s].info.status for s in (1, 2, 3)] == ["FINISHED", "FINISHED", "FAILED"]
    (a0, a1), (b0, b1) = _interval(by_steps[1]), _interval(by_steps[2])
    assert max(a0, b0) < min(a1, b1), "the first two cells did not run at the same time"
    assert steps(home, by_steps[1].info.run_id) == [1] and steps(home, by_steps[2].info.run_id) == [1, 2]
    failed = [ln for ln in out.stdout.splitlines() if ln.startswith("!! ")]
    assert len(failed) == 1 and "trainer.total_steps=3" in failed[0]
    assert "FAILED" in failed[0] and "debug.fail_at_step=2 reached" in failed[0]
    progress = [ln for ln in out.stdout.splitlines() if "trainer.total_steps=3" in ln and "[" in ln and "/3]" in ln]
    assert len(progress) == 1 and "FAILED" in progress[0]
    log = Path(progress[0].split("see ", 1)[1].strip())
    assert log.name == "cell-2.log" and "debug.fail_at_step=2 reached" in log.read_text()
    assert len(list(log.parent.glob("cell-*.log"))) == 3
    outcomes = json.loads((log.parent.parent / "outcomes.json").read_text())
    assert sorted(o["status"] for o in outcomes) == ["FAILED", "FINISHED", "FINISHED"]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _running(home: Path) -> int:
    markers = [json.loads(p.read_text() or "{}") for p in home.glob("runs/*/status.json")]
    return sum(m.get("status") == "RUNNING" for m in markers)


def test_ctrl_c_stops_the_children_after_their_step_and_the_next_sweep_resumes(tmp_path):
    """SIGINT to the sweep while two cells train: both children checkpoint and stop (PREEMPTED, MLflow
    KILLED), none is left running, the command exits 130 without a traceback; the same sweep again
    resumes both cells to FINISHED with every step logged once."""
    home = tmp_path / "home"
    args = [*SWEEP, "trainer.total_steps=3", "trainer.checkpoint_every=1", "seed=0,1", "debug.step_delay_s=60"]
    home.mkdir(parents=True)
    sweep = subprocess.Popen(
        [sys.executable, "-m", "runners.cli", *args],
        cwd=home.parent,
        env=command_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # SIGINT back to its default (a background shell job ignores it, and Python keeps it ignored)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.time() + 600
        while time.time() < deadline and _running(home) < 2:  # both cells train (in their first step's delay)
            assert sweep.poll() is None, sweep.communicate()
            time.sleep(2)
        time.sleep(10)
        holders = [json.loads(p.read_text())["pid"] for p in home.glob("runs/*/run.lock")]
        assert len(holders) == 2 and all(_pid_alive(pid) for pid in holders)
        sweep.send_signal(signal.SIGINT)
        out, err = sweep.communicate(timeout=300)
    finally:
        sweep.kill()
    assert sweep.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "stopping 2 running cell(s)" in out
    assert not [pid for pid in holders if _pid_alive(pid)]
    found = runs(home)
    assert sorted(r.info.status for r in found) == ["KILLED", "KILLED"]
    markers = [json.loads(p.read_text()) for p in home.glob("runs/*/status.json")]
    assert sorted(m["status"] for m in markers) == ["PREEMPTED", "PREEMPTED"]
    again = trustbench([a for a in args if not a.startswith("debug.")], home, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    found = runs(home)
    assert sorted(r.info.status for r in found) == ["FINISHED", "FINISHED"]
    assert all(steps(home, r.info.run_id) == [1, 2, 3] for r in found)
