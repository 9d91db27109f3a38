"""What a cell asks a cluster for, and whether the cluster can ever give it (torch-free).

The GPU request follows from the model size and the backend unless ``launcher.*`` sets it: the
local backend uses at most one GPU; verl shards the model over more GPUs as it grows (full
fine-tuning needs about 16 bytes per parameter for weights, gradients and Adam states, plus
activations and the vLLM cache), using whole nodes of 8 GPUs past 8.

Before a sweep submits anything, ``check_request`` asks the cluster whether each distinct request
can ever run: ``scontrol show partition`` / ``scontrol show node`` give a readable reason naming the
launcher key (more GPUs per node than any node has, an unknown partition, a time over the
partition's MaxTime, ...), and ``sbatch --test-only`` (Slurm's own judgement, nothing queued)
catches the rest (accounts, QOS, reservations in ``launcher.additional_parameters``).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from runners.config.errors import ConfigError
from runners.config.regime import ON_POLICY, regime_label

GPUS_PER_NODE_MAX = 8
# (max parameters in billions, GPUs) for the verl backend
VERL_GPU_TABLE = ((1.0, 1), (2.0, 2), (4.5, 4), (9.0, 8), (16.0, 16), (35.0, 32), (80.0, 64))
RESOURCE_KEYS = ("nodes", "gpus_per_node", "cpus_per_task", "mem_gb", "time_min")


def verl_gpus(params_b: float) -> int:
    for limit, gpus in VERL_GPU_TABLE:
        if params_b <= limit:
            return gpus
    return 128


def cell_resources(cfg: Any) -> dict[str, Any]:
    """Resources of one cell (a DictConfig or its resolved dict); explicit ``launcher.*`` values win."""
    launcher, backend, model = cfg["launcher"], cfg["backend"], cfg["model"]
    if backend["name"] == "verl":
        total = verl_gpus(float(model["params_b"]))
    elif launcher["name"] == "slurm":
        total = 1 if float(model["params_b"]) >= 0.1 else 0
    else:
        total = 0
    nodes = launcher["nodes"] or max(1, math.ceil(total / GPUS_PER_NODE_MAX))
    gpus_per_node = launcher["gpus_per_node"] if launcher["gpus_per_node"] is not None else math.ceil(total / nodes)
    if launcher["cpus_per_task"]:
        cpus = int(launcher["cpus_per_task"])
    else:
        cpus = max(2, gpus_per_node * int(launcher["cpus_per_gpu"]))
    mem = launcher["mem_gb"] if launcher["mem_gb"] is not None else max(8, 64 * gpus_per_node)
    return {
        "nodes": int(nodes),
        "gpus_per_node": int(gpus_per_node),
        "cpus_per_task": int(cpus),
        "mem_gb": int(mem),
        "time_min": int(launcher["time_min"]),
    }


def gpu_hours(resources: Mapping[str, int]) -> float:
    """Upper bound of one cell's GPU time: the time limit times its GPUs."""
    return resources["nodes"] * resources["gpus_per_node"] * resources["time_min"] / 60.0


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


# -- CPU time of the built-in trainer on the embedded default -------------------------------------------
# CPU seconds of one 1-thread cell, per part, measured on the 2-core reference machine (the first cells of
# sweeps/stability_map_cpu.yaml, 16 prompts x 8 responses per step, timing_cpu_s/* metrics): process start-up
# and model load; per step the fixed overhead, sampling per response, the old-log-prob pass per response
# (on-policy it comes from the update's forward and is nearly free), the update per response and epoch
# (timing_cpu_s/update_actor: 0.145 s for 128 responses x 1 epoch, 0.656 s for 128 x 4 epochs of 4
# mini-batches); each evaluation per sample (timing_s/testing: 0.53 s for 128 problems x 4 samples).
EMBEDDED_CPU_COST = {
    "startup": 8.0,
    "step": 0.05,
    "sample": 0.077 / 128,
    "old_pass": 0.062 / 128,
    "old_pass_on_policy": 0.021 / 128,
    "update": 0.15 / 128,
    "eval": 0.53 / 512,
}


def cpu_seconds(cfg: Any) -> float | None:
    """Estimated CPU seconds of one cell (a resolved config dict) on the built-in trainer with the embedded
    default (``EMBEDDED_CPU_COST``); None for other backends and models, whose cost was not measured."""
    model, trainer, backend = cfg["model"], cfg["trainer"], cfg["backend"]
    if backend["name"] != "local" or model["kind"] != "embedded":
        return None
    c = EMBEDDED_CPU_COST
    responses = int(trainer["prompts_per_step"]) * int(trainer["n"])
    epochs = int(trainer["ppo_epochs"])
    old = c["old_pass_on_policy"] if regime_label(cfg) == ON_POLICY else c["old_pass"]
    step = c["step"] + responses * (c["sample"] + old + c["update"] * epochs)
    steps = int(trainer["total_steps"])
    every = int(trainer.get("eval_every") or 0)
    evals = (steps // every + 1) if every > 0 else 0
    samples = int(cfg["dataset"].get("eval_limit") or 0) * int(trainer.get("eval_n") or 1)
    return c["startup"] + steps * step + evals * samples * c["eval"]


def cpu_estimate_text(configs: list[Any], parallel: int) -> str:
    """The dry run's line for the cells to run: estimated CPU hours and wall hours at ``parallel`` cells at a
    time ("" when no cell's cost is known)."""
    known = [s for s in (cpu_seconds(c) for c in configs) if s is not None]
    if not known:
        return ""
    total = sum(known)
    unknown = (
        f" ({len(configs) - len(known)} cell(s) of other models or backends not counted)"
        if len(known) < len(configs)
        else ""
    )
    wall = total / max(1, parallel)

    def hours(seconds: float) -> str:
        return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"

    return (
        f"estimated CPU time of the {len(known)} cell(s) to run: {hours(total)} of CPU, about {hours(wall)} at "
        f"{parallel} cell(s) at a time (built-in trainer on the embedded default, costs measured on 2 cores){unknown}"
    )
