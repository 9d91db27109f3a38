"""Where the suite's time goes, printed at the end of every run and kept as JSON on request.

Every test is in one stage (``stage_of``): ``slurm`` (the test Slurm cluster), ``verl_cpu`` (real verl
launches), ``e2e`` (reliability scenarios and end-to-end cells: real ``trustbench`` processes) or
``unit`` (everything else: the fast tier). For each test the worker that ran it measures its wall
time and its CPU time: the test process's own (``time.process_time``) plus that of the subprocesses
it waited for (``RUSAGE_CHILDREN``; a daemon it did not wait for, such as a Ray or Slurm daemon, is
not in it). The controlling process samples the machine's busy CPU time (``/proc/stat``) every
second, which counts everything: daemons, servers, every worker.

The terminal summary gives, per stage, the tests, the wall span (first start to last end: stages
run side by side under pytest-xdist), the tests' summed CPU time and the machine's CPU time over that
span; then the whole run: wall time, collection, machine CPU time and the average number of cores
busy out of those available. ``TB_SUITE_TIMES=FILE`` also writes every test's figures to FILE
(JSON; ``tests/benchmarks/suite_times.py`` runs the suite with it and prints the slowest tests).

Stage summaries of the session fixtures (the Slurm and verl stages) are produced in the worker that
ran the stage; ``report_line`` carries them to the controlling process's terminal summary.
"""

from __future__ import annotations

import bisect
import json
import os
import resource
import threading
import time
from dataclasses import asdict, dataclass

import pytest

from runners.perf.hardware import available_cpus

STAGES = ("unit", "e2e", "slurm", "verl_cpu")
_CPU_KEY = pytest.StashKey[float]()
_LINES: list[str] = []  # stage summary lines of this process (or gathered from the workers)


def stage_of(item) -> str:
    for marker in ("slurm", "verl_cpu", "e2e"):
        if item.get_closest_marker(marker) is not None:
            return marker
    return "unit"


def plain_nodeid(nodeid: str) -> str:
    """``nodeid`` without the ``@group`` suffix xdist's loadgroup adds (a parameter id may hold an @)."""
    at = nodeid.rfind("@")
    return nodeid[:at] if at > nodeid.rfind("]") else nodeid


def is_worker(config) -> bool:
    return hasattr(config, "workerinput")


def report_line(config, line: str) -> None:
    """A line for the run's terminal summary, from the controlling process or from a worker."""
    if is_worker(config):
        config.workeroutput.setdefault("tb_lines", []).append(line)
    else:
        _LINES.append(line)


def _cpu_s() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine since boot (every core, idle and iowait excluded)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


@dataclass
class TestRecord:
    nodeid: str
    stage: str
    worker: str
    outcome: str
    wall_s: float = 0.0
    cpu_s: float = 0.0
    start: float = 0.0
    stop: float = 0.0


class MachineSampler(threading.Thread):
    """(time, busy CPU seconds) of the machine every ``every_s`` seconds."""

    def __init__(self, every_s: float = 1.0) -> None:
        super().__init__(name="suite-timing", daemon=True)
        self.every_s, self.samples = every_s, [(time.time(), _machine_busy_s())]
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.every_s):
            self.samples.append((time.time(), _machine_busy_s()))

    def busy_at(self, t: float) -> float:
        """Busy seconds at time ``t``, interpolated between samples (clamped to the sampled span)."""
        s = self.samples
        i = bisect.bisect_left(s, t, key=lambda sample: sample[0])
        if i == 0 or i == len(s):
            return s[min(i, len(s) - 1)][1]
        (t0, b0), (t1, b1) = s[i - 1], s[i]
        return b0 + (b1 - b0) * (t - t0) / max(t1 - t0, 1e-9)

    def busy_between(self, t0: float, t1: float) -> float:
        return self.busy_at(t1) - self.busy_at(t0)


class SuiteTiming:
    """The plugin (registered by tests/conftest.py)."""

    def __init__(self, config) -> None:
        self.config = config
        self.tests: dict[str, TestRecord] = {}
        self.started = time.time()
        self.first_test: float | None = None
        self.sampler: MachineSampler | None = None
        if not is_worker(config):
            self.sampler = MachineSampler()
            self.sampler.start()

    # -- in the process that runs the test -------------------------------------------------------
    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        item.stash[_CPU_KEY] = _cpu_s()
        return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        now = _cpu_s()
        report.tb_cpu_s = now - item.stash.get(_CPU_KEY, now)
        report.tb_stage = stage_of(item)
        item.stash[_CPU_KEY] = now
        return report

    # -- in the controlling process (reports of the workers arrive here) --------------------------
    def pytest_runtest_logreport(self, report):
        if is_worker(self.config):
            return
        node = getattr(report, "node", None)
        worker = getattr(getattr(node, "gateway", None), "id", "main")
        nodeid = plain_nodeid(report.nodeid)
        rec = self.tests.get(nodeid)
        if rec is None:
            rec = self.tests[nodeid] = TestRecord(
                nodeid, getattr(report, "tb_stage", "unit"), worker, report.outcome, start=report.start
            )
        rec.wall_s += report.duration
        rec.cpu_s += getattr(report, "tb_cpu_s", 0.0)
        rec.stop = max(rec.stop, report.stop)
        if report.when == "call" or report.outcome != "passed":
            rec.outcome = report.outcome
        self.first_test = report.start if self.first_test is None else min(self.first_test, report.start)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        _LINES.extend(getattr(node, "workeroutput", {}).get("tb_lines", []))

    def summary(self) -> dict:
        ended = time.time()
        sampler = self.sampler
        stages = {}
        for stage in STAGES:
            recs = [r for r in self.tests.values() if r.stage == stage]
            if not recs:
                continue
            t0, t1 = min(r.start for r in recs), max(r.stop for r in recs)
            stages[stage] = {
                "tests": len(recs),
                "wall_s": t1 - t0,
                "test_cpu_s": sum(r.cpu_s for r in recs),
                "machine_cpu_s": sampler.busy_between(t0, t1) if sampler else None,
            }
        wall = ended - self.started
        machine = sampler.busy_between(self.started, ended) if sampler else None
        return {
            "wall_s": wall,
            "collection_s": (self.first_test - self.started) if self.first_test else None,
            "machine_cpu_s": machine,
            "cores": available_cpus(),
            "cores_busy": machine / wall if machine is not None and wall > 0 else None,
            "workers": int(getattr(self.config.option, "numprocesses", 0) or 0),
            "stages": stages,
            "tests": [asdict(r) for r in sorted(self.tests.values(), key=lambda r: -r.wall_s)],
        }

    def pytest_terminal_summary(self, terminalreporter):
        if is_worker(self.config) or not self.tests:
            return
        data = self.summary()
        if self.sampler is not None:
            self.sampler.stopped.set()
        terminalreporter.write_sep("-", "suite time by stage")
        for line in stage_table(data):
            terminalreporter.write_line(line)
        for line in _LINES:
            terminalreporter.write_sep("-", line)
        path = os.environ.get("TB_SUITE_TIMES")
        if path:
            with open(path, "w") as f:
                json.dump(data, f, indent=1)


def stage_table(data: dict) -> list[str]:
    """The per-stage table and the whole run's line of a ``SuiteTiming.summary``."""
    lines = [
        f"{'stage':<9} {'tests':>6} {'wall s':>8} {'tests CPU s':>12} {'machine CPU s':>14} {'cores busy':>11}"
        "  (stages side by side under xdist)"
    ]
    for name, s in data["stages"].items():
        machine = s["machine_cpu_s"]
        busy = f"{machine / s['wall_s']:.2f}" if machine is not None and s["wall_s"] > 0 else "-"
        machine = f"{machine:.0f}" if machine is not None else "-"
        lines.append(f"{name:<9} {s['tests']:>6} {s['wall_s']:>8.0f} {s['test_cpu_s']:>12.0f} {machine:>14} {busy:>11}")
    collection = f"{data['collection_s']:.0f}" if data["collection_s"] is not None else "-"
    lines.append(
        f"whole run: {data['wall_s']:.0f} s wall (collection and worker start {collection} s), machine CPU "
        f"{data['machine_cpu_s']:.0f} s: {data['cores_busy']:.2f} of {data['cores']} cores busy on average; "
        f"{data['workers'] or 'no'} xdist workers"
    )
    return lines


def register(config) -> None:
    config.pluginmanager.register(SuiteTiming(config), "tb_suite_timing")
