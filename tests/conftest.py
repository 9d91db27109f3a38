"""Shared test configuration: marker routing (gpu, verl, slurm), the Slurm stage, small fixtures.

Markers route expensive tests; tests that need what this machine lacks are *skipped* and pytest's
``-ra`` summary lists every skip with its reason, so a skip is never counted as a pass. CI
(``TRUSTBENCH_REQUIRE_DEPS=1`` or ``--require-deps``) turns a skip for a dependency it installs
itself into a failure naming it (``tests/required_deps.py``); GPU skips stay skips.

The suite runs in parallel (``make test``: pytest-xdist, ``--dist loadgroup --no-loadscope-reorder``).
Each stage is one xdist group, which one worker runs whole and in order while the other workers run
the rest; any other test's group is its file (module fixtures built once per file). The collection
order (``_stage``) is the order work is handed out: the ``verl_cpu`` stage first (the longest), then
the ``slurm`` stage: those marked ``slurm_whole_cluster`` (they need every GPU of the test cluster),
then the rest, which run while the background sweeps of tests/slurm/sweeps.py do (started as the
first of them begins), the tests that only collect a sweep's result last; then the ``e2e`` files,
then everything else. Workers run torch on one thread. The stages' summaries (how long the Slurm
stage took, cluster start and teardown included; the verl stage's launches and memory) and
``tests/suite_timing.py``'s table of where the time went end the run's output.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import time

import pytest

from tests import suite_timing
from tests.required_deps import (  # noqa: F401  (hooks: skips CI must not pass, TRUSTBENCH_REQUIRE_DEPS=1)
    pytest_addoption,
    pytest_make_collect_report,
    pytest_runtest_makereport,
)
from tests.slurm import cluster
from tests.slurm.cluster import slurm_cluster  # noqa: F401  (session fixture, registered once for all tests)
from tests.slurm.sweeps import slurm_sweeps  # noqa: F401  (session fixture, registered once for all tests)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config):
    suite_timing.register(config)
    if suite_timing.is_worker(config):
        import torch

        torch.set_num_threads(1)  # one thread per xdist worker: the workers share the cores


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch missing
        return False


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks it adds
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
        item.add_marker(pytest.mark.xdist_group(_xdist_group(item)))
    items.sort(key=_stage)  # stable: the order within each stage is unchanged


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    """Under ``--dist loadgroup`` the groups must have reached xdist (it appends ``@group`` to the node
    ids it hands out); otherwise every worker would start the stages' session fixtures."""
    config = session.config
    if suite_timing.is_worker(config) and config.getvalue("loadgroup") and session.items:
        if "@" not in session.items[0].nodeid:
            raise pytest.UsageError(
                "pytest-xdist ignored the xdist_group marks (pytest too new for this pytest-xdist?): "
                "pip install -e '.[test]' installs versions that work together"
            )


def _xdist_group(item) -> str:
    """The unit of work one xdist worker takes whole: a stage that shares session fixtures (the Slurm
    cluster and its background sweeps; the verl stage's Ray clusters and cells), else the test's file
    (module fixtures built once; the reliability scenarios of one file, which measure the machine,
    one after another)."""
    stage = suite_timing.stage_of(item)
    if stage in ("slurm", "verl_cpu"):
        return stage
    return item.nodeid.split("::", 1)[0].removeprefix("tests/").removesuffix(".py")


def _stage(item) -> int:
    """The collection order, which is also the order xdist hands out work (``--no-loadscope-reorder``),
    longest first: 0: the verl-on-CPU stage (the longest: a worker of its own from the start);
    1: slurm, whole cluster; 2: slurm, beside the background sweeps; 3: slurm, checks a sweep (so the
    others overlap the sweeps); 4: end-to-end scenarios (``e2e``: mostly waiting on processes, so they
    overlap the rest); 5: every other test."""
    if item.get_closest_marker("verl_cpu") is not None:
        return 0
    if item.get_closest_marker("slurm") is None:
        return 4 if item.get_closest_marker("e2e") is not None else 5
    if item.get_closest_marker("slurm_whole_cluster"):
        return 1
    return 3 if "slurm_sweeps" in item.fixturenames else 2


@pytest.fixture(autouse=True)
def _background_sweeps(request):
    """From the first Slurm test that does not need the whole cluster on, the sweeps run."""
    if _stage(request.node) in (2, 3) and any("slurm_sweeps" in i.fixturenames for i in request.session.items):
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


def pytest_sessionfinish(session):
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
    suite_timing.report_line(session.config, f"slurm stage: {total:.0f} s ({', '.join(parts)})")


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
