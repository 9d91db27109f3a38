"""The benchmarks page cannot drift from its records, and each record says where its figures come from.

- ``docs/benchmarks.md``'s figures are what ``docs/gen_benchmarks.py`` writes from ``docs/benchmarks/*.json``
  (regenerating changes nothing), in a fresh interpreter as a contributor runs it;
- every record names its date (UTC), its commit (one this repository's git history holds) and its
  machine; a measured one its load average;
- a figure "recorded by hand from <commit>" is quoted word for word from the file it names at that
  commit (``git show``), so no hand-recorded figure is invented or edited after the fact;
- the README keeps none of the figures;
- a benchmark script's ``--json`` writes such a record (``bench_logprobs.py`` at a tiny size), whose
  figures are its own unrounded results.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "benchmarks.md"
RECORDS = sorted((ROOT / "docs" / "benchmarks").glob("*.json"))
HAND = "recorded by hand from "


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _module(ROOT / "docs" / "gen_benchmarks.py", "gen_benchmarks")


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def _needs_history() -> None:
    """The records name commits of this repository's history: a shallow clone (``git clone --depth``) has
    none of them but its last, so the checks that read history say so and skip."""
    if _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        pytest.skip("git history: this clone is shallow; the records' commits are not in it")


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _ids(paths):
    return [p.name for p in paths]


def test_page_is_current_with_the_records():
    out = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "gen_benchmarks.py"), "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-2000:]


def test_check_sees_a_changed_record():
    """Rendering from a record whose figure changed gives another page; a section without markers stops."""
    records = gen.load_records()
    text = PAGE.read_text()
    assert gen.render_page(text, records) == text
    name, rec = records[0]
    changed = json.loads(json.dumps(rec))
    changed["figures"][0]["value"] += " (changed)"
    assert gen.render_page(text, [(name, changed), *records[1:]]) != text
    with pytest.raises(SystemExit, match="benchmarks:scripts"):
        gen.render_page(text.replace("<!-- /benchmarks:scripts -->", ""), records)


def test_records_cover_every_section_and_the_scripts():
    records = [json.loads(p.read_text()) for p in RECORDS]
    assert {r["section"] for r in records} == set(gen.SECTIONS)
    measured = {r["benchmark"] for r in records if r["provenance"] == "measured"}
    assert measured, "no record measured by a benchmark script"
    for name in measured:
        assert (ROOT / "tests" / "benchmarks" / name).is_file(), name


@pytest.mark.parametrize("path", RECORDS, ids=_ids(RECORDS))
def test_record_names_its_date_commit_and_machine(path):
    rec = json.loads(path.read_text())
    date = datetime.fromisoformat(rec["date"].replace("Z", "+00:00"))
    assert date.utcoffset().total_seconds() == 0 and date.year >= 2026, rec["date"]
    commit = rec["commit"].removesuffix("+dirty")
    assert re.fullmatch(r"[0-9a-f]{7,40}", commit), rec["commit"]
    assert rec["figures"] and all(f["figure"] and f["value"] for f in rec["figures"])
    machine = rec["machine"]
    if rec["provenance"] == "measured":
        assert machine["cpu"] and machine["cores"] >= 1 and machine["memory_gib"] > 0 and machine["torch"], machine
        load = rec["load_average"]
        assert len(load["start"]) == 3 and len(load["end"]) == 3, load
        assert rec["command"].startswith(f"python tests/benchmarks/{rec['benchmark']}")
        assert "--json" not in rec["command"]
    else:
        assert rec["provenance"].startswith(HAND), rec["provenance"]
        assert machine["description"], machine


@pytest.mark.parametrize("path", RECORDS, ids=_ids(RECORDS))
def test_record_commit_is_in_git_history(path):
    _needs_history()
    rec = json.loads(path.read_text())
    commit = rec["commit"].removesuffix("+dirty")
    assert _git("cat-file", "-e", f"{commit}^{{commit}}").returncode == 0, f"{rec['commit']} is not in git history"


HAND_RECORDS = [p for p in RECORDS if json.loads(p.read_text())["provenance"].startswith(HAND)]


@pytest.mark.parametrize("path", HAND_RECORDS, ids=_ids(HAND_RECORDS))
def test_hand_record_quotes_its_commit(path):
    """Each value is in the named file at the named commit, and that commit's date is the record's."""
    _needs_history()
    rec = json.loads(path.read_text())
    recorded = rec["provenance"].removeprefix(HAND)
    shown = _git("show", f"{recorded}:{rec['source']}")
    assert shown.returncode == 0, shown.stderr
    source = _norm(shown.stdout)
    for f in rec["figures"]:
        assert _norm(f["value"]) in source, f"not in {rec['source']} at {recorded}: {f['value']}"
    committed = _git("log", "-1", "--format=%aI", recorded).stdout.strip()
    assert datetime.fromisoformat(committed) == datetime.fromisoformat(rec["date"].replace("Z", "+00:00"))
    # the check can fail: one digit changed is not in the source
    first = rec["figures"][0]["value"]
    altered = re.sub(r"\d", lambda m: str((int(m.group()) + 1) % 10), first, count=1)
    assert altered == first or _norm(altered) not in source


# a figure: a number with a unit or a ratio (``1,200 s``, ``6.9 minutes``, ``2.07x``, ``9.0 GiB``)
FIGURE = re.compile(r"\d[\d,.]*(?:x\b| ?(?:s|ms|us|min|minutes|GiB|MiB|KB|GFLOP/s|CPU-s)\b)")


def test_readme_keeps_none_of_the_figures():
    readme = (ROOT / "README.md").read_text()
    figures = set()
    for path in RECORDS:
        for f in json.loads(path.read_text())["figures"]:
            figures |= set(FIGURE.findall(f["value"]))
    assert "415 s" in figures and "2.07x" in figures  # the pattern finds figures
    kept = sorted(x for x in figures if re.search(rf"(?<![\d.,]){re.escape(x)}", readme))
    assert not kept, f"README.md keeps benchmark figures (they belong in docs/benchmarks.md): {kept}"


def test_bench_script_writes_a_record(tmp_path):
    """``bench_logprobs.py --json`` at a tiny size: a record the generator accepts, whose figure is the ratio
    of the medians in its own results, with this checkout's commit."""
    out = tmp_path / "records" / "logprobs.json"
    out.parent.mkdir()
    cmd = [sys.executable, "tests/benchmarks/bench_logprobs.py", "--tokens", "4", "--vocab", "64", "--repeats", "1"]
    done = subprocess.run([*cmd, "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "log-probs, forward + backward" in done.stdout  # the printed output is still there
    [(name, rec)] = gen.load_records(out.parent)
    assert rec["provenance"] == "measured" and rec["benchmark"] == "bench_logprobs.py"
    assert rec["command"] == "python tests/benchmarks/bench_logprobs.py --tokens 4 --vocab 64 --repeats 1"
    assert rec["commit"].removesuffix("+dirty") == _git("rev-parse", "HEAD").stdout.strip()
    forms = rec["results"]["forms"]["log-probs, forward + backward"]
    ours, fused = forms["x[y] - logsumexp(x)"], forms["log_softmax(x)[y]"]
    assert rec["figures"][0]["value"].startswith(f"{fused['wall_s'] / ours['wall_s']:.2f}x wall")
    assert "bench_logprobs.py" in gen.render_section([(name, rec)], "scripts")
