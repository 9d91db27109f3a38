"""Roofline inputs: the decode arithmetic-intensity formula (T-PPO, arXiv 2506.15050, figure 5) against hand
counts of FLOPs and bytes, and the hardware table's ridge points (spec: H100/H800 ~295 FLOP/byte)."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.roofline import attainable_tflops, decode_arithmetic_intensity, hardware_table


def test_weights_only_intensity_is_the_batch():
    B = np.array([1, 84, 249, 1024])
    np.testing.assert_allclose(decode_arithmetic_intensity(B, 0, 32.5e9, 64, 40, 8, 128), B)


def test_intensity_counts_flops_and_bytes_by_hand():
    P, L, nq, nkv, d, B, c = 1e9, 4, 8, 2, 64, 16, 1000
    flops = B * (2 * P + 2 * 2 * L * nq * d * c)  # 2 FLOPs per weight + QK^T and AV over c cached tokens
    bytes_ = 2 * P + B * c * 2 * 2 * L * nkv * d  # bf16 weights + bf16 K and V caches
    assert decode_arithmetic_intensity(B, c, P, L, nq, nkv, d) == pytest.approx(flops / bytes_)
    # a longer context moves decode back towards memory-bound
    assert decode_arithmetic_intensity(B, 8 * c, P, L, nq, nkv, d) < decode_arithmetic_intensity(B, c, P, L, nq, nkv, d)


def test_hardware_ridges():
    hw = hardware_table().set_index("name")
    assert set(hw.index) == {"A100", "H100", "H800", "H200", "B200"}
    assert hw.at["H800", "ridge"] == pytest.approx(295, abs=1)
    assert hw.at["H200", "ridge"] == pytest.approx(989.4 / 4.8)
    assert attainable_tflops(84, hw.at["H800", "bf16_dense_tflops"], hw.at["H800", "mem_bw_tbs"]) == pytest.approx(
        84 * 3.35
    )
    assert attainable_tflops(1e4, 989.4, 3.35) == pytest.approx(989.4)


# -- measured points from runs ------------------------------------------------------------------------
def _figure_points(fig):
    """The left axes and its non-empty scatter collections."""
    ax = fig.mpl.axes[0]
    scatters = [c for c in ax.collections if len(c.get_offsets())]
    return ax, scatters


@pytest.mark.parametrize("ceiling", [(989.4, 3.35), (0.05, 0.02)], ids=["h100", "cpu"])
def test_roofline_figure_draws_each_runs_phase_points_and_its_machine(ceiling):
    import matplotlib

    matplotlib.use("Agg")
    from analysis.figures.roofline import PHASE_MARKERS, roofline_figure
    from analysis.synthetic import SyntheticSpec, _m, synthetic_data
    from runners import metric_names

    spec = SyntheticSpec(
        "roofline_test",
        [_m("PPO", "ppo"), _m("T-PPO", "tppo")],
        seeds=(0, 1),
        steps=12,
        families=frozenset({"core", "roofline"}),
        ceiling=ceiling,
    )
    data, truth = synthetic_data(spec)
    fig = roofline_figure(data)
    ax, scatters = _figure_points(fig)
    drawn = {tuple(np.round(p, 12)) for c in scatters for p in c.get_offsets()}
    for (label, seed), run in truth.items():
        for phase in PHASE_MARKERS:
            x = np.median(run["curves"][metric_names.arithmetic_intensity(phase)][1])
            y = np.median(run["curves"][metric_names.achieved_tflops(phase)][1])
            assert (round(x, 12), round(y, 12)) in drawn, (label, seed, phase)
    paper_stars = 2
    assert len(drawn) == len(truth) * len(PHASE_MARKERS) + paper_stars
    labels = [line.get_label() for line in ax.get_lines()]
    machine = [line for line in ax.get_lines() if line.get_label().startswith("measured machine")]
    if ceiling == (989.4, 3.35):
        assert machine == []  # an H100 run: its ceiling is the table's row, drawn once
    else:
        (line,) = machine
        x, y = line.get_data()
        np.testing.assert_allclose(y, np.minimum(0.05, x * 0.02))
        assert min(x) < 1.0  # the axis reaches the CPU's low-intensity points
    assert sum(label.startswith("H100") for label in labels) == 1
    assert "per phase" in fig.caption


def test_roofline_figure_without_measured_points():
    import matplotlib

    matplotlib.use("Agg")
    from analysis.figures.roofline import roofline_figure
    from analysis.synthetic import SyntheticSpec, _m, synthetic_data

    data, _ = synthetic_data(
        SyntheticSpec("plain", [_m("GRPO", "grpo")], seeds=(0,), steps=5, families=frozenset({"core"}))
    )
    fig = roofline_figure(data)
    _, scatters = _figure_points(fig)
    assert sum(len(c.get_offsets()) for c in scatters) == 2  # the paper's two stars only
    assert "per phase" not in fig.caption
