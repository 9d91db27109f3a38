"""Whether the cluster can ever give a cell what it asks for, and the sbatch options of that request.

What a cell asks for follows from its config (``runners.config.resources.cell_resources``). Before a
sweep submits anything, ``check_request`` asks the cluster whether each distinct request can ever
run: ``scontrol show partition`` / ``scontrol show node`` give a readable reason naming the launcher
key (more GPUs per node than any node has, an unknown partition, a time over the partition's
MaxTime, ...), and ``sbatch --test-only`` (Slurm's own judgement, nothing queued) catches the rest
(accounts, QOS, reservations in ``launcher.additional_parameters``).
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from runners.config.errors import ConfigError
from runners.config.resources import RESOURCE_KEYS


# -- the cluster's limits ------------------------------------------------------------------------------
@dataclass
class Partition:
    name: str
    default: bool
    max_time_min: float  # math.inf when UNLIMITED
    nodes: list[str] = field(default_factory=list)


@dataclass
class Node:
    name: str
    cpus: int
    mem_mb: int
    gpus: int
    partitions: list[str]


def _records(text: str) -> list[dict[str, str]]:
    return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in text.splitlines() if line.strip()]


def _minutes(value: str) -> float:
    """Slurm time ``[days-]hours:minutes:seconds`` (or ``UNLIMITED``) in minutes."""
    if value in ("UNLIMITED", "INFINITE", ""):
        return math.inf
    days, _, rest = value.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    hours, minutes, seconds = parts[-3:]
    return (int(days or 0) * 24 + hours) * 60 + minutes + seconds / 60


def _gpus(gres: str) -> int:
    return sum(int(m) for m in re.findall(r"gpu(?::[^:,(]+)?:(\d+)", gres))


@dataclass
class Cluster:
    partitions: dict[str, Partition]
    nodes: dict[str, Node]

    @classmethod
    def query(cls) -> Cluster:
        """Partitions and nodes from ``scontrol`` (the login node's view)."""
        parts, nodes = {}, {}
        for rec in _records(_scontrol("partition")):
            names = _expand_hostlist(rec.get("Nodes", ""))
            parts[rec["PartitionName"]] = Partition(
                rec["PartitionName"], rec.get("Default") == "YES", _minutes(rec.get("MaxTime", "")), names
            )
        for rec in _records(_scontrol("node")):
            nodes[rec["NodeName"]] = Node(
                rec["NodeName"],
                int(rec.get("CPUTot", 0)),
                int(rec.get("RealMemory", 0)),
                _gpus(rec.get("Gres", "")),
                rec.get("Partitions", "").split(","),
            )
        return cls(parts, nodes)

    def partition(self, name: str | None) -> Partition | None:
        if name:
            return self.partitions.get(name)
        return next((p for p in self.partitions.values() if p.default), None)

    def why_not(self, res: Mapping[str, int], partition: str | None) -> tuple[str, str] | None:
        """(launcher key, reason) if no node set of the partition can ever hold ``res``; else None."""
        part = self.partition(partition)
        if part is None:
            if partition:
                known = ", ".join(f"{p.name}{' (default)' if p.default else ''}" for p in self.partitions.values())
                return "launcher.partition", f"{partition!r} is not a partition of this cluster; partitions: {known}"
            return "launcher.partition", "the cluster has no default partition: set launcher.partition"
        if res["time_min"] > part.max_time_min:
            return (
                "launcher.time_min",
                f"{res['time_min']} min is over partition {part.name!r}'s MaxTime of {part.max_time_min:g} min",
            )
        members = [self.nodes[n] for n in part.nodes if n in self.nodes]
        if res["nodes"] > len(members):
            return "launcher.nodes", f"{res['nodes']} nodes requested; partition {part.name!r} has {len(members)}"
        fitting = [
            n
            for n in members
            if n.gpus >= res["gpus_per_node"] and n.cpus >= res["cpus_per_task"] and n.mem_mb >= res["mem_gb"] * 1024
        ]
        if len(fitting) >= res["nodes"]:
            return None
        most = {k: max((getattr(n, k) for n in members), default=0) for k in ("gpus", "cpus", "mem_mb")}
        if res["gpus_per_node"] > most["gpus"]:
            return (
                "launcher.gpus_per_node",
                f"{res['gpus_per_node']} GPUs per node requested; nodes of partition {part.name!r} have at most {most['gpus']}",
            )
        if res["cpus_per_task"] > most["cpus"]:
            return "launcher.cpus_per_task", (
                f"{res['cpus_per_task']} CPUs per task requested (launcher.cpus_per_task, or launcher.cpus_per_gpu x GPUs); "
                f"nodes of partition {part.name!r} have at most {most['cpus']}"
            )
        if res["mem_gb"] * 1024 > most["mem_mb"]:
            return (
                "launcher.mem_gb",
                f"{res['mem_gb']} GB per node requested; nodes of partition {part.name!r} have at most {most['mem_mb'] // 1024} GB",
            )
        return (
            "launcher.nodes",
            f"fewer than {res['nodes']} nodes of partition {part.name!r} have {res['gpus_per_node']} GPUs, {res['cpus_per_task']} CPUs and {res['mem_gb']} GB each",
        )


def _scontrol(what: str) -> str:
    proc = subprocess.run(["scontrol", "show", what, "-o"], capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise ConfigError("launcher.name", f"slurm: scontrol show {what} failed: {proc.stderr.strip()}")
    return proc.stdout


def _expand_hostlist(hostlist: str) -> list[str]:
    if not hostlist or hostlist == "(null)":
        return []
    proc = subprocess.run(
        ["scontrol", "show", "hostnames", hostlist], capture_output=True, text=True, timeout=60, check=False
    )
    return proc.stdout.split() if proc.returncode == 0 else hostlist.split(",")


def sbatch_options(res: Mapping[str, int], launcher: Mapping[str, Any]) -> list[str]:
    """The sbatch options a cell's job will carry (the resource part of submitit's script)."""
    opts = [
        f"--nodes={res['nodes']}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={res['cpus_per_task']}",
        f"--mem={res['mem_gb']}GB",
        f"--time={res['time_min']}",
    ]
    if res["gpus_per_node"]:
        opts.append(f"--gpus-per-node={res['gpus_per_node']}")
    for key in ("partition", "account", "qos", "constraint"):
        if launcher.get(key):
            opts.append(f"--{key}={launcher[key]}")
    for key, value in (launcher.get("additional_parameters") or {}).items():
        flag = f"--{str(key).replace('_', '-')}"
        opts.append(flag if value is True else f"{flag}={value}")
    return opts


def check_request(res: Mapping[str, int], launcher: Mapping[str, Any], cluster: Cluster | None = None) -> None:
    """Raise ``ConfigError`` (naming the launcher key) if the cluster can never run ``res``."""
    if shutil.which("sbatch") is None:
        raise ConfigError("launcher.name", "launcher=slurm needs sbatch on PATH (run from a Slurm login node)")
    cluster = cluster or Cluster.query()
    request = " ".join(f"{k}={res[k]}" for k in RESOURCE_KEYS)
    problem = cluster.why_not(res, launcher.get("partition"))
    if problem is not None:
        key, reason = problem
        raise ConfigError(key, f"the cluster cannot run cells requesting {request}: {reason}")
    proc = subprocess.run(
        ["sbatch", "--test-only", *sbatch_options(res, launcher), "--wrap=true"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if proc.returncode != 0:
        message = (proc.stderr or proc.stdout).strip().splitlines()
        raise ConfigError(
            "launcher",
            f"sbatch --test-only refuses cells requesting {request}: {message[-1] if message else proc.returncode}",
        )
