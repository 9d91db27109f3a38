"""``TRUSTBENCH_REQUIRE_DEPS=1`` / ``--require-deps`` (tests/required_deps.py), run by a separate
pytest on generated tests: a skip for a dependency CI installs (in a test, a skipif mark, an
importorskip, a module-level skip) fails naming the dependency; a GPU skip, an xfail and a pass stay
what they are; an unclassified skip reason fails. Without the option every skip stays a skip. Also:
every skip reason written in the suite today is classified."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.required_deps import ENV, classify

REPO_ROOT = Path(__file__).resolve().parents[1]

GENERATED = {
    "test_skips.py": """
import pytest

def test_verl():
    pytest.skip("verl: not installed (pip install -e '.[test]')")

def test_own_submodule():
    pytest.importorskip("runners.no_such_module_here")

@pytest.mark.skipif(True, reason="chromium not installed (apt-get install chromium)")
def test_chromium():
    pass

def test_gpu():
    pytest.skip("gpu: no CUDA device on this machine")

def test_unclassified():
    pytest.skip("the moon is not full")

@pytest.mark.xfail(reason="known", strict=True)
def test_xfail():
    assert False

def test_passes():
    pass
""",
    "test_module_skip.py": """
import pytest

pytest.skip("pdftoppm not installed (apt-get install poppler-utils)", allow_module_level=True)

def test_never_collected():
    pass
""",
}


def _run(tmp_path: Path, *args: str, require: bool = False) -> dict[str, tuple[str, str]]:
    """{test name: (outcome, message)} of a pytest run over the generated files (junit XML)."""
    for name, text in GENERATED.items():
        (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k != ENV}
    env["PYTHONPATH"] = str(REPO_ROOT)
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # only this plugin (and pytest's own)
    if require:
        env[ENV] = "1"
    xml = tmp_path / "junit.xml"
    # a collection error ends a run before its tests: go on, to see both kinds of report in one run
    cmd = [sys.executable, "-m", "pytest", "-p", "tests.required_deps", "-p", "no:cacheprovider"]
    cmd += ["--continue-on-collection-errors"]
    proc = subprocess.run(
        [*cmd, "-q", f"--junitxml={xml}", *args, "."],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode in (0, 1, 2), proc.stdout + proc.stderr
    outcomes = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = case.get("name") or case.get("classname")
        result = next(iter(case), None)
        outcome = "passed" if result is None else result.tag
        outcomes[name] = (outcome, (result.get("message") or "") + (result.text or "") if result is not None else "")
    return outcomes


def test_without_the_option_every_skip_stays_a_skip(tmp_path):
    outcomes = _run(tmp_path)
    kinds = {name: outcome for name, (outcome, _) in outcomes.items()}
    assert kinds == {
        "test_verl": "skipped",
        "test_own_submodule": "skipped",
        "test_chromium": "skipped",
        "test_gpu": "skipped",
        "test_unclassified": "skipped",
        "test_xfail": "skipped",  # junit reports an xfail as skipped
        "test_passes": "passed",
        "test_module_skip": "skipped",
    }


@pytest.mark.parametrize("how", ["env", "option"])
def test_a_dependency_skip_fails_and_a_gpu_skip_does_not(tmp_path, how):
    outcomes = _run(tmp_path, *(["--require-deps"] if how == "option" else []), require=how == "env")
    kinds = {name: outcome for name, (outcome, _) in outcomes.items()}
    assert kinds == {
        "test_verl": "failure",
        "test_own_submodule": "failure",
        "test_chromium": "error",  # a skipif mark skips at setup
        "test_gpu": "skipped",
        "test_unclassified": "failure",
        "test_xfail": "skipped",
        "test_passes": "passed",
        "test_module_skip": "error",  # collection
    }
    messages = {name: message for name, (_, message) in outcomes.items()}
    assert "verl (pip install -e '.[test]')" in messages["test_verl"]
    assert "trustbench's own module" in messages["test_own_submodule"]
    assert "chromium (apt-get install chromium)" in messages["test_chromium"]
    assert "poppler-utils" in messages["test_module_skip"]
    assert "not classified in tests/required_deps.py" in messages["test_unclassified"]


# pytest.skip("..."), the report tests' _need(ok, "..."), skipif(..., reason="...")
SKIP_CALLS = (
    re.compile(r"""(?:pytest\.skip\(|_need\([^,]+,)\s*f?(["'])(.+?)\1"""),
    re.compile(r"""skipif\((?:[^()]|\([^()]*\))*?reason=\s*f?(["'])(.+?)\1""", re.S),
)


def _reasons_in_the_suite() -> list[tuple[str, str]]:
    """(file, reason) of every literal skip reason under tests/ (pytest.skip, skipif reasons, the
    report tests' ``_need``); f-string fields become an example value."""
    found = []
    for path in sorted((REPO_ROOT / "tests").rglob("*.py")):
        if path.name in ("test_required_deps.py", "required_deps.py"):
            continue
        text = path.read_text()
        for pattern in SKIP_CALLS:
            for match in pattern.finditer(text):
                reason = re.sub(r"\{[^}]*\}", "1", match.group(2))
                found.append((str(path.relative_to(REPO_ROOT)), reason))
        for module in re.findall(r"""importorskip\(\s*["']([\w.]+)["']""", text):
            found.append((str(path.relative_to(REPO_ROOT)), f"could not import '{module}': No module named '{module}'"))
    return found


def test_every_skip_reason_of_the_suite_is_classified():
    reasons = _reasons_in_the_suite()
    assert len(reasons) > 40
    unclassified = [(path, reason) for path, reason in reasons if classify(reason)[0] == "unclassified"]
    assert unclassified == []
    assert classify("gpu: no CUDA device on this machine")[0] == "allowed"
    assert classify("slurm: no sbatch on PATH (see slurm/testcluster)") == (
        "required",
        "the Slurm test cluster (slurm/testcluster/install.sh)",
    )
