"""Roofline model of the rollout (decode) phase: hardware ceilings and analytical arithmetic intensity.

Design: the hardware numbers live in ``analysis/data/hardware.csv`` (not in code); the decode
arithmetic intensity of a dense bf16 model follows T-PPO (arXiv 2506.15050) figure 5
(T-PPO, arXiv 2506.15050, Figure 5: T-PPO 249 FLOP/byte vs PPO 84 on an H800):

    AI(B, c) = B (2P + 4 L n_q d c) / (2P + B c 4 L n_kv d)     [FLOP / byte]

with P parameters, batch B, context c, L layers, n_q / n_kv query / KV heads, head dim d. Per decode
step the weights (2P bytes) are read once and every sequence reads its KV cache (c tokens x
2 tensors x 2 bytes x L n_kv d); each token costs 2P FLOPs plus 4 L n_q d c attention FLOPs.
Without context (c = 0) AI = B: the batch is the weights-only arithmetic intensity.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.paper_data import paper_table


def hardware_table() -> pd.DataFrame:
    """name, bf16_dense_tflops, mem_bw_tbs, source, ridge (FLOP/byte where compute and bandwidth meet)."""
    hw = paper_table("hardware")
    hw["ridge"] = hw["bf16_dense_tflops"] / hw["mem_bw_tbs"]  # (1e12 FLOP/s) / (1e12 B/s)
    return hw


def attainable_tflops(ai: np.ndarray | float, peak_tflops: float, mem_bw_tbs: float) -> np.ndarray:
    """Roofline ceiling ``min(peak, AI * bandwidth)`` in TFLOP/s for arithmetic intensity ``ai`` [FLOP/B]."""
    return np.minimum(peak_tflops, np.asarray(ai, dtype=float) * mem_bw_tbs)


def decode_arithmetic_intensity(
    batch: np.ndarray | float,
    context: np.ndarray | float,
    params: float,
    layers: int,
    q_heads: int,
    kv_heads: int,
    head_dim: int,
) -> np.ndarray:
    """AI of one decode step (formula in the module docstring); broadcasts over batch and context."""
    B = np.asarray(batch, dtype=float)
    c = np.asarray(context, dtype=float)
    flops = B * (2.0 * params + 4.0 * layers * q_heads * head_dim * c)
    bytes_ = 2.0 * params + B * c * 4.0 * layers * kv_heads * head_dim
    return flops / bytes_
