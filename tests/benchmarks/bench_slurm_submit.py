"""Benchmark: planning (dry run) and queueing a 256-cell sweep on the Slurm test cluster.

Design: the grid is ``demo`` with 8 methods x 32 seeds (8 distinct group-override combinations,
256 cells), ``launcher=slurm``. Three timings, each the median of ``--repeats`` runs:

- dry run in process: ``runners.sweep.plan`` + ``format_plan`` (Hydra composition, validation,
  run keys, resources, the MLflow lookup, the cluster check), after imports;
- dry run as a command: ``python -m runners.cli sweep demo ... --dry-run``, wall and CPU time
  (interpreter start and imports included; the wall time depends on the machine's load);
- queueing: ``runners.sweep.launch(wait=False)`` from the planned sweep until sbatch accepted every
  job array (MLflow store and experiment set up, markers written, 256 pickled jobs). The cells
  "exit at once" in the sense that matters here: they are submitted held (``--hold``) so that
  256 Python jobs do not start on the 2-core test machine, and are cancelled right after.

For scale, the planner's reference path (Hydra's full composition of every cell) is timed on a
slice of cells and extrapolated. Targets: dry run <= 2 s, queueing <= 10 s. No assertions: timings
depend on the machine and its load (reported with the load average).

    bash slurm/testcluster/up.sh && . /tmp/trustbench-slurm/etc/env.sh
    python tests/benchmarks/bench_slurm_submit.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import record

REPO = Path(__file__).resolve().parents[2]
METHODS = "+method=grpo,grpo_troll,grpo_trm,gtpo,repo_r,dapo,adapo,drgrpo"
GRID = [METHODS, "seed=range(0,32)"]
SLURM = ["launcher=slurm", "launcher.time_min=10", "launcher.cpus_per_task=1", "launcher.mem_gb=1"]


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s (min {min(values):.2f}, n={len(values)})"


def bench_dry_run(repeats: int) -> dict:
    from runners import sweep
    from runners.config import grid

    sweep.plan("demo", [*GRID, *SLURM])  # imports and file-system caches warm
    walls, cpus = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        p = sweep.plan("demo", [*GRID, *SLURM])
        sweep.format_plan(p)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    print(
        f"dry run in process ({len(p.cells)} cells, {len(p.groups())} job arrays): wall {_median(walls)}, CPU {_median(cpus)}"
    )

    hydra, master = p.master
    composer = grid.Composer(hydra, master, p.base_overrides)
    sample = p.cells[::32]
    t0 = time.perf_counter()
    for cell in sample:
        composer.compose_full(cell.overrides)
    per_cell = (time.perf_counter() - t0) / len(sample)
    print(
        f"reference (Hydra composition per cell): {per_cell:.3f} s/cell -> ~{per_cell * len(p.cells):.0f} s for the grid"
    )

    walls, cpus = [], []
    cmd = [sys.executable, "-m", "runners.cli", "sweep", "demo", *GRID, *SLURM, "--dry-run"]
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
        walls.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if out.returncode != 0:
            raise SystemExit(f"dry run failed:\n{out.stderr[-3000:]}")
    print(f"dry run as a command: wall {_median(walls)}, CPU {_median(cpus)}")
    return {"cells": len(p.cells), "command_wall_s": walls, "command_cpu_s": cpus, "compose_per_cell_s": per_cell}


def bench_queueing(repeats: int) -> dict:
    from runners import sweep

    times, inner = [], []
    for r in range(repeats):
        p = sweep.plan(
            "demo", [*GRID, *SLURM, f"experiment=bench-submit-{r}", "+launcher.additional_parameters.hold=true"]
        )
        t0 = time.perf_counter()
        jobs = sweep.launch(p, wait=False, stream=io.StringIO())
        times.append(time.perf_counter() - t0)
        inner.append(p.queued_s)
        arrays = sorted({j.job_id.split("_")[0] for j in jobs})
        queued = subprocess.run(
            ["squeue", "-h", "-r", "-j", ",".join(arrays), "-o", "%i"], capture_output=True, text=True
        )
        n = len(queued.stdout.split())
        subprocess.run(["scancel", *arrays], check=False)
        if n != len(p.cells):
            raise SystemExit(f"expected {len(p.cells)} queued jobs, squeue lists {n}")
    print(
        f"queueing 256 cells (launch until sbatch accepted all): {_median(times)}; of which job arrays: {_median(inner)}"
    )
    return {"queue_s": times, "job_arrays_s": inner}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    record.add_option(parser)
    args = parser.parse_args()
    if args.json:
        args.json = os.path.abspath(args.json)  # the benchmark runs in a temporary directory
    rec = record.start("bench_slurm_submit.py")
    if subprocess.run(["sinfo", "-h"], capture_output=True).returncode != 0:
        raise SystemExit(
            "needs the Slurm test cluster: bash slurm/testcluster/up.sh && . /tmp/trustbench-slurm/etc/env.sh"
        )
    with tempfile.TemporaryDirectory() as home:
        os.environ["TRUSTBENCH_HOME"] = home
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        os.chdir(home)
        print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        dry = bench_dry_run(args.repeats)
        queue = bench_queueing(args.repeats)
        print(f"load average after: {os.getloadavg()[0]:.1f}")
    figures = [
        record.figure(
            f"dry run of a {dry['cells']}-cell sweep (command, median wall)",
            f"{statistics.median(dry['command_wall_s']):.1f} s",
            "<= 2 s",
        ),
        record.figure("queued on the test cluster (median)", f"{statistics.median(queue['queue_s']):.1f} s", "<= 10 s"),
    ]
    rec.write(args.json, figures, {"args": vars(args), "dry_run": dry, "queueing": queue})


if __name__ == "__main__":
    main()
