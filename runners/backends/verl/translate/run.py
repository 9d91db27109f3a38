"""The verl overrides of a cell's run settings: batch sizes, optimiser, rollout, model, trainer, data.

Each function maps one part of the composed trustbench config onto verl 0.9.1 keys whose semantics
match exactly, or raises ``ConfigError`` naming the key verl cannot express; ``translate.build_overrides``
merges them with the method's part (``method_overrides``). Pure functions of the config (no verl, torch or
filesystem access).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from runners.algorithms.method import Method
from runners.backends.verl.cpu.mode import rollout_engine
from runners.backends.verl.data import REWARD_FUNCTION_NAME, REWARD_FUNCTION_PATH
from runners.config import run_key
from runners.config.validate import ConfigError

if TYPE_CHECKING:
    from runners.backends.verl.layout import VerlPaths

# gradient-norm clip that never binds (trainer.grad_clip = 0 means "off"; verl would clip to 0)
NO_GRAD_CLIP = 1e12
# plain prompt for base models, as runners.data.prompts.format_prompt without a chat template
PLAIN_CHAT_TEMPLATE = (
    "{% if bos_token %}{{ bos_token }}{% endif %}"
    "{% for m in messages %}{% if not loop.first %}\n\n{% endif %}{{ m['content'] }}{% endfor %}\n"
)


def check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(key, message)


def batch_overrides(cfg: DictConfig, n_gpus: int, profile: Mapping[str, Any]) -> dict[str, Any]:
    """Batch sizes: prompts per step, mini-batch (in prompts, as verl counts), micro-batches per GPU."""
    t, r = cfg.trainer, cfg.rollout
    responses = int(t.prompts_per_step) * int(t.n)
    mini_responses = int(t.mini_batch_prompts) * int(t.n)
    check(
        responses % n_gpus == 0,
        "trainer.prompts_per_step",
        f"prompts_per_step * n = {responses} responses must split evenly over {n_gpus} GPUs",
    )
    check(
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
        check(
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


def optimizer_overrides(cfg: DictConfig, method: Method) -> dict[str, Any]:
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
    if method.requires("critic"):
        check(
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
    check(
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


def model_overrides(cfg: DictConfig, method: Method, model_path: str, profile: Mapping[str, Any]) -> dict[str, Any]:
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
    if method.requires("critic"):  # the critic starts from the policy's weights
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
    check(keep >= 1, "backend.options.keep_checkpoints", f"must be >= 1 (got {keep})")
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
        "reward.custom_reward_function.path": REWARD_FUNCTION_PATH,
        "reward.custom_reward_function.name": REWARD_FUNCTION_NAME,
        "reward.reward_manager.name": "naive",
    }
