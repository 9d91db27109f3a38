"""trustbench cell config -> the exact ``python -m verl.trainer.main_ppo`` overrides (verl 0.9.1).

Design: translation is a pure function of the composed config and the run's paths (no verl, torch
or filesystem access), so it can be tested on CPU against verl's own config: compose verl's
``ppo_trainer.yaml`` with these overrides and build verl's config dataclasses (tests/verl/
test_translate.py). Every trustbench setting either maps onto a verl key whose semantics match
*exactly*, onto a ``trustbench_*`` plugin (``runners.backends.verl.plugins.register``, which calls the same
``runners.algorithms`` functions as the built-in trainer), or raises ``ConfigError`` naming the
key verl cannot express. The method's part (estimator, objective, mask, entropy control,
aggregation, KL) is ``method_overrides``; the data, model, batch sizes, optimiser, rollout and trainer
settings are ``run_overrides``; this module checks the backend's options and the model, merges the parts
and writes them in Hydra's grammar (``hydra_overrides``):

==========================  ===========================================================================
trustbench                  verl
==========================  ===========================================================================
trainer.warmup_steps        cosine schedule with ``num_cycles=0`` and 1-indexed steps: min(1, (s+1)/w),
                            the built-in trainer's linear warm-up (verl's constant schedule gives lr 0
                            at step 0)
trainer.micro_batch_size    ``ppo_micro_batch_size_per_gpu`` (else dynamic batches by token budget)
a critic (GAE, EGAE)        ``critic.*``: the policy's model, its optimiser, ``cliprange_value``
==========================  ===========================================================================

Not expressible in verl 0.9.1 (``ConfigError`` naming the key): truncated rollouts
(``rollout.mode=truncated``, T-PPO: verl generates whole responses), asymmetric value clipping
(``trainer.value_clip_low != value_clip_high``: verl's ``critic.cliprange_value`` is symmetric),
``trainer.logprob_precision=bf16``, model kinds without a Hugging Face directory, batch sizes that do
not split over the GPUs. verl's rollout-correction rejection masks (``rollout_rs``) are NOT used for
TRM: they shrink the response mask (changing the token-mean denominator, which TRM's eq. 50 forbids)
and compare pi_old, not pi_theta, with the rollout policy.

    from runners.config import compose
    from runners.backends.verl.layout import VerlPaths
    from runners.backends.verl.translate import build_overrides
    cfg, _ = compose(["backend=verl", "model=qwen3_1.7b", "algorithm=gspo"])
    print("\\n".join(build_overrides(cfg, VerlPaths.under("/tmp/run"))))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from runners.algorithms.method import Method
from runners.backends.verl import EXTERNAL_MODULES_ENV, PLUGIN_MODULE, TRAINER_MODE
from runners.backends.verl.cpu.mode import CPUPlacement, apply_cpu_mode
from runners.backends.verl.hydra import format_override, merge_overrides
from runners.backends.verl.layout import VerlPaths
from runners.backends.verl.plugins.monitor import MONITOR_KEY, monitor_settings
from runners.backends.verl.translate.method import algorithm_overrides
from runners.backends.verl.translate.run import (
    batch_overrides,
    check,
    data_overrides,
    model_overrides,
    optimizer_overrides,
    rollout_overrides,
    trainer_overrides,
)
from runners.config.resources import cell_resources
from runners.config.validate import ConfigError

ENTRYPOINT = "verl.trainer.main_ppo"
# CPU mode's entry point: verl's main with its TaskRunner in the driver process
CPU_ENTRYPOINT = "runners.backends.verl.cpu.driver_entry"
OPTION_KEYS = {
    "entrypoint",
    "rollout_engine",
    "metrics_via",
    "keep_checkpoints",
    "stop_timeout_s",
    "profiles",
    "ray_env",
    "overrides",
}
# seconds verl gets to checkpoint and exit after a stop request where backend.options has no stop_timeout_s
# (conf/backend/verl.yaml sets the same value; tests/verl/test_translate.py checks they agree)
STOP_TIMEOUT_S = 900
# auto: vllm on GPUs, the Hugging Face sampler (hf, verl rollout trustbench_hf) in CPU mode
ROLLOUT_ENGINES = ("auto", "vllm", "sglang", "hf")
PROFILE_KEYS = {
    "max_params_b",
    "tensor_model_parallel_size",
    "gpu_memory_utilization",
    "param_offload",
    "optimizer_offload",
    "ref_param_offload",
    "gradient_checkpointing",
    "use_remove_padding",
    "max_token_len_per_gpu",
    "strategy",
}


# -- options -----------------------------------------------------------------------------------
def backend_options(cfg: DictConfig) -> dict[str, Any]:
    """``backend.options`` as plain containers, unknown keys rejected, ``stop_timeout_s`` always set."""
    options = OmegaConf.to_container(cfg.backend.options, resolve=True) or {}
    options.setdefault("stop_timeout_s", STOP_TIMEOUT_S)
    unknown = sorted(set(options) - OPTION_KEYS)
    if unknown:
        raise ConfigError(
            f"backend.options.{unknown[0]}", f"unknown verl option; valid: {', '.join(sorted(OPTION_KEYS))}"
        )
    if options.get("metrics_via", "tracker") not in ("tracker", "mlflow"):
        raise ConfigError("backend.options.metrics_via", f"must be tracker or mlflow (got {options['metrics_via']!r})")
    if options.get("rollout_engine", "auto") not in ROLLOUT_ENGINES:
        raise ConfigError(
            "backend.options.rollout_engine",
            f"must be one of {', '.join(ROLLOUT_ENGINES)} (got {options['rollout_engine']!r})",
        )
    return options


def size_profile(cfg: DictConfig, options: Mapping[str, Any]) -> dict[str, Any]:
    """The first ``backend.options.profiles`` row with ``max_params_b >= model.params_b``."""
    rows = options.get("profiles") or []
    params_b = float(cfg.model.params_b)
    for i, row in enumerate(rows):
        unknown = sorted(set(row) - PROFILE_KEYS)
        if unknown:
            raise ConfigError(
                f"backend.options.profiles.{i}.{unknown[0]}",
                f"unknown profile key; valid: {', '.join(sorted(PROFILE_KEYS))}",
            )
        if "max_params_b" not in row:
            raise ConfigError(f"backend.options.profiles.{i}.max_params_b", "every profile row needs max_params_b")
        if params_b <= float(row["max_params_b"]):
            return dict(row)
    return {}


def build_overrides(
    cfg: DictConfig,
    paths: VerlPaths,
    *,
    model_path: str | None = None,
    nnodes: int | None = None,
    gpus_per_node: int | None = None,
    resuming: bool = False,
    worker_env: Mapping[str, str] | None = None,
    cpu: CPUPlacement | None = None,
) -> list[str]:
    """The verl command-line overrides of cell ``cfg``, ``backend.options.overrides`` appended last.

    ``model_path`` defaults to ``model.path``; ``nnodes`` / ``gpus_per_node`` to the cell's resources
    (``runners.config.resources.cell_resources``; the backend passes the allocation it actually got).
    ``resuming``: a checkpoint exists, so the evaluation before the first step is not repeated.
    ``worker_env``: environment for every Ray worker (``ray_kwargs.ray_init.runtime_env.env_vars``),
    besides ``VERL_USE_EXTERNAL_MODULES`` (the plugins). ``cpu``: the cell runs in CPU mode
    (``cpu_mode``: one training process, the Hugging Face rollout, the project's exportable models
    accepted). Raises ``ConfigError`` naming the first key verl cannot express.
    """
    from runners.models.loader import MODEL_KINDS

    options = backend_options(cfg)
    kinds = ("hf_directory", "hf_export") if cpu is not None else ("hf_directory",)
    loadable = [k for k in MODEL_KINDS.names() if set(kinds) & MODEL_KINDS.entry(k).provides]
    check(
        bool(set(kinds) & MODEL_KINDS.entry(cfg.model.kind).provides),
        "model.kind",
        f"the verl backend needs a Hugging Face model directory (kinds {', '.join(loadable)}); "
        f"{cfg.model.kind!r} models run on the local backend"
        + ("" if cpu is not None else " or in the verl backend's CPU mode"),
    )
    path = model_path or cfg.model.path
    check(bool(path), "model.path", "the verl backend needs a model directory or hub id")
    resources = cell_resources(cfg)
    if cpu is not None:  # one training process on this machine
        nnodes, gpus_per_node = 1, 1
    nnodes = int(nnodes or resources["nodes"])
    gpus_per_node = int(gpus_per_node or resources["gpus_per_node"])
    check(gpus_per_node >= 1, "launcher.gpus_per_node", "the verl backend needs at least one GPU per node")
    method = Method.from_config(cfg)  # the cell's method, built once for every part below
    profile = size_profile(cfg, options)
    method_values, plugin_lines = algorithm_overrides(cfg, method)
    values: dict[str, Any] = {}
    values.update(data_overrides(cfg, paths))
    values.update(model_overrides(cfg, method, str(path), profile))
    values.update(method_values)
    values.update(batch_overrides(cfg, nnodes * gpus_per_node, profile))
    values.update(optimizer_overrides(cfg, method))
    values.update(rollout_overrides(cfg, options, profile, gpus_per_node))
    values.update(trainer_overrides(cfg, paths, options, nnodes, gpus_per_node, resuming=resuming))
    # the trustbench trainer (plugins' hooks, stop requests) for every method, and its diagnostics' settings
    values["trainer.v1.trainer_mode"] = TRAINER_MODE
    values[f"+trainer.v1.{MONITOR_KEY}"] = monitor_settings(cfg, method)
    env = {EXTERNAL_MODULES_ENV: PLUGIN_MODULE, **(worker_env or {})}
    env_prefix = "+ray_kwargs.ray_init.runtime_env.env_vars."
    for name, value in env.items():
        values[f"{env_prefix}{name}"] = str(value)
    if cpu is not None:
        values = apply_cpu_mode(
            cfg, values, cpu, critic=method.requires("critic"), plugin_module=PLUGIN_MODULE, env_prefix=env_prefix
        )
    overrides = [format_override(key, value) for key, value in values.items()] + plugin_lines
    return merge_overrides(overrides, [str(o) for o in options.get("overrides") or []])
