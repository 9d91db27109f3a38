"""Fair timing: wall and CPU seconds per phase, and the load-inflation flag, against numpy on the logged
curves of a synthetic sweep where one method ran on a machine loaded by other work."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.figures.timing import timing_figure
from analysis.synthetic import SyntheticSpec, _m, synthetic_data
from analysis.tables.timing import timing_table
from analysis.timing import load_inflation, phase_times
from runners import metric_names

SPEC = SyntheticSpec(
    "timing_test",
    [
        _m("Quiet", "grpo", cpu_per_wall=1.6, load=1.0, cpus=2),  # two threads busy, nothing else running
        _m("Crowded", "dapo", cpu_per_wall=1.6, contention=3.0, load=6.0, cpus=2),  # waits behind other work
    ],
    seeds=(0, 1),
    steps=12,
    families=frozenset({"core", "timing"}),
)


@pytest.fixture(scope="module")
def sweep():
    return synthetic_data(SPEC)


def _after_first(truth, label, metric):
    return np.mean([truth[(label, s)]["curves"][metric][1][1:].mean() for s in SPEC.seeds])


def test_phase_times_give_wall_and_cpu_seconds(sweep):
    data, truth = sweep
    times = phase_times(data)
    for label in ("Quiet", "Crowded"):
        for metric in (metric_names.TIMING_GEN, metric_names.TIMING_UPDATE_ACTOR):
            phase = metric.split("/")[1]
            assert times.loc[label, (phase, "wall")] == pytest.approx(_after_first(truth, label, metric), rel=1e-12)
            cpu = _after_first(truth, label, metric_names.timing_cpu(metric))
            assert times.loc[label, (phase, "cpu")] == pytest.approx(cpu, rel=1e-12)
    # contention stretches wall time only: the crowded run's wall is 3x its uncontended wall, CPU unchanged
    ratio = times.loc["Crowded", ("gen", "wall")] / times.loc["Crowded", ("gen", "cpu")]
    assert ratio == pytest.approx(3.0 / 1.6, rel=1e-9)


def test_load_inflation_flags_only_the_crowded_run(sweep):
    data, truth = sweep
    infl = load_inflation(data)
    for label in ("Quiet", "Crowded"):
        fracs, ratios = [], []
        for s in SPEC.seeds:
            c = truth[(label, s)]["curves"]
            wall, cpu = c[metric_names.TIMING_STEP][1], c[metric_names.TIMING_CPU_STEP][1]
            load, cores = c[metric_names.LOAD_AVG_1M][1], c[metric_names.CPU_COUNT_AVAILABLE][1]
            fracs.append(np.mean((wall / cpu > 1.5) & (load > cores)))
            ratios.append(wall.sum() / cpu.sum())
        assert infl.loc[label, "inflated_frac"] == pytest.approx(np.mean(fracs), abs=1e-12)
        assert infl.loc[label, "wall_cpu_ratio"] == pytest.approx(np.mean(ratios), rel=1e-12)
    assert infl.loc["Quiet", "inflated_frac"] == 0.0 and infl.loc["Crowded", "inflated_frac"] == 1.0


def test_timing_table_and_figure_show_cpu_beside_wall_and_name_the_inflated_run(sweep):
    data, _ = sweep
    table = timing_table(data)
    assert ("gen", "cpu") in table.values.columns and ("step", "cpu [95% CI]") in table.values.columns
    assert table.display.loc["Crowded", ("load", "inflated steps")] == "100%"
    assert table.display.loc["Quiet", ("load", "inflated steps")] == "0%"
    assert len(table.notes) == 1 and table.notes[0].startswith("Crowded: wall time inflated by other load")
    figure = timing_figure(data)
    assert "hatched bars: CPU time" in figure.caption and "Crowded: wall time inflated" in figure.caption
