"""The mutation score of the algorithm library (``make mutation``), from the results mutmut left in mutants/.

A mutant is killed when a test failed (or timed out: an endless loop is a detected change) under it.
Survivors listed in tests/mutation/equivalent.toml (mutant name = why no test can tell it from the
original) count as equivalent and leave the denominator; every other survivor is printed with its diff
and is either a missing test or a line to add to that list. The score is
killed / (killed + survived - equivalent), per file and in all; mutants not yet run are counted
apart (``make mutation`` can be stopped and resumed).

    python tests/mutation/score.py [--diffs] [--fail-under 90]

Needs mutmut (``pip install -e '.[mutation]'``); run from the repository root after ``mutmut run``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
EQUIVALENT = Path(__file__).with_name("equivalent.toml")
KILLED = {"killed", "timeout", "caught by type check"}


def load_results(mutants: Path) -> dict[str, str]:
    """mutant name -> mutmut's status, for every mutant generated so far."""
    from mutmut.stats import status_by_exit_code

    out: dict[str, str] = {}
    for meta in sorted(mutants.rglob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        out.update({name: status_by_exit_code.get(code, f"exit {code}") for name, code in codes.items()})
    return out


def load_equivalent(path: Path = EQUIVALENT) -> dict[str, str]:
    """mutant name -> the reason it is equivalent (tests/mutation/equivalent.toml)."""
    if not path.is_file():
        return {}
    data = tomllib.loads(path.read_text())
    return {name: str(reason) for name, reason in data.get("equivalent", {}).items()}


def module_of(name: str) -> str:
    """``runners.algorithms.troll.x_troll_objective__mutmut_12`` -> ``runners.algorithms.troll``."""
    return name.rsplit(".", 1)[0]


def score(results: dict[str, str], equivalent: dict[str, str]) -> tuple[dict[str, Counter], list[str]]:
    """Per module counts (killed, survived, equivalent, other statuses) and the unexplained survivors."""
    counts: dict[str, Counter] = defaultdict(Counter)
    survivors = []
    for name, status in sorted(results.items()):
        module = module_of(name)
        if status in KILLED:
            counts[module]["killed"] += 1
        elif status == "survived" and name in equivalent:
            counts[module]["equivalent"] += 1
        elif status == "survived":
            counts[module]["survived"] += 1
            survivors.append(name)
        else:
            counts[module][status] += 1
    return counts, survivors


def percent(counter: Counter) -> float | None:
    tested = counter["killed"] + counter["survived"]
    return None if tested == 0 else 100.0 * counter["killed"] / tested


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mutants", type=Path, default=ROOT / "mutants", help="mutmut's working tree")
    parser.add_argument("--diffs", action="store_true", help="print each unexplained survivor's diff")
    parser.add_argument("--fail-under", type=float, default=None, help="exit 1 below this score (percent)")
    args = parser.parse_args(argv)
    if not args.mutants.is_dir():
        print(f"no mutmut results in {args.mutants}: run `make mutation` first", file=sys.stderr)
        return 2
    equivalent = load_equivalent()
    results = load_results(args.mutants)
    counts, survivors = score(results, equivalent)
    total: Counter = Counter()
    print(f"{'module':40s} {'killed':>7s} {'survived':>8s} {'equiv.':>6s} {'other':>6s} {'score':>7s}")
    for module in sorted(counts):
        c = counts[module]
        total.update(c)
        other = sum(v for k, v in c.items() if k not in ("killed", "survived", "equivalent"))
        pct = percent(c)
        shown = "-" if pct is None else f"{pct:.1f}%"
        print(f"{module:40s} {c['killed']:7d} {c['survived']:8d} {c['equivalent']:6d} {other:6d} {shown:>7s}")
    pct = percent(total)
    others = {k: v for k, v in total.items() if k not in ("killed", "survived", "equivalent")}
    print(
        f"all: {total['killed']} killed, {total['survived']} survived, {total['equivalent']} equivalent"
        + (f", {dict(others)}" if others else "")
        + ("" if pct is None else f": score {pct:.1f}% of non-equivalent mutants killed")
    )
    stale = sorted(set(equivalent) - set(results))
    if stale:
        print(f"{len(stale)} entries of {EQUIVALENT.name} name no current mutant (the code moved): {stale[:5]}")
    if survivors:
        print(f"\n{len(survivors)} survivors without a test or a reason:")
        for name in survivors:
            print(f"  {name}")
            if args.diffs:
                diff = subprocess.run(
                    [sys.executable, "-m", "mutmut", "show", name],
                    cwd=args.mutants.parent,
                    capture_output=True,
                    text=True,
                ).stdout
                print("    " + diff.strip().replace("\n", "\n    "))
    if args.fail_under is not None and (pct is None or pct < args.fail_under):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
