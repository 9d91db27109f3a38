"""verl 0.9.1 on a machine without CUDA: a CPU platform for verl's platform registry, loaded as a plugin.

Design: verl reaches the accelerator only through its platform object (``verl.plugin.platform``:
device name, the ``torch.<device>`` namespace, the collective backend, Ray's resource name) and
the engine registry. Importing this module (the first entry of ``VERL_USE_EXTERNAL_MODULES`` in CPU
mode, before ``runners.backends.verl.cpu.hf_rollout`` and the trustbench plugins) does, in every process
that imports verl, and only where ``torch.cuda.is_available()`` is False:

- registers ``CPUPlatform`` as platform ``cpu`` and makes it the current one (``VERL_PLATFORM=cpu``
  is set too, so processes that resolve the platform later pick it as well). Its ``current_device``
  is ``torch.device("cpu")`` (verl hands ``get_device_id()`` to ``.to()``), its device namespace
  ``CPU_DEVICE`` answers what verl asks of ``torch.cuda`` (memory figures from the process's RSS,
  the CPU generator as the device RNG, no-op streams and caches), its collectives are gloo's, and
  its Ray resource stays ``GPU``: verl's resource pools hard-code GPU bundles, so Ray is started
  with logical GPUs (one per training process, ``ray_init.num_gpus``);
- registers verl's FSDP engines (LM head and value head) for device ``cpu`` as well
  (``transformer_impl`` registers them for cuda and npu only). FSDP2 runs on CPU; FSDP1 does not
  (``sync_module_states`` needs GPU parameters), so the translation selects ``fsdp2``;
- wraps ``verl.utils.distributed.initialize_global_process_group_ray`` so that the backend string
  verl builds (``"cpu:gloo,cpu:gloo"``, which torch rejects) becomes ``"cpu:gloo"``;
- loads the critic (``verl.utils.model.load_valuehead_model``, which hard-codes FlashAttention 2)
  with SDPA attention (``load_value_model``).

On a CUDA machine the import does nothing but log that it stayed inactive, so a stray module list
never turns a GPU node into a CPU one. The translation only lists this module in CPU mode
(``runners.backends.verl.cpu.mode``).

    VERL_USE_EXTERNAL_MODULES=runners.backends.verl.cpu.platform,runners.backends.verl.cpu.hf_rollout,\\
runners.backends.verl.plugins.register python -m verl.trainer.main_ppo trainer.device=cpu ...

Tests: ``pytest tests/verl/test_cpu_mode.py`` (the platform in-process) and the ``verl_cpu``
stage (``pytest -m verl_cpu tests/verl``: real verl iterations).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import resource
from types import SimpleNamespace
from typing import Any

import torch
from verl.plugin.platform import PlatformBase

logger = logging.getLogger(__name__)

PLATFORM_NAME = "cpu"
PLATFORM_ENV = "VERL_PLATFORM"
# the collective backend torch accepts for a CPU-only process group
CPU_PROCESS_GROUP_BACKEND = "cpu:gloo"


# -- the torch.<device> stand-in -------------------------------------------------------------------
def _rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _peak_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def _mem_get_info() -> tuple[int, int]:
    import psutil

    memory = psutil.virtual_memory()
    return int(memory.available), int(memory.total)


def _nothing(*_args: Any, **_kwargs: Any) -> None:
    return None


def build_cpu_device_module() -> SimpleNamespace:
    """What verl calls on ``get_torch_device()`` (its ``torch.cuda``), answered for the CPU.

    Memory "allocated" is the process's resident set, "max" its peak (``ru_maxrss``): the figures
    verl logs as ``perf/max_memory_allocated_gb`` then mean the training process's memory.
    """
    return SimpleNamespace(
        __name__="trustbench_cpu_device",
        is_available=lambda: True,
        is_initialized=lambda: True,
        device_count=lambda: 1,
        current_device=lambda: 0,
        set_device=_nothing,
        synchronize=_nothing,
        empty_cache=_nothing,
        ipc_collect=_nothing,
        reset_peak_memory_stats=_nothing,
        set_per_process_memory_fraction=_nothing,
        memory_allocated=lambda *a, **k: _rss_bytes(),
        memory_reserved=lambda *a, **k: _rss_bytes(),
        max_memory_allocated=lambda *a, **k: _peak_rss_bytes(),
        max_memory_reserved=lambda *a, **k: _peak_rss_bytes(),
        mem_get_info=lambda *a, **k: _mem_get_info(),
        get_device_name=lambda *a, **k: "CPU",
        get_device_capability=lambda *a, **k: (None, None),
        manual_seed=torch.manual_seed,
        manual_seed_all=torch.manual_seed,
        get_rng_state=lambda *a, **k: torch.get_rng_state(),
        set_rng_state=lambda state, *a, **k: torch.set_rng_state(state),
        current_stream=torch.cpu.current_stream,
        stream=torch.cpu.stream,
        Stream=torch.cpu.Stream,
        Event=torch.cpu.Event,
        memory=SimpleNamespace(_set_allocator_settings=_nothing),
    )


CPU_DEVICE = build_cpu_device_module()


# -- the platform ----------------------------------------------------------------------------------
class CPUPlatform(PlatformBase):
    """verl platform of a CUDA-less machine (module docstring)."""

    device_name = "cpu"
    vendor_name = "cpu"

    @property
    def device_module(self):
        return CPU_DEVICE

    def is_available(self) -> bool:
        return not torch.cuda.is_available()

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return self.is_available()

    def current_device(self):  # verl passes it to .to(): a torch.device, not an index
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"  # verl's resource pools ask Ray for GPU bundles: logical GPUs stand in

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self):
        return None


# -- activation ------------------------------------------------------------------------------------
def _cpu_process_group(original):
    @functools.wraps(original)
    def initialize(timeout_second=None, backend=None):
        if backend is None or str(backend).replace(" ", "") in ("cpu:gloo,cpu:gloo", "gloo,gloo"):
            backend = CPU_PROCESS_GROUP_BACKEND
        return original(timeout_second=timeout_second, backend=backend)

    initialize.__trustbench_cpu__ = True
    return initialize


def _patch_process_group() -> None:
    """verl's process-group helper with a backend string torch accepts (in every module that bound it)."""
    import sys

    import verl.utils.distributed as distributed

    original = distributed.initialize_global_process_group_ray
    if getattr(original, "__trustbench_cpu__", False):
        return
    patched = _cpu_process_group(original)
    distributed.initialize_global_process_group_ray = patched
    for name in ("verl.workers.engine_workers", "verl.checkpoint_engine.base"):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "initialize_global_process_group_ray", None) is original:
            module.initialize_global_process_group_ray = patched


def _register_engines() -> None:
    """verl's FSDP engines (LM head, value head) for device ``cpu`` too."""
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    for model_type, engine in (("language_model", FSDPEngineWithLMHead), ("value_model", FSDPEngineWithValueHead)):
        for backend in ("fsdp", "fsdp2"):
            if EngineRegistry._engines.get(model_type, {}).get(backend, {}).get(PLATFORM_NAME) is None:
                EngineRegistry.register(model_type=model_type, backend=backend, device=PLATFORM_NAME)(engine)


def load_value_model(local_path, torch_dtype, model_config, trust_remote_code=False):
    """The critic: ``AutoModelForTokenClassification`` with one label and SDPA attention.

    verl's ``load_valuehead_model`` asks transformers for FlashAttention 2, which has no CPU kernels.
    """
    from transformers import AutoModelForTokenClassification

    return AutoModelForTokenClassification.from_pretrained(
        local_path,
        torch_dtype=torch_dtype,
        config=model_config,
        attn_implementation="sdpa",
        trust_remote_code=trust_remote_code,
    )


def _patch_value_model_loader() -> None:
    """verl's value-head engine imports ``load_valuehead_model`` from ``verl.utils.model`` when it
    builds the critic, so replacing the module attribute reaches it."""
    import verl.utils.model as model_utils

    model_utils.load_valuehead_model = load_value_model


ACTIVE = False


def activate() -> bool:
    """Make the CPU platform verl's platform in this process; False (nothing changed) where CUDA exists."""
    global ACTIVE
    if ACTIVE:
        return True
    if torch.cuda.is_available():
        logger.warning("trustbench CPU platform not activated: this process sees CUDA devices")
        return False
    from verl.plugin.platform import PlatformRegistry, get_platform, set_platform

    cls = PlatformRegistry.register(platform=PLATFORM_NAME)(CPUPlatform)
    os.environ[PLATFORM_ENV] = PLATFORM_NAME
    import verl.plugin.platform.platform_manager as manager

    current = manager._current_platform
    if current is None or current.device_name != PLATFORM_NAME:
        if current is not None:
            logger.info("replacing verl platform %s with the CPU platform", current.device_name)
        set_platform(cls())
    assert get_platform().device_name == PLATFORM_NAME
    _patch_process_group()
    _patch_value_model_loader()
    _register_engines()
    ACTIVE = True
    return True


activate()

__all__ = [
    "ACTIVE",
    "CPU_DEVICE",
    "CPUPlatform",
    "CPU_PROCESS_GROUP_BACKEND",
    "PLATFORM_NAME",
    "activate",
    "build_cpu_device_module",
]
