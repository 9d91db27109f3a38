"""Machine-readable records of the benchmark scripts (``--json PATH`` on each of them).

A record is one JSON object: which script, the command line, when (UTC), at which commit, on which
machine (CPU model, cores this process may use, memory, torch version, GPU if one was used) and the
machine's load average at the start and the end of the run (other jobs on a shared machine slow a
benchmark down), then ``figures`` (the rows the documentation shows: what, the value as printed, the
target if there is one) and ``results`` (the script's numbers, unrounded). ``docs/gen_benchmarks.py``
renders the figures of the committed records (``docs/benchmarks/*.json``) into ``docs/benchmarks.md``.

    rec = record.start("bench_troll.py", section="scripts")
    ...
    rec.write(args.json, figures=[record.figure("TROLL update / PPO update", "0.81x", "<= 1.5x")], results={...})

Only the standard library: the scripts that do not import torch (suite_times.py) use it too.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from runners.perf.hardware import cpu_model

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("demo", "suite", "verl", "scripts")


def memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def torch_version() -> str | None:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def git_commit() -> str | None:
    """The checkout's commit, with ``+dirty`` when tracked files differ from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine(gpu: str | None = None) -> dict:
    return {
        "cpu": cpu_model(),
        "cores": cores(),
        "memory_gib": memory_gib(),
        "torch": torch_version(),
        "gpu": gpu,
        "python": platform.python_version(),
    }


def gpu_name(device: str) -> str | None:
    """The GPU's name when ``device`` is a CUDA device (torch imported only then), else None."""
    if not str(device).startswith("cuda"):
        return None
    import torch

    return torch.cuda.get_device_name(device)


def figure(what: str, value: str, target: str = "") -> dict:
    """One row of the documentation's table."""
    return {"figure": what, "value": value, "target": target}


class Recorder:
    """Notes the start (time, load average) of a benchmark; ``write`` adds the end and saves the record."""

    def __init__(self, benchmark: str, section: str, argv: list[str] | None) -> None:
        if section not in SECTIONS:
            raise ValueError(f"section must be one of {SECTIONS}, not {section!r}")
        self.benchmark, self.section = benchmark, section
        argv = list(sys.argv[1:] if argv is None else argv)
        if "--json" in argv:  # where the record goes is not part of what was measured
            i = argv.index("--json")
            del argv[i : i + 2]
        argv = [a for a in argv if not a.startswith("--json=")]
        self.command = shlex.join(["python", f"tests/benchmarks/{benchmark}", *argv])
        self.started = datetime.now(UTC)
        self.load_start = load_average()
        self.commit = git_commit()  # the code measured: at the start, a checkout changed during a run does not count

    def record(self, figures: list[dict], results: dict, gpu: str | None = None, notes: str = "") -> dict:
        return {
            "benchmark": self.benchmark,
            "section": self.section,
            "command": self.command,
            "date": self.started.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "commit": self.commit,
            "provenance": "measured",
            "machine": machine(gpu),
            "load_average": {"start": self.load_start, "end": load_average()},
            "wall_s": round((datetime.now(UTC) - self.started).total_seconds(), 1),
            "notes": notes,
            "figures": figures,
            "results": results,
        }

    def write(self, path: str | os.PathLike | None, figures: list[dict], results: dict, **kw) -> dict | None:
        """Write the record to ``path`` (nothing without a path); returns it."""
        if path is None:
            return None
        rec = self.record(figures, results, **kw)
        Path(path).write_text(json.dumps(rec, indent=1, default=float) + "\n")
        return rec


def start(benchmark: str, section: str = "scripts", argv: list[str] | None = None) -> Recorder:
    return Recorder(benchmark, section, argv)


def add_option(parser) -> None:
    """The ``--json PATH`` option every benchmark script takes."""
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the results as a JSON record here")
