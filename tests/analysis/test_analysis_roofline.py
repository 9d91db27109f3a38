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
