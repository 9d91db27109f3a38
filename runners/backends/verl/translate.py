"""trustbench cell config -> the exact ``python -m verl.trainer.main_ppo`` overrides (verl 0.9.1).

Design: translation is a pure function of the composed config and the run's paths (no verl, torch
or filesystem access), so it can be tested on CPU against verl's own config: compose verl's
``ppo_trainer.yaml`` with these overrides and build verl's config dataclasses (tests/verl/
test_translate.py). Every trustbench setting either maps onto a verl key whose semantics match
*exactly*, onto a ``trustbench_*`` plugin (``runners.backends.verl.plugins``, which calls the same
``runners.algorithms`` functions as the built-in trainer), or raises ``ConfigError`` naming the
key verl cannot express. Where a verl built-in matches exactly it is preferred:

==========================  ===========================================================================
trustbench                  verl
==========================  ===========================================================================
estimator grpo / drgrpo     ``adv_estimator=grpo``, ``norm_adv_by_std_in_grpo`` (verl's eps is 1e-6)
estimator rloo / loop       ``rloo`` (G/(G-1) (R - mean))
estimator rfpp(_baseline)   ``reinforce_plus_plus(_baseline)`` (gamma; always centred)
estimator gpg               ``gpg`` (alpha = B / #non-zero scores, f_norm 1)
estimator gae               ``gae`` + critic (gamma, lam; always whitened)
objective clip              ``vanilla``: clip_ratio_low/high; dual clip ``clip_ratio_c``; no dual clip =
                            ``clip_ratio_c=1e10`` (verl clamps the ratio at e^20 < 1e10: never binds)
objective token_is          ``vanilla`` with bounds that never bind (low 1.0, high 1e10, c 1e10)
objective gspo / gpg        ``gspo`` / ``gpg``
loss_agg                    ``loss_agg_mode``; seq-mean-token-sum-norm divides by ``loss_scale_factor``
                            = ``loss_agg.norm_len`` or ``rollout.max_response_length`` (verl's own
                            default, the padded width of a micro-batch, varies between batches)
entropy_control bonus       ``entropy_coeff`` when not adaptive
trainer.kl_coef > 0         ``use_kl_loss``, ``kl_loss_type=low_var_kl`` (k3; verl also clamps k3 to 10)
trainer.warmup_steps        cosine schedule with ``num_cycles=0`` and 1-indexed steps: min(1, (s+1)/w),
                            the built-in trainer's linear warm-up (verl's constant schedule gives lr 0
                            at step 0)
==========================  ===========================================================================

Everything else goes to the plugins (contract: ``runners.backends.verl.plugin_overrides``): a
``trustbench_<objective>`` policy loss whenever the objective has no verl twin (TROLL, TROLL-Seq,
GTPO, BAPO) or the method adds a sequence mask (TRM, LN-TRM, SER) or an entropy controller (REPO-R/D,
ADAPO, adaptive bonus) -- the plugin loss composes objective, mask and controller as the built-in
trainer does; sample-based masks judge the rollout engine's log-probs. A ``trustbench_<estimator>``
takes estimator settings verl fixes (``estimator.eps`` other than 1e-6, ``center=false``,
``whiten=false``, GPG ``rescale``/``f_norm``). Every method runs verl's trainer as
``trainer.v1.trainer_mode=trustbench_sync`` (the plugins' hooks, stop requests).

Not expressible in verl 0.9.1 (``ConfigError`` naming the key): truncated rollouts
(``rollout.mode=truncated``, T-PPO: verl generates whole responses), asymmetric value clipping
(``trainer.value_clip_low != value_clip_high``: verl's ``critic.cliprange_value`` is symmetric),
``trainer.logprob_precision=bf16``, model kinds without a Hugging Face directory (``model.kind``
embedded / tiny), batch sizes that do not split over the GPUs. verl's rollout-correction rejection
masks (``rollout_rs``) are NOT used for TRM: they shrink the response mask (changing the token-mean
denominator, which trm.txt eq. 50 forbids) and compare pi_old, not pi_theta, with the rollout policy.

    from runners.config import compose
    from runners.backends.verl.translate import VerlPaths, build_overrides
    cfg, _ = compose(["backend=verl", "model=qwen3_1.7b", "algorithm=gspo"])
    print("\\n".join(build_overrides(cfg, VerlPaths.under("/tmp/run"))))
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from runners.config import run_key
from runners.config.validate import ConfigError
from runners.resources import cell_resources

PLUGIN_MODULE = "runners.backends.verl.plugins"
ENTRYPOINT = "verl.trainer.main_ppo"
# dual-clip bound that never binds: verl clamps log-ratios to [-20, 20] (ratio <= e^20 ~ 4.9e8)
NEVER_CLIP = 1e10
# gradient-norm clip that never binds (trainer.grad_clip = 0 means "off"; verl would clip to 0)
NO_GRAD_CLIP = 1e12
# verl's GRPO epsilon (compute_grpo_outcome_advantage's default; not configurable)
VERL_GRPO_EPS = 1e-6
MODEL_KINDS = ("hub", "smollm2")
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
    if options.get("rollout_engine", "vllm") not in ("vllm", "sglang"):
        raise ConfigError(
            "backend.options.rollout_engine", f"must be vllm or sglang (got {options['rollout_engine']!r})"
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


# -- algorithm ---------------------------------------------------------------------------------
ACTOR = "actor_rollout_ref.actor"
BUILTIN_LOSSES = ("clip", "token_is", "gspo", "gpg")
CRITIC_ESTIMATORS = ("gae", "egae")
# sample-based masks judge the rollout engine's own log-probs (trm.txt: rollout -> train direction)
ROLLOUT_LOGP_MASKS = ("trm_max_k2", "trm_avg_k3", "trm_max_avg_sample", "ln_trm", "ser")


def _unsupported(key: str, why: str) -> ConfigError:
    return ConfigError(key, f"cannot be expressed with the verl backend: {why}")


def _params(node: DictConfig) -> dict[str, Any]:
    return {k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if k != "name"}


def builtin_estimator(cfg: DictConfig) -> dict[str, Any] | None:
    """``algorithm.*`` keys of verl's own estimator for ``cfg.estimator``; None if none matches exactly."""
    est = cfg.estimator
    name = est.name
    if name == "grpo" and math.isclose(float(est.eps), VERL_GRPO_EPS, rel_tol=0, abs_tol=1e-15):
        return {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": bool(est.norm_by_std)}
    if name == "drgrpo":
        return {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": False}
    if name in ("rloo", "loop"):
        return {"algorithm.adv_estimator": "rloo"}
    if name == "rfpp" and est.center:
        return {"algorithm.adv_estimator": "reinforce_plus_plus", "algorithm.gamma": float(est.gamma)}
    if name == "rfpp_baseline":
        return {"algorithm.adv_estimator": "reinforce_plus_plus_baseline", "algorithm.gamma": 1.0}
    if name == "gpg" and est.rescale == "verl" and float(est.f_norm) == 1.0:
        return {"algorithm.adv_estimator": "gpg"}
    if name == "gae" and est.whiten:
        return {"algorithm.adv_estimator": "gae", "algorithm.gamma": float(est.gamma), "algorithm.lam": float(est.lam)}
    return None


def builtin_loss(cfg: DictConfig) -> dict[str, Any] | None:
    """``actor.*`` keys of verl's own policy loss; None when the method needs the trustbench plugin loss
    (objective without a verl twin, any sequence mask, an entropy controller other than a fixed bonus)."""
    obj, ec = cfg.objective, cfg.entropy_control
    if obj.name not in BUILTIN_LOSSES or cfg.mask.name != "none":
        return None
    if ec.name == "none":
        out: dict[str, Any] = {f"{ACTOR}.entropy_coeff": 0.0}
    elif ec.name == "bonus" and not ec.adaptive:
        out = {f"{ACTOR}.entropy_coeff": float(ec.beta0)}
    else:
        return None
    if obj.name == "clip":
        dual = NEVER_CLIP if obj.clip_ratio_c is None else float(obj.clip_ratio_c)
        low, high, mode = float(obj.clip_ratio_low), float(obj.clip_ratio_high), "vanilla"
    elif obj.name == "token_is":  # r * A: bounds that never bind
        low, high, dual, mode = 1.0, NEVER_CLIP, NEVER_CLIP, "vanilla"
    elif obj.name == "gspo":
        low, high, dual, mode = float(obj.clip_ratio_low), float(obj.clip_ratio_high), NEVER_CLIP, "gspo"
    else:
        return {**out, f"{ACTOR}.policy_loss.loss_mode": "gpg"}
    return {
        **out,
        f"{ACTOR}.policy_loss.loss_mode": mode,
        f"{ACTOR}.clip_ratio": low,
        f"{ACTOR}.clip_ratio_low": low,
        f"{ACTOR}.clip_ratio_high": high,
        f"{ACTOR}.clip_ratio_c": dual,
    }


def plugin_method(cfg: DictConfig, *, loss: bool, estimator: bool) -> tuple[dict[str, Any], list[str]]:
    """The ``trustbench_*`` plugin selection (``runners.backends.verl.plugin_overrides``, part of the
    plugins' contract) for the loss and/or the estimator, plus the flags the plugins rely on."""
    from runners.backends.verl import plugin_overrides

    edges = list(cfg.trainer.length_buckets)
    lines = plugin_overrides(
        objective=str(cfg.objective.name),
        objective_params=_params(cfg.objective),
        mask=str(cfg.mask.name),
        mask_params={**_params(cfg.mask), "length_edges": edges, "position_edges": edges},
        entropy_control=str(cfg.entropy_control.name),
        entropy_control_params=_params(cfg.entropy_control),
        estimator=str(cfg.estimator.name) if estimator else None,
        estimator_params=_params(cfg.estimator) if estimator else None,
    )
    keep = ("algorithm.", "+algorithm.") if not loss else ("",)
    lines = [
        _hydra_line(line) for line in lines if line.startswith(keep) and override_key(line) != "trainer.v1.trainer_mode"
    ]
    values: dict[str, Any] = {}
    if loss:
        values[f"{ACTOR}.entropy_coeff"] = 0.0  # the plugin loss adds the entropy term itself
        values[f"{ACTOR}.calculate_entropy"] = cfg.objective.name == "gtpo" or cfg.entropy_control.name == "bonus"
        if cfg.mask.name in ROLLOUT_LOGP_MASKS:
            values[f"+{ACTOR}.policy_loss.mask_use_rollout_log_probs"] = True
    return values, lines


def algorithm_overrides(cfg: DictConfig) -> tuple[dict[str, Any], list[str]]:
    """What the method decides (estimator, objective, mask, entropy control, aggregation, KL):
    verl keys with values, and the plugin selection as ready override strings."""
    if cfg.rollout.mode != "full":
        raise _unsupported(
            "rollout.mode", "verl generates every response to completion within a step (no T-PPO windows)"
        )
    if cfg.trainer.logprob_precision != "fp32":
        raise _unsupported("trainer.logprob_precision", "verl computes log-probs from fp32 logits only")
    est, loss = builtin_estimator(cfg), builtin_loss(cfg)
    values: dict[str, Any] = {**(est or {}), **(loss or {})}
    lines: list[str] = []
    if est is None or loss is None:
        extra, lines = plugin_method(cfg, loss=loss is None, estimator=est is None)
        values.update(extra)
    if est is None and cfg.estimator.name in ("gae", "egae"):
        values["algorithm.gamma"], values["algorithm.lam"] = float(cfg.estimator.gamma), float(cfg.estimator.lam)
    values["critic.enable"] = cfg.estimator.name in CRITIC_ESTIMATORS
    values[f"{ACTOR}.loss_agg_mode"] = str(cfg.loss_agg.name)
    if cfg.loss_agg.name == "seq-mean-token-sum-norm":
        values[f"{ACTOR}.loss_scale_factor"] = int(cfg.loss_agg.norm_len or cfg.rollout.max_response_length)
    kl = float(cfg.trainer.kl_coef)
    values.update(
        {
            "algorithm.use_kl_in_reward": False,
            f"{ACTOR}.use_kl_loss": kl > 0,
            f"{ACTOR}.kl_loss_coef": kl,
            f"{ACTOR}.kl_loss_type": "low_var_kl",
        }
    )
    return values, lines


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
    if cfg.estimator.name == "gae":
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
        f"{rollout}.name": str(options.get("rollout_engine", "vllm")),
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
        "actor_rollout_ref.rollout.dtype": "bfloat16" if m.dtype != "float32" else "float32",
    }
    if not m.chat_template:
        out["actor_rollout_ref.model.custom_chat_template"] = PLAIN_CHAT_TEMPLATE
    if cfg.estimator.name == "gae":
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
) -> list[str]:
    """The verl command-line overrides of cell ``cfg``, ``backend.options.overrides`` appended last.

    ``model_path`` defaults to ``model.path``; ``nnodes`` / ``gpus_per_node`` to the cell's resources
    (``runners.resources.cell_resources``; the backend passes the allocation it actually got).
    ``resuming``: a checkpoint exists, so the evaluation before the first step is not repeated.
    ``worker_env``: environment for every Ray worker (``ray_kwargs.ray_init.runtime_env.env_vars``),
    besides ``VERL_USE_EXTERNAL_MODULES`` (the plugins). Raises ``ConfigError`` naming the first key
    verl cannot express.
    """
    from runners.backends.verl import EXTERNAL_MODULES_ENV, PLUGIN_MODULE, TRAINER_MODE

    options = backend_options(cfg)
    _check(
        cfg.model.kind in MODEL_KINDS,
        "model.kind",
        f"the verl backend needs a Hugging Face model directory (kinds {', '.join(MODEL_KINDS)}); "
        f"{cfg.model.kind!r} models run on the local backend",
    )
    path = model_path or cfg.model.path
    _check(bool(path), "model.path", "the verl backend needs a model directory or hub id")
    resources = cell_resources(cfg)
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
    # the trustbench trainer (plugins' hooks, stop requests) for every method
    values["trainer.v1.trainer_mode"] = TRAINER_MODE
    env = {EXTERNAL_MODULES_ENV: PLUGIN_MODULE, **(worker_env or {})}
    for name, value in env.items():
        values[f"+ray_kwargs.ray_init.runtime_env.env_vars.{name}"] = str(value)
    overrides = [format_override(key, value) for key, value in values.items()] + plugin_lines
    return merge_overrides(overrides, [str(o) for o in options.get("overrides") or []])


# -- Hydra override syntax -------------------------------------------------------------------------
_PLAIN = re.compile(r"^[A-Za-z0-9_./:-]+$")
_KEY = re.compile(r"^[+~]{0,2}([A-Za-z0-9_.@/-]+)=")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# words Hydra's parser reads, in any letter case, as bool, None or float rather than as a string
_CONVERTED_WORDS = ("true", "false", "null", "inf", "nan")


def _hydra_line(line: str) -> str:
    """An override whose value may be JSON (the plugins' ``plugin_overrides`` writes JSON, which
    Hydra's grammar does not accept for dicts) rewritten in Hydra's grammar; other lines unchanged."""
    key, _, raw = line.partition("=")
    try:
        value = json.loads(raw)
    except ValueError:
        return line
    return f"{key}={format_value(value)}"


def format_value(value: Any) -> str:
    """A Python value in Hydra's override grammar (strings quoted unless plainly safe)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"non-finite override value {value!r}")
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        for key in value:
            # Hydra turns the keys true / false / null / inf / nan (any case) into bool, None or float
            if not (isinstance(key, str) and _IDENT.match(key)) or key.lower() in _CONVERTED_WORDS:
                raise ValueError(f"dict key {key!r} cannot be written as a Hydra override")
        return "{" + ",".join(f"{k}:{format_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if _PLAIN.match(text) and text.lower() not in _CONVERTED_WORDS and not _looks_numeric(text):
        return text
    # Hydra quoted strings: backslashes are literal except a run before a quote or the end (halved)
    text = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    text = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, text)
    return "'" + text + "'"


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def format_override(key: str, value: Any) -> str:
    return f"{key}={format_value(value)}"


def override_key(override: str) -> str:
    """The config key an override sets (``+a.b=1`` -> ``a.b``)."""
    match = _KEY.match(override)
    if not match:
        raise ConfigError("backend.options.overrides", f"{override!r} is not a key=value override")
    return match.group(1)


def merge_overrides(generated: Sequence[str], extra: Sequence[str]) -> list[str]:
    """``generated`` with each ``extra`` override replacing the generated one of the same key."""
    extra_keys = {override_key(o) for o in extra}
    return [o for o in generated if override_key(o) not in extra_keys] + list(extra)
