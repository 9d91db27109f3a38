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
