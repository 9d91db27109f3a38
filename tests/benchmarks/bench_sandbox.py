"""Benchmark: per-program overhead of the code-reward sandbox, hardened vs the sandbox before it.

    python tests/benchmarks/bench_sandbox.py                     # 50 runs of each variant
    python tests/benchmarks/bench_sandbox.py --runs 100 --baseline-rev 789aa83

Variants, run in alternating order (the machine is shared), each on the same trivial program
(``print(input())``) with the default limits:
- ``baseline``: runners/data/sandbox.py and _sandbox_boot.py as of ``--baseline-rev`` (default: the
  last commit before the per-run uid / pid-namespace sandbox), loaded from git into a temp dir;
- ``hardened``: the current sandbox, namespaces when the kernel allows them (``auto``);
- ``fallback``: the current sandbox with ``namespaces="off"`` (subreaper, uid sweep).
Wall time is per ``run_python`` call; CPU time is user+system of this process and of every child it
waited for (the supervisor's rusage includes its reaped descendants). Prints medians and the ratio
to the baseline; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import importlib.util
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import record

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
BASELINE_REV = "789aa83"  # last commit with the nobody/process-group sandbox


def load_baseline(rev: str, into: Path):
    """The sandbox module as of ``rev`` (it imports only the standard library)."""
    for name in ("sandbox.py", "_sandbox_boot.py"):
        text = subprocess.run(
            ["git", "show", f"{rev}:runners/data/{name}"], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout
        (into / name).write_text(text)
    spec = importlib.util.spec_from_file_location("baseline_sandbox", into / "sandbox.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--baseline-rev", default=BASELINE_REV)
    record.add_option(parser)
    args = parser.parse_args()
    rec = record.start("bench_sandbox.py")

    from runners.data.sandbox import SandboxConfig, isolation, run_python

    with tempfile.TemporaryDirectory() as tmp:
        baseline = load_baseline(args.baseline_rev, Path(tmp))
        variants = {
            "baseline": lambda: baseline.run_python("print(input())", stdin="x\n"),
            "hardened": lambda: run_python("print(input())", stdin="x\n"),
            "fallback": lambda: run_python("print(input())", stdin="x\n", config=SandboxConfig(namespaces="off")),
        }
        for run in variants.values():  # warm-up: interpreter probe, page cache
            assert run().stdout == "x\n"
        wall: dict[str, list[float]] = {name: [] for name in variants}
        cpu: dict[str, list[float]] = {name: [] for name in variants}
        names = list(variants)
        for i in range(args.runs):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                c0, t0 = cpu_s(), time.perf_counter()
                result = variants[name]()
                wall[name].append(time.perf_counter() - t0)
                cpu[name].append(cpu_s() - c0)
                assert result.ok, (name, result)
    print(f"isolation: {isolation()}")
    print(f"{args.runs} runs each, baseline = {args.baseline_rev}")
    print(f"{'variant':10s} {'wall ms':>9s} {'cpu ms':>9s} {'wall ratio':>11s} {'cpu ratio':>10s}")
    base_wall, base_cpu = statistics.median(wall["baseline"]), statistics.median(cpu["baseline"])
    rows = {}
    for name in names:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        print(f"{name:10s} {w * 1e3:9.1f} {c * 1e3:9.1f} {w / base_wall:11.2f} {c / base_cpu:10.2f}")
        rows[name] = {"wall_ms": w * 1e3, "cpu_ms": c * 1e3, "wall_ratio": w / base_wall, "cpu_ratio": c / base_cpu}
    figures = [
        record.figure(
            f"`{name}` sandbox, per program ({args.runs} runs against the sandbox of {args.baseline_rev})",
            f"{r['wall_ms']:.1f} ms wall, {r['cpu_ms']:.1f} ms CPU: {r['wall_ratio']:.2f}x the baseline's wall",
        )
        for name, r in rows.items()
        if name != "baseline"
    ]
    rec.write(args.json, figures, {"args": vars(args), "isolation": str(isolation()), "variants": rows})


if __name__ == "__main__":
    main()
