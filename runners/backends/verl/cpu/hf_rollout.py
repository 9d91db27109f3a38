"""A verl rollout that samples with the Hugging Face model on CPU: ``actor_rollout_ref.rollout.name=trustbench_hf``.

Design: verl 0.9.1 generates through rollout *servers* (vLLM, SGLang, TensorRT-LLM), none of which
runs on a CPU-only machine. This module plugs a server of its own into the same two registries,
so verl's agent loop, load balancer and weight sync run unchanged:

- ``HFRolloutReplica`` (``RolloutReplicaRegistry``, name ``trustbench_hf``) launches one Ray actor
  per replica, ``HFGenerationServer``, that loads the model directory with transformers and answers
  verl's token-in/token-out ``generate(prompt_ids, sampling_params, request_id)`` with a
  ``TokenOutput`` (token ids and their log-probs under the sampling distribution). Requests that
  arrive together (verl's agent loop sends one per response, concurrently) are sampled as one
  left-padded batch by ``runners.models.sampler.generate``, the sampler of the built-in backend
  (temperature, top-p; greedy at temperature 0); the sleep / wake-up / cache calls are no-ops.
- ``HFServerAdapter`` (``_ROLLOUT_REGISTRY[("trustbench_hf", "async")]``) is the rollout object
  inside verl's hybrid actor worker. At every weight sync verl hands it the trained weights
  (``engine.get_per_tensor_param()``, full tensors, Hugging Face names); it sends them to its
  replica's server, which loads them with ``load_state_dict`` and checks that every parameter of
  the model arrived (``last_sync`` reports what arrived and whether the weights changed).

The server and the sampling parameters it supports are in ``hf_server``. Loaded as a plugin in CPU
mode (``VERL_USE_EXTERNAL_MODULES``, after ``cpu_platform``); nothing here needs a CPU, so the
rollout also works on a GPU node, where it is slower than vLLM and never selected by the translation.

    +actor_rollout_ref.rollout.name=trustbench_hf   (set by runners.backends.verl.cpu.mode)

Tests: ``pytest tests/verl/test_cpu_mode.py``; the ``verl_cpu`` stage runs it inside verl.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

import ray
import torch

from runners.backends.verl.cpu.hf_server import HFGenerationServer
from runners.backends.verl.cpu.mode import ROLLOUT_NAME

logger = logging.getLogger(__name__)

ROLLOUT_MODE = "async"
ADAPTER_TARGET = "runners.backends.verl.cpu.hf_rollout.HFServerAdapter"


def server_name(replica_rank: int, suffix: str = "") -> str:
    """Ray actor name of a replica's generation server (the adapter finds it by this name)."""
    return f"{ROLLOUT_NAME}_server_{replica_rank}{suffix}"


def _replica_base():
    from verl.workers.rollout.replica import RolloutReplica

    return RolloutReplica


@functools.cache
def _make_replica_class():
    class HFRolloutReplica(_replica_base()):
        """A rollout replica served by ``HFGenerationServer`` (one Ray actor, no GPU)."""

        def rollout_worker_use_gpu(self) -> bool:
            return False

        async def launch_servers(self) -> None:
            suffix = self.name_suffix
            kind = "reward_" if self.is_reward_model else "teacher_" if self.is_teacher_model else ""
            name = server_name(self.replica_rank, f"{kind and '_' + kind.rstrip('_')}{suffix}")
            options: dict[str, Any] = {"name": name, "num_cpus": 0, "max_concurrency": self.max_concurrency}
            if self.workers:
                node_id = await self.workers[0].__ray_call__.remote(lambda w: ray.get_runtime_context().get_node_id())
                options["scheduling_strategy"] = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                    node_id=node_id, soft=True
                )
            server = (
                ray.remote(HFGenerationServer)
                .options(**options)
                .remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
            )
            info = await server.ready.remote()
            logger.info("%s ready: %s", name, info)
            self.servers = [server]
            self._server_handle = server
            self._server_address = name

    return HFRolloutReplica


def _adapter_base():
    from verl.workers.rollout.base import BaseRollout

    return BaseRollout


class HFServerAdapter(_adapter_base()):
    """The rollout object of verl's hybrid worker: forwards weight syncs to the replica's server."""

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1, **_: Any) -> None:
        super().__init__(config, model_config, device_mesh)
        per_replica = (
            int(self.config.tensor_model_parallel_size)
            * int(self.config.data_parallel_size)
            * int(self.config.pipeline_model_parallel_size)
        )
        rank = int(os.environ.get("RANK", 0))
        self.replica_rank = rank // per_replica if replica_rank == -1 else replica_rank
        self.rollout_rank = rank % per_replica
        self.server_handle = None

    @property
    def is_leader_rank(self) -> bool:
        return self.rollout_rank == 0

    def _server(self):
        if self.server_handle is None:
            self.server_handle = ray.get_actor(server_name(self.replica_rank))
        return self.server_handle

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None

    @torch.no_grad()
    async def update_weights(self, weights, global_steps: int | None = None, wire_format: str = "named_tensors", **_):
        """Collect the full tensors (every rank iterates: gathering them is collective) and send them once."""
        if wire_format != "named_tensors":
            raise ValueError(f"rollout {ROLLOUT_NAME} takes full named tensors (checkpoint_engine.backend=naive)")
        state: dict[str, torch.Tensor] = {}
        if hasattr(weights, "__aiter__"):
            async for name, tensor in weights:
                state[name] = _full_cpu(tensor)
        else:
            for name, tensor in weights:
                state[name] = _full_cpu(tensor)
        if self.rollout_rank != 0:
            return None
        server = self._server()
        if global_steps is not None:
            await server.set_global_steps.remote(global_steps)
        return await server.update_weights.remote(state)


def _full_cpu(tensor: torch.Tensor) -> torch.Tensor:
    if hasattr(tensor, "full_tensor"):
        tensor = tensor.full_tensor()
    return tensor.detach().to("cpu", copy=True)


def register() -> None:
    """Register the replica and the adapter under ``trustbench_hf`` (idempotent)."""
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    _ROLLOUT_REGISTRY[(ROLLOUT_NAME, ROLLOUT_MODE)] = ADAPTER_TARGET
    RolloutReplicaRegistry.register(ROLLOUT_NAME, _make_replica_class)


register()

__all__ = [
    "ADAPTER_TARGET",
    "HFGenerationServer",
    "HFServerAdapter",
    "ROLLOUT_NAME",
    "register",
    "server_name",
]
