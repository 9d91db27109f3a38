"""The stage's helpers that need no Ray: worker port ranges of parallel clusters, which cells the selected tests read."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from tests.verl import cpu_ray
from tests.verl.cpu_stage import LAUNCH_ORDER, README_CELL, cells_of, uses_cells


def test_worker_port_ranges_are_disjoint_free_and_outside_the_other_port_sources(monkeypatch):
    monkeypatch.setattr(cpu_ray, "_WORKER_RANGES", [])
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    starts = [cpu_ray.worker_port_range() for _ in range(4)]
    spans = sorted((s, s + cpu_ray.WORKER_PORTS) for s in starts)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end < start  # no port shared by two clusters
    for start, end in spans:
        assert cpu_ray.WORKER_PORTS_FROM <= start and end < low  # clear of Ray's defaults and of free_ports


def test_cells_of_reads_the_name_parameter_the_declaration_or_takes_every_cell():
    @uses_cells(README_CELL)
    def declared(cpu_stage):
        pass

    def undeclared(cpu_stage):
        pass

    def unrelated():
        pass

    items = [
        SimpleNamespace(fixturenames=("cpu_stage", "name"), callspec=SimpleNamespace(params={"name": "gtpo"})),
        SimpleNamespace(fixturenames=("cpu_stage",), function=declared),
        SimpleNamespace(fixturenames=(), function=unrelated),
    ]
    assert cells_of(items) == ["gtpo", README_CELL]
    assert sorted(cells_of([SimpleNamespace(fixturenames=("cpu_stage",), function=undeclared)])) == sorted(LAUNCH_ORDER)
