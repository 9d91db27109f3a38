"""What a cell asks a cluster for, derived from its config (torch-free).

The GPU request follows from the model size and the backend unless ``launcher.*`` sets it: the
local backend uses at most one GPU; verl shards the model over more GPUs as it grows (full
fine-tuning needs about 16 bytes per parameter for weights, gradients and Adam states, plus
activations and the vLLM cache), using whole nodes of 8 GPUs past 8.

Whether a cluster can ever give a cell what it asks for is the cluster's side
(``runners.cluster.resources.check_request``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

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
