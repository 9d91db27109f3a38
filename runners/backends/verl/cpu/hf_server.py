"""The generation server of the ``trustbench_hf`` rollout (``hf_rollout``): one Ray actor per replica
that loads the model directory with transformers, samples verl's token-in/token-out requests in batches
with the built-in backend's sampler (``runners.models.sampler.generate``) and takes the trainer's weights.

Supported sampling parameters (``parse_sampling``): temperature, top_p, top_k = -1 (off),
repetition_penalty = 1, max_tokens (or max_new_tokens), logprobs. Anything else is refused with a message
naming the parameter.

Tests: ``pytest tests/verl/test_cpu_mode.py -k hf_server``; the ``verl_cpu`` stage runs it inside verl.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from runners.backends.verl.cpu.mode import ROLLOUT_NAME

# requests arriving within this window are sampled together
BATCH_WINDOW_S = 0.02
# sampling parameters the sampler has no use for: only their neutral values are accepted
NEUTRAL_ONLY = ("n", "best_of", "presence_penalty", "frequency_penalty", "stop", "stop_token_ids")


def _get(config: Any, key: str, default: Any = None) -> Any:
    """``config[key]`` of a mapping or an attribute of an object; ``default`` when missing or None."""
    value = config.get(key, default) if hasattr(config, "get") else getattr(config, key, default)
    return default if value is None else value


def _model_path(model_config: Any) -> str:
    for key in ("local_path", "path"):
        value = _get(model_config, key)
        if value:
            return str(value)
    raise ValueError("actor_rollout_ref.model.path is not set")


@dataclass(frozen=True)
class Sampling:
    """One request's sampling settings, as the sampler takes them. Requests with the same ``batch_key``
    are sampled as one batch; ``max_tokens`` is the request's own budget (None: the server's default)."""

    temperature: float
    top_p: float
    logprobs: bool
    max_tokens: int | None = None

    @property
    def batch_key(self) -> tuple[float, float, bool]:
        return (self.temperature, self.top_p, self.logprobs)


def parse_sampling(params: Mapping[str, Any]) -> Sampling:
    """verl's ``sampling_params`` as a ``Sampling``; refuses what the Hugging Face sampler does not do,
    naming the parameter."""
    top_k = _get(params, "top_k", -1)
    if top_k not in (-1, 0):
        raise ValueError(f"rollout {ROLLOUT_NAME}: top_k={top_k} is not supported (use -1)")
    penalty = float(_get(params, "repetition_penalty", 1.0))
    if penalty != 1.0:
        raise ValueError(f"rollout {ROLLOUT_NAME}: repetition_penalty={penalty} is not supported (use 1.0)")
    for key in NEUTRAL_ONLY:
        if params.get(key) not in (None, 1, 0, 0.0, [], ()):
            raise ValueError(f"rollout {ROLLOUT_NAME}: sampling parameter {key}={params[key]!r} is not supported")
    wanted = params.get("max_tokens", params.get("max_new_tokens"))
    return Sampling(
        temperature=float(_get(params, "temperature", 1.0)),
        top_p=float(_get(params, "top_p", 1.0)),
        logprobs=bool(params.get("logprobs")),
        max_tokens=None if wanted is None else int(wanted),
    )


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
        self.pending: list[tuple[list[int], Sampling, asyncio.Future]] = []
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
    def _max_tokens(self, prompt_ids: list[int], wanted: int | None) -> int:
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            raise ValueError(
                f"prompt of {len(prompt_ids)} tokens leaves no room within max_model_len={self.max_model_len}"
            )
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
        sampling = parse_sampling(sampling_params)
        ids = [int(t) for t in prompt_ids]
        sampling = replace(sampling, max_tokens=self._max_tokens(ids, sampling.max_tokens))
        future = asyncio.get_running_loop().create_future()
        self.pending.append((ids, sampling, future))
        if self.worker is None or self.worker.done():
            self.worker = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        await asyncio.sleep(BATCH_WINDOW_S)
        while self.pending:
            batch, self.pending = self.pending, []
            groups: dict[tuple, list] = {}
            for item in batch:
                groups.setdefault(item[1].batch_key, []).append(item)
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
        budget = max(sampling.max_tokens for _, sampling, _ in items)
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
        for row, (_, sampling, _) in enumerate(items):
            length = min(int(out.response_mask[row].sum()), sampling.max_tokens)
            tokens = out.responses[row, :length].tolist()
            logps = out.logp[row, :length].tolist() if sampling.logprobs else None
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


__all__ = ["BATCH_WINDOW_S", "HFGenerationServer", "Sampling", "parse_sampling"]
