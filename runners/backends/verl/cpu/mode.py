"""CPU mode of the verl backend: where a verl cell runs, what it may be, and the verl settings it needs.

Design: a verl cell runs on CPU when ``backend.device=cpu``, or when ``backend.device=auto`` (the
default) and it runs on this machine (local launchers, no Slurm allocation with GPUs) and this
machine has no CUDA device. Then the backend

- loads the CPU platform and the Hugging Face rollout before the trustbench plugins
  (``VERL_USE_EXTERNAL_MODULES=cpu_platform,hf_rollout,plugins``: ``external_modules``),
- trains with one FSDP2 process in float32 (verl's FSDP1 needs GPU parameters; its default bf16
  mixed precision would make the CPU run a different computation from the built-in backend's),
  SDPA attention, no torch.compile, and samples with ``trustbench_hf`` (``hf_rollout``),
- starts Ray with logical GPUs for verl's GPU bundles (or joins the cluster at ``RAY_ADDRESS``,
  which then must have them: ``ray start --head --num-gpus 1 --num-cpus 8``) and keeps verl's
  helper processes to one each (agent loop, reward loop, data loader, TransferQueue storage),
- accepts the project's own models (``model=embedded``, ``model=tiny_*``): they are written as
  Hugging Face directories with a chat template and a separate tokenizer folder
  (``model_export``).

``check_placement`` runs in config validation (``trustbench run`` exits with status 2 before
anything starts) and refuses what cannot run where the cell is launched, naming the key: a model
too large for CPU training (``model.params_b`` above ``CPU_MAX_PARAMS_B``), a vLLM/SGLang rollout
without CUDA (``backend.options.rollout_engine``), ``backend.device=cuda`` on a machine without CUDA.

    trustbench verl overrides backend=verl backend.device=cpu   # the CPU overrides

Tests: ``pytest tests/verl/test_cpu_mode.py``; the ``verl_cpu`` stage runs cells end to end.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runners.config.schema import launched_here
from runners.config.validate import ConfigError
from runners.perf.hardware import slurm_allocation

# plugin modules of CPU mode, in import order (the platform before anything resolves it)
CPU_PLATFORM_MODULE = "runners.backends.verl.cpu.platform"
HF_ROLLOUT_MODULE = "runners.backends.verl.cpu.hf_rollout"
ROLLOUT_NAME = "trustbench_hf"
PLATFORM_ENV = "VERL_PLATFORM"
# the largest model trained in CPU mode (SmolLM2-135M fits; a step of a 0.5B model takes minutes)
CPU_MAX_PARAMS_B = 0.2
# the replay buffer's poll for finished rollouts (plugins_trainer; verl's 2 s would dominate a CPU step)
POLL_INTERVAL_KEY = "trustbench_poll_interval_s"
POLL_INTERVAL_S = 0.1
# logical CPUs Ray is started with (verl's bundles and helper actors; not a limit on threads)
RAY_LOGICAL_CPUS = 8
# rollout engines that need CUDA; "auto" picks vllm on GPUs and trustbench_hf on CPU
GPU_ROLLOUT_ENGINES = ("vllm", "sglang")


def external_modules(plugin_module: str) -> str:
    """``VERL_USE_EXTERNAL_MODULES`` of CPU mode: platform, rollout, then the trustbench plugins."""
    return ",".join((CPU_PLATFORM_MODULE, HF_ROLLOUT_MODULE, plugin_module))


def cuda_available() -> bool:
    """Whether this process sees a CUDA device (False where torch is missing)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - the verl backend needs torch anyway
        return False
    return bool(torch.cuda.is_available())


def _slurm_gpus(env: Mapping[str, str]) -> int | None:
    """GPUs of the Slurm allocation this process runs in (None outside one)."""
    allocation = slurm_allocation(env)
    return None if allocation is None else allocation[1]


def runs_on_cpu(cfg: Any, *, cuda: bool | None = None, env: Mapping[str, str] | None = None) -> bool:
    """Whether the verl cell ``cfg`` trains in CPU mode (module docstring).

    ``cuda``: whether this machine has CUDA (probed when None); ``env``: the environment (Slurm).
    """
    device = str(cfg.backend.device)
    if device in ("cpu", "cuda"):
        return device == "cpu"
    if not launched_here(cfg):
        return False  # a cluster cell runs on the cluster's GPU nodes
    gpus = _slurm_gpus(os.environ if env is None else env)
    if gpus is not None:
        return gpus == 0
    return not (cuda_available() if cuda is None else cuda)


def rollout_engine(cfg: Any, *, cpu: bool) -> str:
    """verl's ``rollout.name`` for the cell: ``backend.options.rollout_engine`` with ``auto`` resolved."""
    options = cfg.backend.options or {}
    engine = str(options.get("rollout_engine", "auto") or "auto")
    if engine == "auto":
        return ROLLOUT_NAME if cpu else "vllm"
    return ROLLOUT_NAME if engine == "hf" else engine


def check_placement(cfg: Any, *, cuda: bool | None = None, env: Mapping[str, str] | None = None) -> None:
    """Raise ``ConfigError`` naming the key when the verl cell cannot run where it is launched
    (registered for the verl backend in ``runners.backends.PLACEMENT_CHECKS``)."""
    here = launched_here(cfg)
    has_cuda = cuda_available() if cuda is None and here else bool(cuda)
    if str(cfg.backend.device) == "cuda" and here and not has_cuda:
        raise ConfigError(
            "backend.device", "is cuda but this machine has no CUDA device; use backend.device=auto (CPU mode) or cpu"
        )
    if not runs_on_cpu(cfg, cuda=has_cuda, env=env):
        return
    engine = rollout_engine(cfg, cpu=True)
    if engine in GPU_ROLLOUT_ENGINES:
        raise ConfigError(
            "backend.options.rollout_engine",
            f"{engine} needs CUDA, and this verl cell runs on CPU; use rollout_engine=auto or hf "
            "(the Hugging Face sampler), or run the cell on a GPU node",
        )
    params_b = float(cfg.model.params_b)
    if params_b > CPU_MAX_PARAMS_B:
        raise ConfigError(
            "model.params_b",
            f"model {cfg.model.name} has {params_b:g}B parameters; verl's CPU mode trains models of at most "
            f"{CPU_MAX_PARAMS_B:g}B (this machine has no CUDA device): run it on a GPU node "
            "(launcher=slurm) or pick a small model (model=embedded, tiny_qwen2, smollm2_135m)",
        )


@dataclass(frozen=True)
class CPUPlacement:
    """How a CPU-mode cell is launched: its Ray cluster (None: verl starts one) and its model files."""

    # address of a running Ray cluster to join (RAY_ADDRESS), or None
    ray_address: str | None = None
    # the exported model's tokenizer folder (project models), or None to use the model's own
    tokenizer_path: str | None = None
    # the prompt template for this cell (model_export.prompt_template); None: the translation's choice
    chat_template: str | None = None


def _fsdp_engine(prefix: str, dtype: str) -> dict[str, Any]:
    fp = "fp32" if dtype == "float32" else "bf16"
    return {
        f"{prefix}.strategy": "fsdp2",
        f"{prefix}.param_offload": False,
        f"{prefix}.optimizer_offload": False,
        f"{prefix}.use_torch_compile": False,
        f"+{prefix}.mixed_precision": {"param_dtype": fp, "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
    }


def cpu_overrides(cfg: Any, placement: CPUPlacement, *, critic: bool, processes: int = 1) -> dict[str, Any]:
    """verl keys of CPU mode, applied over the GPU translation (``translate.build_overrides``); ``critic``:
    the method trains a critic."""
    dtype = str(cfg.model.dtype)
    ar = "actor_rollout_ref"
    out: dict[str, Any] = {
        "trainer.device": "cpu",
        "trainer.nnodes": 1,
        "trainer.n_gpus_per_node": processes,
        f"{ar}.actor.strategy": "fsdp2",
        f"{ar}.actor.use_torch_compile": False,
        f"{ar}.model.enable_gradient_checkpointing": False,
        f"{ar}.model.use_remove_padding": False,
        f"+{ar}.model.override_config.attn_implementation": "sdpa",
        **_fsdp_engine(f"{ar}.actor.fsdp_config", dtype),
        **_fsdp_engine(f"{ar}.ref.fsdp_config", dtype),
        f"{ar}.ref.fsdp_config.param_offload": False,
        f"{ar}.rollout.name": rollout_engine(cfg, cpu=True),
        f"{ar}.rollout.dtype": dtype if str(cfg.rollout.get("dtype", "auto")) == "auto" else str(cfg.rollout.dtype),
        f"{ar}.rollout.agent.num_workers": 1,
        "reward.num_workers": 1,
        "data.dataloader_num_workers": 0,
        "transfer_queue.backend.SimpleStorage.num_data_storage_units": 1,
        f"+trainer.v1.{POLL_INTERVAL_KEY}": POLL_INTERVAL_S,
    }
    if critic:
        out.update(
            {
                "critic.strategy": "fsdp2",
                "critic.model.enable_gradient_checkpointing": False,
                "critic.model.use_remove_padding": False,
                "+critic.model.override_config.attn_implementation": "sdpa",
                **_fsdp_engine("critic.fsdp", dtype),
            }
        )
    if placement.tokenizer_path:
        out[f"{ar}.model.tokenizer_path"] = placement.tokenizer_path
        if critic:
            out["critic.model.tokenizer_path"] = placement.tokenizer_path
    if placement.ray_address is None:
        out["ray_kwargs.ray_init.num_cpus"] = RAY_LOGICAL_CPUS
        out["+ray_kwargs.ray_init.num_gpus"] = processes
        out["+ray_kwargs.ray_init.include_dashboard"] = False
    return out


def apply_cpu_mode(
    cfg: Any,
    values: dict[str, Any],
    placement: CPUPlacement,
    *,
    critic: bool,
    plugin_module: str,
    env_prefix: str,
) -> dict[str, Any]:
    """``values`` (the GPU translation, key -> value) turned into the CPU-mode translation.

    The prompt template is the one ``model_export.prompt_template`` made from the model's tokenizer
    (when the placement carries one);
    the workers' ``VERL_USE_EXTERNAL_MODULES`` lists the CPU plugins and ``VERL_PLATFORM`` is set.
    """
    out = dict(values)
    if placement.chat_template is not None:  # the template that reproduces the built-in backend's prompts
        out["actor_rollout_ref.model.custom_chat_template"] = placement.chat_template
    out.update(cpu_overrides(cfg, placement, critic=critic))
    out[f"{env_prefix}VERL_USE_EXTERNAL_MODULES"] = external_modules(plugin_module)
    out[f"{env_prefix}{PLATFORM_ENV}"] = "cpu"
    return out


def launch_env_updates(plugin_module: str, *, force_cpu: bool) -> dict[str, str]:
    """Environment of the verl process in CPU mode (``force_cpu``: hide CUDA devices as well)."""
    env = {"VERL_USE_EXTERNAL_MODULES": external_modules(plugin_module), PLATFORM_ENV: "cpu"}
    if force_cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def exported_tokenizer_path(model_dir: str | os.PathLike) -> str | None:
    """The tokenizer folder of a model directory written by ``model_export`` (None for other directories)."""
    from runners.backends.verl.cpu.model_export import TOKENIZER_SUBDIR

    folder = Path(model_dir) / TOKENIZER_SUBDIR
    return str(folder) if folder.is_dir() else None


__all__ = [
    "CPUPlacement",
    "CPU_MAX_PARAMS_B",
    "ROLLOUT_NAME",
    "apply_cpu_mode",
    "check_placement",
    "cpu_overrides",
    "exported_tokenizer_path",
    "external_modules",
    "launch_env_updates",
    "rollout_engine",
    "runs_on_cpu",
]
