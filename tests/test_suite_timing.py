"""The suite's own plumbing: which stage and xdist group a test is in, and the timing plugin's arithmetic
(tests/suite_timing.py, tests/conftest.py)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from tests import conftest, suite_timing


def _item(nodeid: str, *markers: str, fixtures: tuple[str, ...] = ()):
    marks = {name: SimpleNamespace(name=name) for name in markers}
    return SimpleNamespace(nodeid=nodeid, get_closest_marker=marks.get, fixturenames=fixtures)


@pytest.mark.parametrize(
    ("markers", "stage", "group"),
    [
        ((), "unit", "algorithms/test_troll"),
        (("slow",), "unit", "algorithms/test_troll"),
        (("e2e", "slow"), "e2e", "algorithms/test_troll"),
        (("slurm",), "slurm", "slurm"),
        (("slurm", "slurm_whole_cluster"), "slurm", "slurm"),
        (("verl", "verl_cpu", "slow"), "verl_cpu", "verl_cpu"),
    ],
)
def test_stage_and_group_follow_the_markers(markers, stage, group):
    item = _item("tests/algorithms/test_troll.py::test_x[a-b]", *markers)
    assert suite_timing.stage_of(item) == stage
    assert conftest._xdist_group(item) == group


def test_work_is_handed_out_verl_stage_first_then_slurm_in_its_order_then_e2e_then_the_rest():
    items = [
        _item("tests/a.py::t1"),
        _item("tests/a.py::t2", "e2e"),
        _item("tests/slurm/s.py::t3", "slurm", fixtures=("slurm_sweeps",)),
        _item("tests/slurm/s.py::t4", "slurm"),
        _item("tests/slurm/s.py::t5", "slurm", "slurm_whole_cluster"),
        _item("tests/verl/v.py::t6", "verl_cpu"),
    ]
    order = [i.nodeid.rsplit("::", 1)[1] for i in sorted(items, key=conftest._stage)]
    assert order == ["t6", "t5", "t4", "t3", "t2", "t1"]


@pytest.mark.parametrize(
    ("nodeid", "plain"),
    [
        ("tests/a.py::test_x@a", "tests/a.py::test_x"),
        ("tests/a.py::test_x[u@v]", "tests/a.py::test_x[u@v]"),  # an @ inside a parameter id stays
        ("tests/a.py::test_x[u@v]@verl_cpu", "tests/a.py::test_x[u@v]"),
        ("tests/a.py::test_x", "tests/a.py::test_x"),
    ],
)
def test_plain_nodeid_drops_only_the_group_suffix(nodeid, plain):
    assert suite_timing.plain_nodeid(nodeid) == plain


def test_machine_cpu_between_two_times_is_interpolated_from_the_samples():
    sampler = suite_timing.MachineSampler.__new__(suite_timing.MachineSampler)
    sampler.samples = [(100.0, 10.0), (102.0, 14.0), (104.0, 14.0)]
    assert sampler.busy_between(100.0, 102.0) == pytest.approx(4.0)
    assert sampler.busy_between(101.0, 103.0) == pytest.approx(2.0)  # 11..14 then flat
    assert sampler.busy_between(90.0, 200.0) == pytest.approx(4.0)  # clamped to the sampled span


def test_machine_busy_time_grows_with_work_and_cpu_time_counts_this_process():
    busy0, cpu0 = suite_timing._machine_busy_s(), suite_timing._cpu_s()
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    assert suite_timing._cpu_s() - cpu0 >= 0.29
    assert suite_timing._machine_busy_s() - busy0 >= 0.25  # other processes only add to it
