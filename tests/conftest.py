"""Shared test configuration: marker routing (gpu, verl, slurm), the Slurm stage, small fixtures.

Markers route expensive tests; tests that need what this machine lacks are *skipped* and pytest's
``-ra`` summary lists every skip with its reason, so a skip is never counted as a pass.

The ``slurm`` tests run first, as one stage: those marked ``slurm_whole_cluster`` (they need every
GPU of the test cluster), then the rest, which run while the background sweeps of
tests/slurm/sweeps.py do (started as the first of them begins), the tests that only collect a
sweep's result last. The ``verl_cpu`` stage runs at the very end, in one piece. The terminal summary reports how long the stage took, cluster start and
teardown included.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import time

import pytest

from tests.slurm import cluster
from tests.slurm.cluster import slurm_cluster  # noqa: F401  (session fixture, registered once for all tests)
from tests.slurm.sweeps import slurm_sweeps  # noqa: F401  (session fixture, registered once for all tests)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch missing
        return False


def pytest_collection_modifyitems(config, items):
    has_verl = importlib.util.find_spec("verl") is not None
    has_gpu = None
    for item in items:
        if "gpu" in item.keywords:
            if has_gpu is None:
                has_gpu = _has_cuda()
            if not has_gpu:
                item.add_marker(pytest.mark.skip(reason="gpu: no CUDA device on this machine"))
        if "verl" in item.keywords and not has_verl:
            item.add_marker(pytest.mark.skip(reason="verl: not installed (pip install -e '.[test]')"))
        if "slurm" in item.keywords and shutil.which("sbatch") is None:
            item.add_marker(pytest.mark.skip(reason="slurm: no sbatch on PATH (see slurm/testcluster)"))
    items.sort(key=_stage)  # stable: the order within each stage is unchanged


def _stage(item) -> int:
    """0: slurm, whole cluster; 1: slurm, beside the background sweeps; 2: slurm, checks a sweep
    (so the others overlap the sweeps); 3: every other test; 4: the verl-on-CPU stage (last, in one
    piece, so its summary's wall time and memory peak are its own)."""
    if item.get_closest_marker("slurm") is None:
        return 4 if item.get_closest_marker("verl_cpu") is not None else 3
    if item.get_closest_marker("slurm_whole_cluster"):
        return 0
    return 2 if "slurm_sweeps" in item.fixturenames else 1


@pytest.fixture(autouse=True)
def _background_sweeps(request):
    """From the first Slurm test that does not need the whole cluster on, the sweeps run."""
    if _stage(request.node) in (1, 2) and any("slurm_sweeps" in i.fixturenames for i in request.session.items):
        request.getfixturevalue("slurm_sweeps")


_SLURM_SPAN: dict[str, float] = {}  # start of the first and end of the last slurm test (monotonic)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if item.get_closest_marker("slurm") is None:
        return (yield)
    _SLURM_SPAN.setdefault("start", time.monotonic())
    try:
        return (yield)
    finally:
        _SLURM_SPAN["end"] = time.monotonic()


def pytest_terminal_summary(terminalreporter):
    if "end" not in _SLURM_SPAN or not cluster.USED:  # no Slurm test ran (skipped or deselected)
        return
    tests = _SLURM_SPAN["end"] - _SLURM_SPAN["start"]
    up, down = cluster.TIMINGS.get("up"), cluster.TIMINGS.get("down")
    parts = [f"tests {tests:.0f} s (cluster start included)" if up else f"tests {tests:.0f} s (cluster was up)"]
    if up:
        parts.append(f"of which cluster up {up:.0f} s")
    if down:
        parts.append(f"cluster down {down:.0f} s")
    total = tests + (down or 0.0)
    terminalreporter.write_sep("-", f"slurm stage: {total:.0f} s ({', '.join(parts)})")


@pytest.fixture(autouse=True)
def _no_stop_signal_carried_over():
    """Every test starts and ends with no stop signal remembered by ``runners.run`` (a test that signals
    its own process, e.g. a requeue test, would otherwise stop every later in-process run at once)."""
    from runners import run as run_module

    run_module._StopFlag.received = None
    yield
    run_module._StopFlag.received = None


@pytest.fixture
def repo_root() -> str:
    return REPO_ROOT
