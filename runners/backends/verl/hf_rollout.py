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

Supported sampling parameters: temperature, top_p, top_k = -1 (off), repetition_penalty = 1,
max_tokens. Anything else is refused with a message naming the parameter. Loaded as a plugin in CPU
mode (``VERL_USE_EXTERNAL_MODULES``, after ``cpu_platform``); nothing here needs a CPU, so the
rollout also works on a GPU node, where it is slower than vLLM and never selected by the translation.

    +actor_rollout_ref.rollout.name=trustbench_hf   (set by runners.backends.verl.cpu_mode)

Tests: ``pytest tests/verl/test_hf_rollout.py``; the ``verl_cpu`` stage runs it inside verl.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from typing import Any

import ray
import torch

logger = logging.getLogger(__name__)

ROLLOUT_NAME = "trustbench_hf"
ROLLOUT_MODE = "async"
ADAPTER_TARGET = "runners.backends.verl.hf_rollout.HFServerAdapter"
# requests arriving within this window are sampled together
BATCH_WINDOW_S = 0.02


def server_name(replica_rank: int, suffix: str = "") -> str:
    """Ray actor name of a replica's generation server (the adapter finds it by this name)."""
    return f"{ROLLOUT_NAME}_server_{replica_rank}{suffix}"


def _model_path(model_config: Any) -> str:
    for key in ("local_path", "path"):
        value = model_config.get(key, None) if hasattr(model_config, "get") else getattr(model_config, key, None)
        if value:
            return str(value)
    raise ValueError("actor_rollout_ref.model.path is not set")


def _get(config: Any, key: str, default: Any = None) -> Any:
    value = config.get(key, default) if hasattr(config, "get") else getattr(config, key, default)
    return default if value is None else value


def check_sampling_params(params: dict[str, Any]) -> None:
    """Refuse what the Hugging Face sampler does not do, naming the parameter."""
    top_k = _get(params, "top_k", -1)
    if top_k not in (-1, 0) and top_k is not None:
        raise ValueError(f"rollout {ROLLOUT_NAME}: top_k={top_k} is not supported (use -1)")
    penalty = float(_get(params, "repetition_penalty", 1.0))
    if penalty != 1.0:
        raise ValueError(f"rollout {ROLLOUT_NAME}: repetition_penalty={penalty} is not supported (use 1.0)")
    for key in ("n", "best_of", "presence_penalty", "frequency_penalty", "stop", "stop_token_ids"):
        if params.get(key) not in (None, 1, 0, 0.0, [], ()):
            raise ValueError(f"rollout {ROLLOUT_NAME}: sampling parameter {key}={params[key]!r} is not supported")


class HFGenerationServer:
    """One replica's generation server: the model, a request queue and the weight-sync endpoint."""

    def __init__(self, config: Any, model_config: Any, replica_rank: int = 0) -> None:
        from runners.models.loader import load_pretrained_dir

        self.replica_rank = replica_rank
        self.prompt_length = int(_get(config, "prompt_length", 512))
        self.response_length = int(_get(config, "response_length", 512))
        self.max_model_len = int(_get(config, "max_model_len", 0) or self.prompt_length + self.response_length)
        dtype = str(_get(config, "dtype", "float32"))
        self.model, self.tokenizer = load_pretrained_dir(_model_path(model_config), dtype=dtype)
        self.eos_ids = self._eos_ids()
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_ids[0]
        from runners.models.sampler import make_generator

        device = next(self.model.parameters()).device
        self.generator = make_generator(device, int(_get(config, "seed", 0)) + 1009 * replica_rank)
        self.global_steps: int | None = None
        self.pending: list[tuple[list[int], dict[str, Any], asyncio.Future]] = []
        self.worker: asyncio.Task | None = None
        self.last_sync: dict[str, Any] = {}
        self.stats = {"requests": 0, "batches": 0, "tokens": 0, "seconds": 0.0}

    def _eos_ids(self) -> list[int]:
        ids: list[int] = []
        for source in (getattr(self.model, "generation_config", None), self.model.config, self.tokenizer):
            value = getattr(source, "eos_token_id", None)
            for item in [value] if isinstance(value, int) else list(value or []):
                if item is not None and int(item) not in ids:
                    ids.append(int(item))
        if not ids:
            raise ValueError(f"rollout {ROLLOUT_NAME}: the model directory names no EOS token")
        return ids

    def ready(self) -> dict[str, Any]:
        return {"parameters": sum(p.numel() for p in self.model.parameters()), "eos": self.eos_ids}

    # -- generation ---------------------------------------------------------------------------------
    def _max_tokens(self, prompt_ids: list[int], params: dict[str, Any]) -> int:
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            raise ValueError(
                f"prompt of {len(prompt_ids)} tokens leaves no room within max_model_len={self.max_model_len}"
            )
        wanted = params.pop("max_tokens", params.pop("max_new_tokens", None))
        if wanted is None:
            wanted = min(self.response_length, self.prompt_length + self.response_length - len(prompt_ids))
        return max(1, min(int(wanted), room))

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        audio_data: Any = None,
        **_: Any,
    ):
        """verl's token-in/token-out call: one response to ``prompt_ids`` (batched with concurrent calls)."""
        if image_data is not None or video_data is not None or audio_data is not None:
            raise ValueError(f"rollout {ROLLOUT_NAME} generates text only")
        params = dict(sampling_params)
        check_sampling_params(params)
        ids = [int(t) for t in prompt_ids]
        params["max_tokens"] = self._max_tokens(ids, params)
        future = asyncio.get_running_loop().create_future()
        self.pending.append((ids, params, future))
        if self.worker is None or self.worker.done():
            self.worker = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        await asyncio.sleep(BATCH_WINDOW_S)
        while self.pending:
            batch, self.pending = self.pending, []
            groups: dict[tuple, list] = {}
            for item in batch:
                p = item[1]
                key = (float(_get(p, "temperature", 1.0)), float(_get(p, "top_p", 1.0)), bool(p.get("logprobs")))
                groups.setdefault(key, []).append(item)
            for (temperature, top_p, _), items in groups.items():
                try:
                    outputs = await asyncio.to_thread(self._sample, items, temperature, top_p)
                except Exception as err:  # noqa: BLE001 - every waiting request gets the error
                    for _, _, future in items:
                        if not future.done():
                            future.set_exception(err)
                    continue
                for (_, _, future), output in zip(items, outputs):
                    if not future.done():
                        future.set_result(output)

    def _sample(self, items: list, temperature: float, top_p: float) -> list:
        from verl.workers.rollout.replica import TokenOutput

        from runners.models.sampler import generate, left_pad

        started = time.perf_counter()
        input_ids, attention_mask = left_pad([ids for ids, _, _ in items], pad_token_id=self.pad_id)
        budget = max(params["max_tokens"] for _, params, _ in items)
        with torch.no_grad():
            out = generate(
                self.model,
                input_ids,
                attention_mask,
                max_new_tokens=budget,
                temperature=temperature,
                top_p=top_p,
                eos_token_id=self.eos_ids,
                pad_token_id=self.pad_id,
                generator=self.generator,
            )
        results = []
        for row, (_, params, _) in enumerate(items):
            length = min(int(out.response_mask[row].sum()), int(params["max_tokens"]))
            tokens = out.responses[row, :length].tolist()
            logps = out.logp[row, :length].tolist() if params.get("logprobs") else None
            self.stats["tokens"] += length
            results.append(
                TokenOutput(
                    token_ids=tokens,
                    log_probs=logps,
                    stop_reason="completed",
                    extra_fields={"global_steps": self.global_steps},
                )
            )
        self.stats["requests"] += len(items)
        self.stats["batches"] += 1
        self.stats["seconds"] += time.perf_counter() - started
        return results

    # -- weights --------------------------------------------------------------------------------------
    def update_weights(self, state: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Load the trained weights (Hugging Face names); every model parameter must be among them."""
        own = self.model.state_dict()
        unknown = sorted(set(state) - set(own))
        if unknown:
            raise KeyError(f"rollout {ROLLOUT_NAME}: weights not in the model: {unknown[:5]}")
        missing = [name for name, _ in self.model.named_parameters() if name not in state]
        if missing:
            raise KeyError(f"rollout {ROLLOUT_NAME}: the weight sync did not send {missing[:5]}")
        changed = sum(int(not torch.equal(own[name], tensor.to(own[name].dtype))) for name, tensor in state.items())
        self.model.load_state_dict(state, strict=False)
        self.last_sync = {"tensors": len(state), "changed": changed, "global_steps": self.global_steps}
        return self.last_sync

    def get_last_sync(self) -> dict[str, Any]:
        return dict(self.last_sync)

    def get_stats(self) -> dict[str, Any]:
        return dict(self.stats)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The server's current weights (tests compare them with the trainer's)."""
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    # -- the lifecycle calls verl makes on every server: nothing to free on CPU ---------------------
    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    async def wake_up(self, tags: list[str] | None = None) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def wait_for_requests_to_drain(self) -> None:
        while self.pending or (self.worker is not None and not self.worker.done()):
            await asyncio.sleep(0.01)

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict:
        await self.wait_for_requests_to_drain()  # requests are short: finish them instead of aborting
        return {"aborted_count": 0, "request_ids": []}

    async def abort_request(self, request_id: str, reset_prefix_cache: bool = True) -> dict:
        return {"aborted": False, "request_id": request_id}

    async def resume_generation(self) -> None:
        return None

    async def resume_engine_generation(self) -> None:
        return None

    async def open_submission_gate(self) -> None:
        return None

    async def start_profile(self, **kwargs: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None


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
    "check_sampling_params",
    "register",
    "server_name",
]
