"""Fixtures of the verl tests: the shared Ray clusters and the "verl on CPU" stage (marker ``verl_cpu``).

The stage is one xdist group, handed out first (tests/conftest.py orders it); its summary line's wall time
(from the setup of its first test, the Ray clusters' start included, to its last test's end) and
memory peak are the stage's own. The line also gives the verl launches, the mean of each ``timing_s/*``
phase over the stage's iterations and the peak summed PSS of its processes.

    pytest -m verl_cpu tests/verl        # the stage alone (about 12 minutes on 2 cores)
    TRUSTBENCH_VERL_STAGE_PARALLEL=1 pytest -m verl_cpu tests/verl   # one cell at a time (about 16)
"""

from __future__ import annotations

import statistics
import time

from tests.suite_timing import report_line
from tests.verl.cpu_ray import cpu_ray  # noqa: F401  (session fixture, registered once)
from tests.verl.cpu_stage import STAGE, cpu_stage  # noqa: F401  (session fixture, registered once)

_SPAN: dict[str, float] = {}


def pytest_runtest_setup(item):
    if item.get_closest_marker("verl_cpu") is not None:
        _SPAN.setdefault("start", time.monotonic())


def pytest_runtest_teardown(item, nextitem):
    if item.get_closest_marker("verl_cpu") is not None:
        _SPAN["end"] = time.monotonic()


def pytest_sessionfinish(session):
    stage = STAGE.get("stage")
    if stage is None or "start" not in _SPAN:
        return
    wall = _SPAN.get("end", getattr(stage, "finished", time.monotonic())) - _SPAN["start"]
    timings = stage.timings()
    phases = ", ".join(
        f"{key.split('/', 1)[1]} {statistics.mean(values):.2f}" for key, values in sorted(timings.items()) if values
    )
    cells = ", ".join(f"{name} {run.wall_s:.0f}" for name, run in stage.runs.items())
    report_line(
        session.config,
        f"verl CPU stage: {wall:.0f} s, model {stage.model_s:.0f} s, {stage.launches} verl launches (s per cell: {cells}); "
        f"peak PSS {stage.sampler.peak_bytes / 2**30:.1f} GiB (sampled with {stage.sampler.cpu_s:.0f} s of CPU)",
    )
    if phases:
        report_line(session.config, f"verl CPU stage, mean timing_s per iteration: {phases}")
