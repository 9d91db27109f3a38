"""Figure layout helpers, checked against matplotlib's own rendering."""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from analysis.figures.curves import legend_columns  # noqa: E402


@pytest.mark.parametrize("n", [1, 4, 6, 7, 8, 11, 13])
def test_legend_reads_left_to_right_in_rows_of_at_most_six(n):
    """Draw the legend with matplotlib and read its entries back by position (top to bottom, left
    to right): they come in the original order, and no row holds more than six."""
    fig, ax = plt.subplots()
    lines = {f"m{i}": ax.plot([0, 1], [0, i])[0] for i in range(n)}
    ncol, ordered = legend_columns(list(lines.items()))
    legend = fig.legend([h for _, h in ordered], [label for label, _ in ordered], ncol=ncol)
    fig.canvas.draw()
    boxes = [(t.get_window_extent(), t.get_text()) for t in legend.get_texts()]
    read = [text for box, text in sorted(boxes, key=lambda b: (-round(b[0].y0), round(b[0].x0)))]
    rows = {round(box.y0) for box, _ in boxes}
    plt.close(fig)
    assert read == list(lines)
    assert len(rows) == -(-n // 6) and ncol <= 6


def _labels(rows):
    import pandas as pd

    from runners import metric_names

    cols = [metric_names.TAG_METHOD, metric_names.TAG_ALGORITHM, metric_names.TAG_OBJECTIVE]
    return pd.DataFrame(rows, columns=cols)


def test_every_method_has_its_own_colour_and_dashed_means_troll_only():
    """Line style says one thing (TROLL's objective), colours never repeat below 17 methods, and the palette is
    the published colour-blind-safe one (Okabe & Ito's hex values)."""
    from analysis.figures.style import LINE_STYLE_NOTE, PALETTE, method_styles

    rows = [("GRPO", "grpo", "clip"), ("GRPO + TROLL", "grpo", "troll"), ("PPO", "ppo", "clip"),
            ("PPO + TROLL seq", "ppo", "troll_seq"), ("DAPO", "dapo", "dapo_clip")]  # fmt: skip
    rows += [(f"M{i}", "grpo", "clip") for i in range(12)]
    styles = method_styles(_labels(rows))
    colours = [s["color"] for s in styles.values()]
    assert len(set(colours)) == len(rows) == 17
    assert {m for m, s in styles.items() if s["linestyle"] == "--"} == {"GRPO + TROLL", "PPO + TROLL seq"}
    assert matplotlib.colors.to_hex(PALETTE[0]).upper() == "#E69F00"  # Okabe-Ito orange
    assert "dashed" in LINE_STYLE_NOTE and "TROLL" in LINE_STYLE_NOTE


def test_a_figure_reproduces_a_papers_figure_only_when_the_sweep_ran_its_method():
    from analysis.figures.style import reproduces_if_run

    ref = "T-PPO (arXiv 2506.15050) Figure 4"
    assert reproduces_if_run(_labels([("T-PPO", "tppo", "clip")]), "tppo", ref) == (ref, "")
    reproduces, note = reproduces_if_run(_labels([("GRPO", "grpo", "clip")]), "tppo", ref)
    assert reproduces == "" and ref in note and "no T-PPO run" in note


def test_controller_figure_draws_each_run_with_its_caps_and_counts_the_pinned_runs():
    """REPO-R's zeta grows into its max cap on every seed, ADAPO's eps_high drifts inside its caps: the figure
    has one line per run equal to the logged |value|, dashed lines at the configured caps, and a caption
    counting the runs whose last quarter sits at a cap (counted here from the curves)."""
    import numpy as np

    from analysis.figures.controllers import controller_figure
    from analysis.synthetic import ADAPO_CAPS, REPO_R_CAPS, SyntheticSpec, _m, synthetic_data
    from runners import metric_names

    methods = [
        _m("REPO-R", "repo_r", entropy_control="repo_r", zeta_growth=10.0, params=dict(REPO_R_CAPS)),
        _m("ADAPO", "adapo", entropy_control="adapo", params=dict(ADAPO_CAPS)),
    ]
    spec = SyntheticSpec("controllers", methods, seeds=(0, 1, 2), steps=40, eval_every=10)
    data, truth = synthetic_data(spec)
    fig = controller_figure(data)
    axes = {ax.get_title().split(" ")[0]: ax for ax in fig.mpl.axes}
    zeta_ax, eps_ax = axes[metric_names.ENTROPY_ZETA], axes[metric_names.ENTROPY_EPS_HIGH]
    for ax, label, metric, caps in (
        (zeta_ax, "REPO-R", metric_names.ENTROPY_ZETA, REPO_R_CAPS),
        (eps_ax, "ADAPO", metric_names.ENTROPY_EPS_HIGH, ADAPO_CAPS),
    ):
        solid = [line for line in ax.get_lines() if line.get_linestyle() == "-"]
        dashed = sorted(line.get_ydata()[0] for line in ax.get_lines() if line.get_linestyle() == "--")
        curves = [truth[(label, s)]["curves"][metric] for s in spec.seeds]
        assert len(solid) == 3
        for line, (steps, values) in zip(solid, curves):
            assert np.array_equal(line.get_xdata(), steps) and np.allclose(line.get_ydata(), np.abs(values))
        assert dashed == sorted(abs(v) for v in caps.values())
        pinned = sum(
            bool(np.all(np.isclose(v[-(len(v) // 4) :], max(caps.values()), rtol=1e-6))) for _, v in curves
        )  # every value of the last quarter at the max cap
        assert f"{metric}: {pinned} of 3 runs pinned" in fig.caption
    assert "entropy/zeta: 3 of 3 runs pinned" in fig.caption and "entropy/eps_high: 0 of 3" in fig.caption
