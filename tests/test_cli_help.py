"""Help that stands alone: `trustbench --help` and every subcommand's help print plain text (no reStructuredText
markup) and the commands a user would type, and `trustbench run --help` is trustbench's, not Hydra's."""

from __future__ import annotations

import pytest

from runners.cli import main

SUBCOMMANDS = ("run", "sweep", "report", "bounds", "ui", "list", "verl")


def _help(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--help"])
    assert exc.value.code == 0
    return capsys.readouterr().out


def test_top_level_help_lists_every_subcommand_in_plain_text(capsys):
    out = _help(capsys)
    assert "``" not in out
    for sub in SUBCOMMANDS:
        assert f"trustbench {sub}" in out


@pytest.mark.parametrize("sub", SUBCOMMANDS)
def test_each_subcommand_help_is_plain_and_shows_an_example(capsys, sub):
    out = _help(capsys, sub)
    assert out.startswith(f"usage: trustbench {sub}")
    assert "``" not in out
    assert "example" in out.lower()


def test_run_help_is_trustbenchs_own_and_points_to_the_groups(capsys):
    out = _help(capsys, "run")
    assert "powered by Hydra" not in out
    assert "trustbench run +method=grpo_trm +regime=stale2" in out and "trustbench list" in out
