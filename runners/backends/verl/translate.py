"""trustbench cell config -> the exact ``python -m verl.trainer.main_ppo`` overrides (verl 0.9.1).

Design: translation is a pure function of the composed config and the run's paths (no verl, torch
or filesystem access), so it can be tested on CPU against verl's own config: compose verl's
``ppo_trainer.yaml`` with these overrides and build verl's config dataclasses (tests/verl/
test_translate.py). Every trustbench setting either maps onto a verl key whose semantics match
*exactly*, onto a ``trustbench_*`` plugin (``runners.backends.verl.plugins``, which calls the same
``runners.algorithms`` functions as the built-in trainer), or raises ``ConfigError`` naming the
key verl cannot express. The method's part (estimator, objective, mask, entropy control,
aggregation, KL) is ``method_overrides``; this module adds data, model, batch sizes, optimiser,
rollout and trainer settings, and writes them in Hydra's grammar (``hydra_overrides``):

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
    from runners.backends.verl.translate import VerlPaths, build_overrides
    cfg, _ = compose(["backend=verl", "model=qwen3_1.7b", "algorithm=gspo"])
    print("\\n".join(build_overrides(cfg, VerlPaths.under("/tmp/run"))))
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from runners.algorithms.method import Method
from runners.backends.verl.cpu_mode import CPUPlacement, apply_cpu_mode, rollout_engine
from runners.backends.verl.hydra_overrides import format_override, merge_overrides
from runners.backends.verl.method_overrides import algorithm_overrides
from runners.backends.verl.monitor import MONITOR_KEY, monitor_settings
from runners.config import run_key
from runners.config.validate import ConfigError
from runners.resources import cell_resources

PLUGIN_MODULE = "runners.backends.verl.plugins"
ENTRYPOINT = "verl.trainer.main_ppo"
# gradient-norm clip that never binds (trainer.grad_clip = 0 means "off"; verl would clip to 0)
NO_GRAD_CLIP = 1e12
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
# plain prompt for base models, as runners.data.prompts.format_prompt without a chat template
PLAIN_CHAT_TEMPLATE = (
    "{% if bos_token %}{{ bos_token }}{% endif %}"
    "{% for m in messages %}{% if not loop.first %}\n\n{% endif %}{{ m['content'] }}{% endfor %}\n"
)


@dataclass(frozen=True)
class VerlPaths:
    """Where a cell's verl inputs and outputs live (all absolute)."""

    # parquet files written by runners.backends.verl.data
    train_files: str
    val_files: str
    # verl's checkpoint root (trainer.default_local_dir): global_step_N/ and latest_checkpointed_iteration.txt
    checkpoint_dir: str
    # file verl's "file" logger appends metrics to (VERL_FILE_LOGGER_PATH; also passed in the env)
    metrics_file: str
    # the reward entry (pkg://runners.backends.verl.data) and its function
    reward_path: str
    reward_name: str = "compute_score"

    @classmethod
    def under(cls, root: str | Path, attempt: int = 1) -> VerlPaths:
        from runners.backends.verl.data import REWARD_FUNCTION_NAME, REWARD_FUNCTION_PATH

        root = Path(root)
        return cls(
            train_files=str(root / "data" / "train.parquet"),
            val_files=str(root / "data" / "val.parquet"),
            checkpoint_dir=str(root / "checkpoints"),
            metrics_file=str(root / f"metrics.{attempt}.jsonl"),
            reward_path=str(REWARD_FUNCTION_PATH),
            reward_name=REWARD_FUNCTION_NAME,
        )


# -- options -----------------------------------------------------------------------------------
def backend_options(cfg: DictConfig) -> dict[str, Any]:
    """``backend.options`` as plain containers, unknown keys rejected."""
    options = OmegaConf.to_container(cfg.backend.options, resolve=True) or {}
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


# -- the run -------------------------------------------------------------------------------------
def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(key, message)


def batch_overrides(cfg: DictConfig, n_gpus: int, profile: Mapping[str, Any]) -> dict[str, Any]:
    """Batch sizes: prompts per step, mini-batch (in prompts, as verl counts), micro-batches per GPU."""
    t, r = cfg.trainer, cfg.rollout
    responses = int(t.prompts_per_step) * int(t.n)
    mini_responses = int(t.mini_batch_prompts) * int(t.n)
    _check(
        responses % n_gpus == 0,
        "trainer.prompts_per_step",
        f"prompts_per_step * n = {responses} responses must split evenly over {n_gpus} GPUs",
    )
    _check(
        mini_responses % n_gpus == 0,
        "trainer.mini_batch_prompts",
        f"mini_batch_prompts * n = {mini_responses} responses must split evenly over {n_gpus} GPUs",
    )
    actor, rollout, ref = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref"
    out: dict[str, Any] = {
        "data.train_batch_size": int(t.prompts_per_step),
        f"{actor}.ppo_mini_batch_size": int(t.mini_batch_prompts),
        f"{actor}.ppo_epochs": int(t.ppo_epochs),
        f"{actor}.shuffle": False,
    }
    if int(t.micro_batch_size) > 0:  # explicit gradient accumulation: responses per GPU forward
        per_gpu = mini_responses // n_gpus
        micro = min(int(t.micro_batch_size), per_gpu)
        _check(
            per_gpu % micro == 0,
            "trainer.micro_batch_size",
            f"must divide the {per_gpu} responses of a mini-batch per GPU ({n_gpus} GPUs)",
        )
        for key in (
            f"{actor}.ppo_micro_batch_size_per_gpu",
            f"{rollout}.log_prob_micro_batch_size_per_gpu",
            f"{ref}.log_prob_micro_batch_size_per_gpu",
            "critic.ppo_micro_batch_size_per_gpu",
        ):
            out[key] = micro
        out[f"{actor}.use_dynamic_bsz"] = False
    else:  # a whole mini-batch per step, split by token budget (same gradient: global normalisation)
        budget = max(
            int(profile.get("max_token_len_per_gpu", 16384)), int(r.max_prompt_length) + int(r.max_response_length)
        )
        out[f"{actor}.use_dynamic_bsz"] = True
        out[f"{actor}.ppo_max_token_len_per_gpu"] = budget
        out["critic.ppo_max_token_len_per_gpu"] = 2 * budget
    return out


def optimizer_overrides(cfg: DictConfig) -> dict[str, Any]:
    t = cfg.trainer
    clip = float(t.grad_clip) if float(t.grad_clip) > 0 else NO_GRAD_CLIP
    actor = "actor_rollout_ref.actor"
    warm = int(t.warmup_steps)
    out: dict[str, Any] = {
        f"{actor}.optim.lr": float(t.lr),
        f"{actor}.optim.weight_decay": float(t.weight_decay),
        f"{actor}.optim.betas": [float(t.adam_beta1), float(t.adam_beta2)],
        f"{actor}.optim.clip_grad": clip,
        f"{actor}.grad_clip": clip,
        f"{actor}.optim.lr_warmup_steps": warm,
        f"{actor}.optim.lr_warmup_steps_ratio": 0.0,
        # cosine with num_cycles=0 is constant after warm-up; 1-indexed steps give min(1, (s+1)/warm)
        f"{actor}.optim.lr_scheduler_type": "cosine" if warm > 0 else "constant",
        f"{actor}.optim.num_cycles": 0.0,
        f"{actor}.optim.min_lr_ratio": 0.0,
        f"{actor}.optim.zero_indexed_step": False,
    }
    if Method.from_config(cfg).requires("critic"):
        _check(
            math.isclose(float(t.value_clip_low), float(t.value_clip_high)),
            "trainer.value_clip_high",
            f"verl clips values symmetrically (critic.cliprange_value); got value_clip_low={t.value_clip_low} "
            f"and value_clip_high={t.value_clip_high} (set them equal)",
        )
        out.update(
            {
                "critic.optim.lr": float(t.critic_lr),
                "critic.optim.betas": [float(t.adam_beta1), float(t.adam_beta2)],
                "critic.optim.weight_decay": 0.01,
                "critic.optim.clip_grad": clip,
                "critic.grad_clip": clip,
                "critic.cliprange_value": float(t.value_clip_low),
                "critic.ppo_epochs": int(t.ppo_epochs),
            }
        )
    return out


def rollout_overrides(
    cfg: DictConfig, options: Mapping[str, Any], profile: Mapping[str, Any], gpus_per_node: int
) -> dict[str, Any]:
    r, t = cfg.rollout, cfg.trainer
    rollout = "actor_rollout_ref.rollout"
    tp = int(profile.get("tensor_model_parallel_size", 1))
    _check(
        tp >= 1 and gpus_per_node % tp == 0,
        "backend.options.profiles",
        f"tensor_model_parallel_size={tp} must divide the {gpus_per_node} GPUs per node",
    )
    return {
        "data.max_prompt_length": int(r.max_prompt_length),
        "data.max_response_length": int(r.max_response_length),
        "data.filter_overlong_prompts": True,
        f"{rollout}.name": rollout_engine(cfg, cpu=False),
        f"{rollout}.n": int(t.n),
        f"{rollout}.temperature": float(r.temperature),
        f"{rollout}.top_p": float(r.top_p),
        f"{rollout}.top_k": -1,
        f"{rollout}.do_sample": True,
        f"{rollout}.calculate_log_probs": True,
        f"{rollout}.tensor_model_parallel_size": tp,
        f"{rollout}.gpu_memory_utilization": float(profile.get("gpu_memory_utilization", 0.6)),
        f"{rollout}.val_kwargs.n": int(t.eval_n),
        f"{rollout}.val_kwargs.temperature": float(t.eval_temperature),
        f"{rollout}.val_kwargs.top_p": float(r.top_p),
        f"{rollout}.val_kwargs.top_k": -1,
        f"{rollout}.val_kwargs.do_sample": True,
    }


def model_overrides(cfg: DictConfig, model_path: str, profile: Mapping[str, Any]) -> dict[str, Any]:
    m = cfg.model
    offload = bool(profile.get("param_offload", False))
    out: dict[str, Any] = {
        "actor_rollout_ref.model.path": model_path,
        "actor_rollout_ref.model.enable_gradient_checkpointing": bool(profile.get("gradient_checkpointing", True)),
        "actor_rollout_ref.model.use_remove_padding": bool(profile.get("use_remove_padding", True)),
        "actor_rollout_ref.actor.strategy": str(profile.get("strategy", "fsdp")),
        "actor_rollout_ref.actor.fsdp_config.param_offload": offload,
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload": bool(profile.get("optimizer_offload", False)),
        "actor_rollout_ref.ref.fsdp_config.param_offload": bool(profile.get("ref_param_offload", True)),
        # the rollout engine's dtype: rollout.dtype, else bf16 unless the model trains in fp32
        "actor_rollout_ref.rollout.dtype": (
            str(cfg.rollout.dtype) if cfg.rollout.dtype != "auto" else "bfloat16" if m.dtype != "float32" else "float32"
        ),
    }
    if not m.chat_template:
        out["actor_rollout_ref.model.custom_chat_template"] = PLAIN_CHAT_TEMPLATE
    if Method.from_config(cfg).requires("critic"):  # the critic starts from the policy's weights
        out.update(
            {
                "critic.model.path": model_path,
                "critic.model.enable_gradient_checkpointing": bool(profile.get("gradient_checkpointing", True)),
                "critic.model.use_remove_padding": bool(profile.get("use_remove_padding", True)),
                "critic.strategy": str(profile.get("strategy", "fsdp")),
                "critic.fsdp.param_offload": offload,
                "critic.fsdp.optimizer_offload": bool(profile.get("optimizer_offload", False)),
            }
        )
    return out


def trainer_overrides(
    cfg: DictConfig, paths: VerlPaths, options: Mapping[str, Any], nnodes: int, gpus_per_node: int, *, resuming: bool
) -> dict[str, Any]:
    t = cfg.trainer
    total = int(t.total_steps)
    keep = int(options.get("keep_checkpoints", 2))
    _check(keep >= 1, "backend.options.keep_checkpoints", f"must be >= 1 (got {keep})")
    via = options.get("metrics_via", "tracker")
    return {
        "trainer.total_training_steps": total,
        # an upper bound: training stops at total_training_steps (each epoch has >= 1 step)
        "trainer.total_epochs": total,
        "trainer.project_name": str(cfg.experiment),
        "trainer.experiment_name": run_key(cfg),
        "trainer.logger": ["console", "file" if via == "tracker" else "mlflow"],
        "trainer.nnodes": int(nnodes),
        "trainer.n_gpus_per_node": int(gpus_per_node),
        "trainer.device": "cuda",
        "trainer.save_freq": int(t.checkpoint_every) if int(t.checkpoint_every) > 0 else total,
        "trainer.resume_mode": "auto",
        "trainer.default_local_dir": paths.checkpoint_dir,
        "trainer.max_actor_ckpt_to_keep": keep,
        "trainer.max_critic_ckpt_to_keep": keep,
        "trainer.test_freq": int(t.eval_every) if int(t.eval_every) > 0 else -1,
        # the evaluation "before the first step" happened in the attempt that started the run; verl's
        # MLflow logger (metrics_via: mlflow) re-logs the whole config, which must then not change
        "trainer.val_before_train": int(t.eval_every) > 0 and not (resuming and via == "tracker"),
        "trainer.log_val_generations": 0,
        "trainer.critic_warmup": 0,
        "trainer.balance_batch": True,
    }


def data_overrides(cfg: DictConfig, paths: VerlPaths) -> dict[str, Any]:
    seed = int(cfg.seed)
    return {
        "data.train_files": paths.train_files,
        "data.val_files": paths.val_files,
        "data.shuffle": True,
        "data.seed": seed,
        "actor_rollout_ref.actor.data_loader_seed": seed,
        "actor_rollout_ref.rollout.seed": seed,
        "actor_rollout_ref.actor.fsdp_config.seed": seed,
        "reward.custom_reward_function.path": paths.reward_path,
        "reward.custom_reward_function.name": paths.reward_name,
        "reward.reward_manager.name": "naive",
    }


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
    (``runners.resources.cell_resources``; the backend passes the allocation it actually got).
    ``resuming``: a checkpoint exists, so the evaluation before the first step is not repeated.
    ``worker_env``: environment for every Ray worker (``ray_kwargs.ray_init.runtime_env.env_vars``),
    besides ``VERL_USE_EXTERNAL_MODULES`` (the plugins). ``cpu``: the cell runs in CPU mode
    (``cpu_mode``: one training process, the Hugging Face rollout, the project's exportable models
    accepted). Raises ``ConfigError`` naming the first key verl cannot express.
    """
    from runners.backends.verl import EXTERNAL_MODULES_ENV, PLUGIN_MODULE, TRAINER_MODE
    from runners.models.loader import MODEL_KINDS

    options = backend_options(cfg)
    kinds = ("hf_directory", "hf_export") if cpu is not None else ("hf_directory",)
    loadable = [k for k in MODEL_KINDS.names() if set(kinds) & MODEL_KINDS.entry(k).provides]
    _check(
        bool(set(kinds) & MODEL_KINDS.entry(cfg.model.kind).provides),
        "model.kind",
        f"the verl backend needs a Hugging Face model directory (kinds {', '.join(loadable)}); "
        f"{cfg.model.kind!r} models run on the local backend"
        + ("" if cpu is not None else " or in the verl backend's CPU mode"),
    )
    path = model_path or cfg.model.path
    _check(bool(path), "model.path", "the verl backend needs a model directory or hub id")
    resources = cell_resources(cfg)
    if cpu is not None:  # one training process on this machine
        nnodes, gpus_per_node = 1, 1
    nnodes = int(nnodes or resources["nodes"])
    gpus_per_node = int(gpus_per_node or resources["gpus_per_node"])
    _check(gpus_per_node >= 1, "launcher.gpus_per_node", "the verl backend needs at least one GPU per node")
    profile = size_profile(cfg, options)
    method, plugin_lines = algorithm_overrides(cfg)
    values: dict[str, Any] = {}
    values.update(data_overrides(cfg, paths))
    values.update(model_overrides(cfg, str(path), profile))
    values.update(method)
    values.update(batch_overrides(cfg, nnodes * gpus_per_node, profile))
    values.update(optimizer_overrides(cfg))
    values.update(rollout_overrides(cfg, options, profile, gpus_per_node))
    values.update(trainer_overrides(cfg, paths, options, nnodes, gpus_per_node, resuming=resuming))
    # the trustbench trainer (plugins' hooks, stop requests) for every method, and its diagnostics' settings
    values["trainer.v1.trainer_mode"] = TRAINER_MODE
    values[f"+trainer.v1.{MONITOR_KEY}"] = monitor_settings(cfg)
    env = {EXTERNAL_MODULES_ENV: PLUGIN_MODULE, **(worker_env or {})}
    env_prefix = "+ray_kwargs.ray_init.runtime_env.env_vars."
    for name, value in env.items():
        values[f"{env_prefix}{name}"] = str(value)
    if cpu is not None:
        values = apply_cpu_mode(cfg, values, cpu, plugin_module=PLUGIN_MODULE, env_prefix=env_prefix)
    overrides = [format_override(key, value) for key, value in values.items()] + plugin_lines
    return merge_overrides(overrides, [str(o) for o in options.get("overrides") or []])
