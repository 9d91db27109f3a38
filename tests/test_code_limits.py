"""Code limits, checked on every test run (the same rules the lint CI runs):

- ``ruff check`` with the project's configuration (pyproject.toml) passes on runners, analysis, reports and
  tests; that configuration selects C901 with ``max-complexity = 12``, so no function is over cyclomatic
  complexity 12;
- no file under runners/, analysis/ or reports/ is over 400 lines (a long module is split along a seam:
  the papers' claims one module per paper, the synthetic curves apart from the store writer), and the
  built-in trainer (runners/backends/local/trainer.py) is at most 350 lines (batching, critic, T-PPO
  windows and checkpoint state live in their own modules).

Both checks are also run on a small tree with a deliberately bad file (an over-complex function, an
over-long file), which they must report.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "pyproject.toml"
LINTED = ("runners", "analysis", "reports", "tests")
CAPPED = ("runners", "analysis", "reports")
MAX_LINES = 400
FILE_LIMITS = {"runners/backends/local/trainer.py": 350}
MAX_COMPLEXITY = 12


def ruff_executable() -> str:
    """ruff from the test extra: next to this interpreter (a virtual environment's bin/), else on PATH."""
    beside = Path(sys.executable).parent / "ruff"
    if beside.exists():
        return str(beside)
    found = shutil.which("ruff")
    if found is None:
        pytest.fail(f"ruff is not installed next to {sys.executable} nor on PATH (it is in the `test` extra)")
    return found


def ruff_violations(root: Path, paths) -> list[str]:
    """One line per violation ``path:line:col: CODE message``; [] when ruff passes."""
    proc = subprocess.run(
        [ruff_executable(), "check", "--config", str(CONFIG), "--no-cache", "--output-format", "concise", *paths],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode not in (0, 1):  # 2: ruff itself failed (bad configuration, unreadable file)
        pytest.fail(f"ruff check failed to run (exit {proc.returncode}):\n{proc.stderr}{proc.stdout}")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    return [line for line in lines if ": " in line and not line.startswith(("Found ", "[*]", "No fixes"))]


def long_files(root: Path) -> list[str]:
    """Files of runners/, analysis/ and reports/ over their line limit, as ``path: N lines (limit L)``."""
    found = []
    for path in sorted(p for top in CAPPED for p in (root / top).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        limit = FILE_LIMITS.get(rel, MAX_LINES)
        n = len(path.read_text().splitlines())
        if n > limit:
            found.append(f"{rel}: {n} lines (limit {limit})")
    return found


def test_ruff_passes_on_the_source_tree():
    found = ruff_violations(ROOT, LINTED)
    assert found == [], "ruff check reports:\n" + "\n".join(found)


def test_no_file_is_over_its_line_limit():
    found = long_files(ROOT)
    assert found == [], "over the line limit:\n" + "\n".join(found)


def _branchy(n_ifs: int) -> str:
    """A function of cyclomatic complexity ``n_ifs + 1`` (one decision per ``if``)."""
    body = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(n_ifs))
    return f"def branchy(x):\n{body}    return -1\n"


def test_an_over_complex_function_is_reported(tmp_path):
    """The complexity check fails on a function one decision over the limit, and passes at the limit.

    ruff's defaults do not select C901, so this also shows the project's configuration is the one applied.
    """
    target = tmp_path / "runners" / "bad.py"
    target.parent.mkdir()
    target.write_text(_branchy(MAX_COMPLEXITY))  # complexity 13
    found = ruff_violations(tmp_path, ["runners"])
    assert len(found) == 1 and "C901" in found[0] and "branchy" in found[0], found
    assert found[0].startswith("runners/bad.py:1:"), found
    target.write_text(_branchy(MAX_COMPLEXITY - 1))  # complexity 12: allowed
    assert ruff_violations(tmp_path, ["runners"]) == []


@pytest.mark.parametrize(
    ("where", "limit"),
    [
        ("runners/sweep/bad.py", MAX_LINES),
        ("runners/backends/local/trainer.py", 350),
        ("analysis/tables/bad.py", MAX_LINES),
        ("reports/bad.py", MAX_LINES),
    ],
)
def test_an_over_long_file_is_reported(tmp_path, where, limit):
    """The line check fails on a file one line over its limit (and names it), and passes at the limit."""
    target = tmp_path / where
    target.parent.mkdir(parents=True)
    target.write_text("x = 1\n" * (limit + 1))
    assert long_files(tmp_path) == [f"{where}: {limit + 1} lines (limit {limit})"]
    target.write_text("x = 1\n" * limit)
    assert long_files(tmp_path) == []
