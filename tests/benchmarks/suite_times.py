"""Where the test suite's time goes: run pytest and print each stage's wall and CPU time, the cores busy
on average, and the slowest tests.

    python tests/benchmarks/suite_times.py -- -n 2 --dist loadgroup      # what `make test-times` runs
    python tests/benchmarks/suite_times.py --json after.json --compare before.json -- -m "not slurm"

Everything after ``--`` goes to pytest. The per-test figures come from tests/suite_timing.py (each
test's wall time, and its CPU time: the test's process plus the subprocesses it waited for); this
script adds the whole command's wall time, the CPU time of pytest and everything it waited for, and
the machine's busy CPU time over the run (``/proc/stat``: Ray and Slurm daemons included), which gives
the average number of cores busy out of those this process may use. ``--compare`` prints the ratios
against an earlier ``--json`` file. pytest's exit code is this script's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import record  # noqa: E402

from runners.perf.hardware import available_cpus  # noqa: E402
from tests.suite_timing import _machine_busy_s, stage_table  # noqa: E402


def run(pytest_args: list[str]) -> tuple[int, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "times.json"
        env = {**os.environ, "TB_SUITE_TIMES": str(out)}
        t0, busy0 = time.time(), _machine_busy_s()
        code = subprocess.call([sys.executable, "-m", "pytest", *pytest_args], cwd=REPO, env=env)
        wall, busy = time.time() - t0, _machine_busy_s() - busy0
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        data = json.loads(out.read_text()) if out.exists() else {"stages": {}, "tests": []}
    data["command"] = {
        "args": pytest_args,
        "wall_s": wall,
        "cpu_s": children.ru_utime + children.ru_stime,
        "machine_cpu_s": busy,
        "cores": available_cpus(),
        "exit": code,
    }
    return code, data


def show(data: dict, slowest: int, before: dict | None) -> None:
    cmd = data["command"]
    cores = cmd["cores"]
    print(f"\n== suite times: pytest {' '.join(cmd['args'])}  (exit {cmd['exit']})")
    print(
        f"whole command: {cmd['wall_s']:.0f} s wall; CPU {cmd['cpu_s']:.0f} s (pytest and what it waited for), "
        f"machine {cmd['machine_cpu_s']:.0f} s: {cmd['machine_cpu_s'] / cmd['wall_s']:.2f} of {cores} cores busy"
    )
    if data["stages"]:
        print("\n".join(stage_table(data)))
    if before is not None:
        b = before["command"]
        print(
            f"against the earlier run: wall {cmd['wall_s'] / b['wall_s']:.2f}x ({b['wall_s']:.0f} -> {cmd['wall_s']:.0f} s), "
            f"cores busy {b['machine_cpu_s'] / b['wall_s']:.2f} -> {cmd['machine_cpu_s'] / cmd['wall_s']:.2f}"
        )
        for name, s in data["stages"].items():
            old = before["stages"].get(name)
            if old:
                print(
                    f"  {name:<9} wall {old['wall_s']:.0f} -> {s['wall_s']:.0f} s, tests CPU {old['test_cpu_s']:.0f} -> {s['test_cpu_s']:.0f} s"
                )
    print(f"\n{slowest} slowest tests (setup + call + teardown):")
    print(f"{'wall s':>8} {'CPU s':>8}  {'stage':<9} {'worker':<6} test")
    for t in data["tests"][:slowest]:
        print(f"{t['wall_s']:>8.1f} {t['cpu_s']:>8.1f}  {t['stage']:<9} {t['worker']:<6} {t['nodeid']}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--compare", type=Path, help="an earlier --json file to compare with")
    parser.add_argument("--slowest", type=int, default=30)
    args = parser.parse_args(own)
    before = json.loads(args.compare.read_text()) if args.compare else None
    if before is not None and "results" in before:  # a record: the suite's figures are its results
        before = before["results"]
    rec = record.start("suite_times.py", section="suite", argv=argv)
    code, data = run(pytest_args)
    if args.json:
        cmd = data["command"]
        figures = [
            record.figure(
                f"`pytest {' '.join(pytest_args)}` (exit {cmd['exit']})",
                f"{cmd['wall_s']:.0f} s wall, {cmd['machine_cpu_s'] / cmd['wall_s']:.2f} of {cmd['cores']} cores busy",
            )
        ]
        figures += [record.figure(f"stage `{name}`", f"{s['wall_s']:.0f} s wall") for name, s in data["stages"].items()]
        # a benchmark record (tests/benchmarks/record.py) with the suite's figures as its results
        args.json.write_text(json.dumps(rec.record(figures, data), indent=1))
    show(data, args.slowest, before)
    return code


if __name__ == "__main__":
    sys.exit(main())
