"""The machine's ceilings for MFU and the Roofline: peak FLOP/s and memory bandwidth.

- GPU: the accelerator table of the Roofline figure (``analysis/data/hardware.csv``: dense BF16
  TFLOP/s and HBM TB/s per GPU model), matched by name in ``torch.cuda.get_device_name()``; an
  unlisted GPU has no ceiling (MFU is then not logged).
- CPU: measured once per machine and thread count, then cached in
  ``$TRUSTBENCH_CACHE/hardware/<cpu model>-<threads>t.json``: the best rate of a 1024^3 fp32 matmul
  with the trainer's torch threads, and the best bandwidth of a numpy copy of 64 MiB (read + write,
  larger than the last-level caches of current CPUs). Both are timed in process CPU time (divided by
  the threads for the matmul), so a measurement on a loaded machine still sees the cores' own speed.

Below the ceilings, the rest of what this module knows of the machine: the CPUs this process may use and
the machine's load (``available_cpus``, ``load_metrics``, ``default_threads``), and the Slurm allocation
the process runs in (``slurm_allocation``). A cell's estimated CPU time is ``runners.perf.cpu_cost``.

    from runners.perf.hardware import machine_ceiling
    ceiling = machine_ceiling(torch.device("cpu"))      # Ceiling(tflops=..., mem_bw_tbs=..., source=...)
"""

from __future__ import annotations

import csv
import json
import os
import platform
import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from runners import metric_names
from runners.paths import model_cache_dir

HARDWARE_CSV = Path(__file__).resolve().parents[2] / "analysis" / "data" / "hardware.csv"
MATMUL_SIZE = 1024
COPY_BYTES = 64 * 2**20
REPEATS = 5


@dataclass(frozen=True)
class Ceiling:
    tflops: float  # peak dense matmul rate, TFLOP/s
    mem_bw_tbs: float  # memory bandwidth, TB/s
    source: str


def gpu_ceiling(device_name: str, table: Path = HARDWARE_CSV) -> Ceiling | None:
    """The table row whose name appears as a word in ``device_name`` (longest name first), else None."""
    with open(table, newline="") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    for row in sorted(rows, key=lambda r: -len(r["name"])):
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(row['name'])}(?![0-9])", device_name, flags=re.IGNORECASE):
            return Ceiling(float(row["bf16_dense_tflops"]), float(row["mem_bw_tbs"]), f"{table.name}: {row['name']}")
    return None


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else ``platform.processor()``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown-cpu"


def cpu_cache_file(threads: int, model: str | None = None) -> Path:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", model or cpu_model()).strip("-").lower() or "cpu"
    return model_cache_dir() / "hardware" / f"{slug}-{threads}t.json"


def measure_cpu(threads: int) -> Ceiling:
    """Best fp32 matmul rate with ``threads`` torch threads and best numpy-copy bandwidth (see module doc)."""
    import numpy as np
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.randn(MATMUL_SIZE, MATMUL_SIZE)
        b = torch.randn(MATMUL_SIZE, MATMUL_SIZE)
        torch.mm(a, b)
        best = float("inf")
        for _ in range(REPEATS):
            start = time.process_time()
            torch.mm(a, b)
            best = min(best, (time.process_time() - start) / threads)
        tflops = 2.0 * MATMUL_SIZE**3 / max(best, 1e-9) / 1e12
    finally:
        torch.set_num_threads(previous)
    src = np.ones(COPY_BYTES // 8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(REPEATS):
        start = time.process_time()
        np.copyto(dst, src)
        best = min(best, time.process_time() - start)
    mem_bw_tbs = 2.0 * COPY_BYTES / max(best, 1e-9) / 1e12
    return Ceiling(tflops, mem_bw_tbs, f"measured: {cpu_model()}, {threads} thread(s)")


def cpu_ceiling(threads: int, *, measure=None) -> Ceiling:
    """The cached measurement for this CPU model and thread count (measured and written on first use)."""
    path = cpu_cache_file(threads)
    try:
        return Ceiling(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        pass
    ceiling = (measure or measure_cpu)(threads)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(ceiling)))
        os.replace(tmp, path)
    except OSError:  # a read-only cache: measure again next time
        pass
    return ceiling


def machine_ceiling(device) -> Ceiling | None:
    """The ceiling of ``device`` (a ``torch.device``): the GPU table's row, or this CPU's measurement."""
    import torch

    if device.type == "cuda":
        return gpu_ceiling(torch.cuda.get_device_name(device))
    return cpu_ceiling(torch.get_num_threads())


__all__ = ["Ceiling", "cpu_ceiling", "gpu_ceiling", "machine_ceiling", "measure_cpu"]


# -- the CPUs this process may use and the machine's load -------------------------------------------------
def available_cpus() -> int:
    """CPUs this process may run on (a Slurm job's cgroup or CPU affinity), not the node's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def load_metrics() -> dict[str, float]:
    """The machine's 1-minute load average beside the CPUs available to this process (both backends)."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # pragma: no cover
        load = float("nan")
    return {metric_names.LOAD_AVG_1M: load, metric_names.CPU_COUNT_AVAILABLE: float(available_cpus())}


def default_threads() -> int:
    """Torch threads when ``backend.num_threads=0``: one less than the CPUs available to this process
    (at least 1), leaving a core to the tracker thread, the OS and a neighbour's job.

    Measured with ``tests/benchmarks/bench_threads.py --steps 6 --repeats 2`` on 2 cores (embedded
    default, demo settings): 2 threads took 1.05x the wall time of 1 thread on the quiet machine (1.21x
    the CPU time) and 1.35x beside one spinning process. Not measured on larger machines or models.
    """
    return max(1, available_cpus() - 1)


# -- the Slurm allocation this process runs in ----------------------------------------------------------
def slurm_allocation(env: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """(nodes, GPUs per node) of the Slurm allocation this process runs in, or None outside one."""
    env = os.environ if env is None else env
    if not env.get("SLURM_JOB_ID") or not env.get("SLURM_JOB_NODELIST"):
        return None
    nodes = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1)
    gpus = env.get("SLURM_GPUS_ON_NODE", "")
    if not gpus.isdigit():
        visible = env.get("CUDA_VISIBLE_DEVICES", "")
        gpus = str(len([d for d in visible.split(",") if d])) if visible and visible != "NoDevFiles" else "0"
    return nodes, int(gpus)
