"""Torch threads for the built-in trainer: 1 vs 2 (or N) threads, on a quiet machine and beside another job.

Runs the same short cell (the demo's settings on the embedded default, ``trainer.total_steps`` steps,
no evaluation) as separate ``trustbench run`` processes, alternating the thread counts, each with and
without a background load (one process spinning on one core, what a neighbour's job does). Prints per
configuration the median over repeats of wall time, CPU time (user + system of the run) and the
wall-time ratio to 1 thread in the same load condition. The trainer's default
(``backend.num_threads=0``) follows from these figures; see ``runners.backends.local.trainer``.

    python tests/benchmarks/bench_threads.py --steps 20 --repeats 3 --threads 1 2
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import record

ROOT = Path(__file__).resolve().parents[2]


def _spin(stop) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def _run(threads: int, steps: int, model: str) -> tuple[float, float]:
    """(wall s, CPU s) of one ``trustbench run`` child process."""
    home = tempfile.mkdtemp(prefix="bench-threads-")
    cmd = [
        sys.executable,
        "-m",
        "runners.cli",
        "run",
        f"model={model}",
        f"trainer.total_steps={steps}",
        "trainer.prompts_per_step=16",
        "trainer.n=8",
        "trainer.mini_batch_prompts=8",
        "trainer.eval_every=0",
        "trainer.checkpoint_every=0",
        f"backend.num_threads={threads}",
        f"experiment=bench_threads_{threads}",
        "progress=false",
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, env={**os.environ, "TRUSTBENCH_HOME": home}, check=True, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--model", default="embedded")
    record.add_option(parser)
    args = parser.parse_args(argv)
    rec = record.start("bench_threads.py", argv=argv)
    print(f"cores available: {len(os.sched_getaffinity(0))}; {args.steps} steps of model={args.model}")
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for load in ("quiet", "loaded"):
        stop, spinner = mp.Event(), None
        if load == "loaded":
            spinner = mp.Process(target=_spin, args=(stop,), daemon=True)
            spinner.start()
        for _ in range(args.repeats):
            for threads in args.threads:  # alternate: drift of the machine hits every configuration alike
                results.setdefault((load, threads), []).append(_run(threads, args.steps, args.model))
        if spinner is not None:
            stop.set()
            spinner.join()
    summary = []
    print(f"{'load':<8}{'threads':>8}{'wall s':>10}{'CPU s':>10}{'wall / 1 thread':>18}")
    for (load, threads), runs in results.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        base = statistics.median(w for w, _ in results[(load, args.threads[0])])
        print(f"{load:<8}{threads:>8}{wall:>10.1f}{cpu:>10.1f}{wall / base:>18.2f}")
        summary.append({"load": load, "threads": threads, "wall_s": wall, "cpu_s": cpu, "wall_ratio": wall / base})
    first = args.threads[0]
    figures = [
        record.figure(
            f"{r['threads']} threads vs {first}, {r['load']} ({args.steps} steps of model={args.model})",
            f"{r['wall_ratio']:.2f}x wall ({r['wall_s']:.1f} s, {r['cpu_s']:.1f} CPU-s)",
        )
        for r in summary
        if r["threads"] != first
    ]
    rec.write(args.json, figures, {"args": vars(args), "runs": summary})


if __name__ == "__main__":
    main()
