"""The ``report`` and ``bounds`` subcommands, mounted on a plain argparse parser as runners/cli.py does.

``trustbench bounds`` is checked against the TRM paper's numbers (T = 4096, delta = 1e-4, D_seq = 0.01:
classical 1677, Pinsker-Marginal 35.0, Mixed 8.2, linear 115.9)."""

from __future__ import annotations

import argparse
import re

import pytest

from reports.cli import add_bounds_parser, add_report_parser


@pytest.fixture
def parser():
    p = argparse.ArgumentParser(prog="trustbench")
    sub = p.add_subparsers(dest="command", required=True)
    add_report_parser(sub)
    add_bounds_parser(sub)
    return p


def _value(text: str, label: str) -> float:
    line = next(line for line in text.splitlines() if line.strip().startswith(label))
    return float(re.findall(r"[-+]?\d[\d.,e+]*", line.split()[-1])[0].replace(",", ""))


def test_bounds_prints_the_papers_numbers(parser, capsys, tmp_path):
    out = tmp_path / "bounds.svg"
    args = parser.parse_args(["bounds", "--T", "4096", "--delta", "1e-4", "--d-seq", "0.01", "--out", str(out)])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert _value(text, "Classical") == pytest.approx(1677, rel=1e-3)
    # the paper prints 35.0 from its closed form (4/3) T^1.5 delta = 34.95; the exact sum is 34.946
    assert _value(text, "Pinsker-Marginal") == pytest.approx(35.0, abs=0.06)
    assert _value(text, "Mixed") == pytest.approx(8.2, abs=0.05)
    assert _value(text, "Linear") == pytest.approx(115.9, abs=0.05)
    assert out.exists() and out.read_text().lstrip().startswith(("<?xml", "<svg"))


def test_bounds_large_divergence_and_errors(parser, capsys):
    args = parser.parse_args(["bounds", "--T", "4096", "--delta", "1", "--d-seq", "1", "--no-cap"])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert _value(text, "Pinsker-Marginal") == pytest.approx(
        3.49e5, rel=2e-3
    )  # TRM (arXiv 2512.23075): 3.49e5 without caps
    args = parser.parse_args(["bounds", "--T", "4096", "--delta", "-1"])
    assert args.func(args) == 2
    assert "delta" in capsys.readouterr().err


def test_report_parser_options(parser):
    args = parser.parse_args(["report", "troll_table1", "--no-pdf", "--offline", "--out", "/tmp/x"])
    assert (args.experiment, args.no_pdf, args.offline, args.out) == ("troll_table1", True, True, "/tmp/x")
    with pytest.raises(SystemExit):
        parser.parse_args(["report", "x", "--offline", "--full-refresh"])
