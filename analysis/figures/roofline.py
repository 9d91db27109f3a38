"""Roofline of the rollout and training phases (T-PPO, arXiv 2506.15050, Figure 5), analytical decode intensity.

Left: ceilings ``min(peak, AI x bandwidth)`` of every accelerator in ``analysis/data/hardware.csv``,
the paper's two points (T-PPO 249, PPO 84 FLOP/byte on an H800) and, when logged, our runs' measured
points per phase (``perf/<phase>_arithmetic_intensity``, ``perf/<phase>_tflops`` for rollout,
old_log_prob, update_actor; median over steps per run) with the ceiling of the machine they ran on
when it is not a table row (``perf/peak_tflops``, ``perf/peak_mem_bw_tbs``: a CPU's measured peak).
Right: analytical AI (T-PPO, arXiv 2506.15050, figure 5) vs batch for several contexts of one model config.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from analysis.aggregate import per_run
from analysis.figures.style import PALETTE, Figure, method_styles, render, set_log, setup
from analysis.frames import ExperimentData
from analysis.paper_data import model_configs, paper_table
from analysis.roofline import attainable_tflops, decode_arithmetic_intensity, hardware_table
from runners import metric_names

PHASE_MARKERS = {"rollout": "o", "old_log_prob": "s", "update_actor": "^"}


def _phase_points(data: ExperimentData | None) -> dict[str, tuple]:
    """{phase: (per-run median arithmetic intensity, per-run median TFLOP/s)} of the phases the runs logged."""
    if data is None:
        return {}
    logged = set(data.metric_names())
    points = {}
    for phase in metric_names.ROOFLINE_PHASES:
        x_name, y_name = metric_names.arithmetic_intensity(phase), metric_names.achieved_tflops(phase)
        if {x_name, y_name} <= logged:
            x = per_run(data, x_name, "median").set_index("run_id")
            y = per_run(data, y_name, "median").set_index("run_id")["value"].reindex(x.index)
            keep = x["value"].notna() & y.notna()
            points[phase] = (x[keep], y[keep])
    return points


def _lowest_intensity(data: ExperimentData | None) -> float:
    """Left end of the intensity axis: 1 FLOP/byte, or lower when a measured point sits below it."""
    lows = [float(x["value"].min()) for x, _ in _phase_points(data).values() if len(x)]
    return min([1.0, *[0.5 * v for v in lows if v > 0]])


def _machine_ceilings(data: ExperimentData, hw) -> list[tuple[float, float]]:
    """(peak TFLOP/s, TB/s) the runs measured against that are not rows of the accelerator table (CPUs)."""
    if not {metric_names.PEAK_TFLOPS, metric_names.PEAK_MEM_BW_TBS} <= set(data.metric_names()):
        return []
    peak = per_run(data, metric_names.PEAK_TFLOPS, "median")["value"]
    bandwidth = per_run(data, metric_names.PEAK_MEM_BW_TBS, "median")["value"]
    table = set(zip(hw["bf16_dense_tflops"].astype(float), hw["mem_bw_tbs"].astype(float)))
    found = sorted({(float(p), float(b)) for p, b in zip(peak, bandwidth) if np.isfinite(p) and np.isfinite(b)})
    return [c for c in found if not any(np.isclose(c, row).all() for row in table)]


def _measured_points(ax, data: ExperimentData | None, hw) -> str:
    """Draw our runs' phase points (colour: method, marker: phase) and their machines' ceilings; caption text."""
    points = _phase_points(data)
    if not points:
        return ""
    styles = method_styles(data.labels())
    seen_methods = set()
    for phase, (x, y) in points.items():
        for method, g in x.groupby(metric_names.TAG_METHOD, sort=False):
            ax.scatter(
                g["value"], y.reindex(g.index), marker=PHASE_MARKERS[phase], s=28,
                color=styles.get(method, {}).get("color"), edgecolor="black", lw=0.5, zorder=6,
                label=f"ours: {method}" if method not in seen_methods else None,
            )  # fmt: skip
            seen_methods.add(method)
    for phase in points:
        ax.scatter([], [], marker=PHASE_MARKERS[phase], color="white", edgecolor="black", lw=0.5, label=phase)
    ai = np.geomspace(_lowest_intensity(data), 1e4, 300)
    for peak, bandwidth in _machine_ceilings(data, hw):
        ax.plot(
            ai, attainable_tflops(ai, peak, bandwidth), color="tab:red", ls="--", lw=1.2,
            label=f"measured machine ({peak * 1e3:.3g} GFLOP/s, {bandwidth * 1e3:.3g} GB/s)",
        )  # fmt: skip
    return (
        " Markers: our runs, per phase (circle rollout, square old-log-prob pass, triangle actor update; median"
        " over steps per run; model FLOPs over modelled bytes, runners/perf/flops.py); red dashed:"
        " the ceiling of the machine they ran on when it is not in the table (a CPU's measured fp32 peak)."
    )


def roofline_figure(
    data: ExperimentData | None = None, model: str = "Qwen2.5-32B", contexts: tuple[int, ...] = (0, 2048, 8192, 24576)
) -> Figure:
    setup()
    hw = hardware_table()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3.9))
    ai = np.geomspace(_lowest_intensity(data), 1e4, 300)
    # hardware in greys with distinct dashes (H100 and H800 share ceilings); colour is kept for our runs
    greys = np.linspace(0.75, 0.0, len(hw))
    dashes = ["-", "-", (0, (4, 2)), "-.", "-"]
    for i, row in hw.reset_index(drop=True).iterrows():
        ax.plot(
            ai,
            attainable_tflops(ai, row["bf16_dense_tflops"], row["mem_bw_tbs"]),
            color=str(greys[i]),
            ls=dashes[i % len(dashes)],
            lw=1.4,
            label=f"{row['name']} ({row['bf16_dense_tflops']:g} TFLOP/s, {row['mem_bw_tbs']:g} TB/s)",
        )
    h800 = hw[hw["name"] == "H800"].iloc[0]
    for _, p in paper_table("tppo_roofline").iterrows():
        x = float(p["arithmetic_intensity_flop_per_byte"])
        y = float(attainable_tflops(x, h800["bf16_dense_tflops"], h800["mem_bw_tbs"]))
        ax.scatter([x], [y], marker="*", s=90, color="black", zorder=5)
        ax.annotate(f"paper {p['method']} ({x:.0f})", (x, y), textcoords="offset points", xytext=(4, -12), fontsize=7)
    measured = _measured_points(ax, data, hw)
    set_log(ax, x=True, y=True)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("performance (TFLOP/s)")
    ax.set_title("Roofline (accelerators: dense BF16)", fontsize=9)
    ax.legend(fontsize=6, loc="lower right")
    cfg = model_configs()[model]
    B = np.arange(1, 1025)
    for j, c in enumerate(contexts):
        ax2.plot(
            B,
            decode_arithmetic_intensity(
                B, c, cfg["params"], cfg["layers"], cfg["q_heads"], cfg["kv_heads"], cfg["head_dim"]
            ),
            color=PALETTE[j],
            label=f"context {c}",
        )
    ax2.axhline(h800["ridge"], color="0.4", ls=":", lw=1)
    ax2.annotate(f"H800 ridge {h800['ridge']:.0f}", (1.2, h800["ridge"] * 1.08), fontsize=7)
    set_log(ax2, x=True, y=True)
    ax2.set_xlabel("decode batch size B (sequences)")
    ax2.set_ylabel("arithmetic intensity (FLOP/byte)")
    ax2.set_title(f"Analytical decode intensity, {model} (bf16)", fontsize=9)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    return render(
        fig,
        "roofline",
        "Roofline of the rollout and training phases",
        "Left: roofline ceilings (grey; H100 and H800 coincide) of the accelerators in analysis/data/hardware.csv, with the arithmetic intensity T-PPO (arXiv 2506.15050) reports for "
        "policy rollout on an H800 (stars: T-PPO 249, PPO 84 FLOP/byte)."
        + measured
        + " Right: decode arithmetic intensity "
        "AI = B(2P + 4 L n_q d c) / (2P + B c 4 L n_kv d) (T-PPO, arXiv 2506.15050, fig. 5); without context AI = B.",
        reproduces="T-PPO (arXiv 2506.15050) Figure 5",
    )
