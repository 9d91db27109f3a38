"""Write the figures of the benchmarks page (``docs/benchmarks.md``) from the committed records.

A record is a JSON file in ``docs/benchmarks/``: what a benchmark script wrote with ``--json PATH``
(``tests/benchmarks/record.py``: date, commit, machine, load average, figures), or a figure written
into the documentation before the scripts wrote records, quoted from the file and commit that hold
it (``"provenance": "recorded by hand from <commit>"``). Each section's figures sit between
``<!-- benchmarks:SECTION -->`` and ``<!-- /benchmarks:SECTION -->`` markers and are rewritten here;
the prose around them is kept.

    python tests/benchmarks/bench_troll.py --threads 1 --json docs/benchmarks/bench_troll-cpu-DATE.json
    python docs/gen_benchmarks.py           # rewrite the page's figures from docs/benchmarks/*.json
    python docs/gen_benchmarks.py --check   # exit 1 if the page is not what the records give
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "benchmarks.md"
RECORDS = ROOT / "docs" / "benchmarks"
SECTIONS = ("demo", "suite", "verl", "scripts")
REQUIRED = ("benchmark", "section", "command", "date", "commit", "provenance", "machine", "figures")
HAND = "recorded by hand from "


def load_records(folder: Path = RECORDS) -> list[tuple[str, dict]]:
    """(file name, record) of every ``*.json`` in ``folder``, checked for the fields the page shows."""
    out = []
    for path in sorted(folder.glob("*.json")):
        rec = json.loads(path.read_text())
        missing = [key for key in REQUIRED if not rec.get(key)]
        if missing:
            raise SystemExit(f"{path}: record without {', '.join(missing)}")
        if rec["section"] not in SECTIONS:
            raise SystemExit(f"{path}: section {rec['section']!r} is not one of {', '.join(SECTIONS)}")
        if rec["provenance"] != "measured" and not rec["provenance"].startswith(HAND):
            raise SystemExit(f"{path}: provenance must be 'measured' or '{HAND}<commit>'")
        out.append((path.name, rec))
    return out


def machine_text(machine: dict) -> str:
    """One line for the machine: a measured record's CPU, cores, memory, torch (and GPU), or a hand record's words."""
    if "description" in machine:
        return machine["description"]
    parts = [f"{machine['cpu']}, {machine['cores']} cores"]
    if machine.get("memory_gib"):
        parts.append(f"{machine['memory_gib']:g} GiB")
    if machine.get("gpu"):
        parts.append(machine["gpu"])
    if machine.get("torch"):
        parts.append(f"torch {machine['torch']}")
    return ", ".join(parts)


def short_commit(commit: str) -> str:
    head, _, dirty = commit.partition("+")
    return f"`{head[:7]}`" + (" with uncommitted changes" if dirty else "")


def provenance_line(name: str, rec: dict) -> str:
    """Where a record's figures come from: when, at which commit, on which machine, under what load."""
    date = rec["date"].replace("T", " ").replace("Z", " UTC")
    machine = machine_text(rec["machine"])
    if rec["provenance"] == "measured":
        load = rec.get("load_average") or {}
        text = f"measured {date} at {short_commit(rec['commit'])} on {machine}"
        if load:
            text += f"; load average {load['start'][0]:g} at the start, {load['end'][0]:g} at the end"
    else:
        recorded = rec["provenance"][len(HAND) :]
        text = (
            f"recorded by hand from `{recorded}`, quoted from {rec.get('source', 'the documentation')} at that commit"
        )
        text += f" ({date[:10]})"
        if not rec["commit"].startswith(recorded):
            text += f", measured at {short_commit(rec['commit'])}"
        text += f", on {machine}"
    return f"{text} ([record](benchmarks/{name}))"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_section(records: list[tuple[str, dict]], section: str) -> str:
    """Each record of ``section``: a line naming the benchmark, its command and provenance, then its figures."""
    blocks = []
    chosen = [(n, r) for n, r in records if r["section"] == section]
    for name, rec in sorted(chosen, key=lambda nr: (nr[1]["benchmark"], nr[1]["date"], nr[0])):
        lines = [f"**{rec['benchmark']}** (`{rec['command']}`): {provenance_line(name, rec)}."]
        if rec.get("notes"):
            lines[0] += f" {rec['notes'][0].upper()}{rec['notes'][1:].rstrip('.')}."
        targets = any(f.get("target") for f in rec["figures"])
        lines += [
            "",
            "| figure | value |" + (" target |" if targets else ""),
            "|---|---|" + ("---|" if targets else ""),
        ]
        for f in rec["figures"]:
            row = f"| {cell(f['figure'])} | {cell(f['value'])} |"
            lines.append(row + (f" {cell(f.get('target', ''))} |" if targets else ""))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) if blocks else "No record yet."


def replace_part(text: str, name: str, body: str) -> str:
    """``text`` with the part ``name`` (between its markers) replaced by ``body``; the markers must exist."""
    pattern = re.compile(rf"(<!-- benchmarks:{name} -->\n).*?(<!-- /benchmarks:{name} -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"{PAGE}: no <!-- benchmarks:{name} --> ... <!-- /benchmarks:{name} --> markers")
    return pattern.sub(lambda m: m.group(1) + body.rstrip() + "\n" + m.group(2), text)


def render_page(text: str, records: list[tuple[str, dict]]) -> str:
    for section in SECTIONS:
        text = replace_part(text, section, render_section(records, section))
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page differs from what the records give")
    args = parser.parse_args(argv)
    text = PAGE.read_text()
    new = render_page(text, load_records())
    if args.check:
        if new != text:
            print(f"{PAGE.relative_to(ROOT)} is not current with docs/benchmarks/: run python docs/gen_benchmarks.py")
            return 1
        return 0
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
