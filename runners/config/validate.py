"""Compose-time validation: every value checked before anything trains or is submitted.

Hydra already rejects unknown presets and mistyped keys of the option files; this module re-checks
each component node against its dataclass (catching ``+key=value`` additions), checks ranges and
cross-field rules, and raises ``ConfigError`` naming the offending key, e.g.::

    config key 'objective.eps': must be > 0 (got -0.1)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from runners.config.schema import COMPONENTS

GROUP_ESTIMATORS = {"grpo", "drgrpo", "rloo", "loop", "rfpp_baseline", "gpg"}
CRITIC_ESTIMATORS = {"gae", "egae"}
EXACT_KL_MASKS = {"trm_max", "trm_avg", "trm_max_avg"}
MODEL_KINDS = ("embedded", "smollm2", "hub", "tiny")
TINY_ARCHS = ("qwen2", "qwen3", "llama")
DTYPES = ("float32", "bfloat16", "float16")
BACKENDS = ("local", "verl")
DEVICES = ("auto", "cpu", "cuda")
LAUNCHERS = ("local", "submitit_local", "slurm")


class ConfigError(ValueError):
    """A configuration value that cannot run; ``key`` is the dotted config key."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(f"config key '{key}': {message}")


class _Checker:
    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg

    def get(self, key: str) -> Any:
        return OmegaConf.select(self.cfg, key, throw_on_missing=True)

    def require(self, key: str, ok: Callable[[Any], bool], what: str) -> None:
        value = self.get(key)
        try:
            good = ok(value)
        except TypeError:
            good = False
        if not good:
            raise ConfigError(key, f"{what} (got {value!r})")

    def positive(self, *keys: str) -> None:
        for key in keys:
            self.require(key, lambda v: v is not None and v > 0 and math.isfinite(v), "must be > 0")

    def non_negative(self, *keys: str) -> None:
        for key in keys:
            self.require(key, lambda v: v is not None and v >= 0, "must be >= 0")

    def at_least(self, key: str, low: int) -> None:
        self.require(key, lambda v: v is not None and v >= low, f"must be >= {low}")

    def one_of(self, key: str, allowed) -> None:
        allowed = tuple(allowed)
        self.require(key, lambda v: v in allowed, f"must be one of {', '.join(map(str, allowed))}")

    def in_open_unit(self, *keys: str) -> None:
        for key in keys:
            self.require(key, lambda v: 0 < v < 1, "must be in (0, 1)")


def _check_component_schemas(cfg: DictConfig) -> None:
    from runners.algorithms import REGISTRIES

    for group, by_name in COMPONENTS.items():
        node = cfg.get(group)
        if node is None or not isinstance(node, DictConfig) or "name" not in node:
            raise ConfigError(group, f"missing; choose one of {', '.join(sorted(by_name))}")
        name = node.name
        registry = REGISTRIES[group]
        if name not in registry:
            raise ConfigError(f"{group}.name", f"unknown {group} {name!r}; valid names: {', '.join(registry.names())}")
        schema = by_name.get(name)
        if schema is None:  # a plugin's component: no schema to check against
            continue
        allowed = {f.name for f in dataclasses.fields(schema)}
        unknown = sorted(set(node.keys()) - allowed)
        if unknown:
            raise ConfigError(
                f"{group}.{unknown[0]}",
                f"not a parameter of {group} {name!r}; valid keys: {', '.join(sorted(allowed - {'name'}))}",
            )
        try:
            OmegaConf.merge(OmegaConf.structured(schema), node)
        except OmegaConfBaseException as err:
            key = getattr(err, "full_key", None) or getattr(err, "key", None) or "?"
            raise ConfigError(f"{group}.{key}", f"{err.msg if hasattr(err, 'msg') else err}") from None


def _check_components(c: _Checker, cfg: DictConfig) -> None:
    est, obj, mask, ec = cfg.estimator, cfg.objective, cfg.mask, cfg.entropy_control
    if est.name == "grpo":
        c.positive("estimator.eps")
    for key in ("gamma", "lam"):
        if key in est:
            c.require(f"estimator.{key}", lambda v: 0 <= v <= 1, "must be in [0, 1]")
    if "gamma" in est:
        c.positive("estimator.gamma")
    if est.name == "gpg":
        c.one_of("estimator.rescale", ("verl", "none"))
        c.positive("estimator.f_norm")

    if obj.name in ("clip", "gspo"):
        c.positive("objective.clip_ratio_low", "objective.clip_ratio_high")
        c.require("objective.clip_ratio_low", lambda v: v < 1, "must be < 1 (the ratio's lower bound is 1 - value)")
    if obj.name == "clip" and obj.clip_ratio_c is not None:
        c.require("objective.clip_ratio_c", lambda v: v > 1, "dual-clip bound must be > 1")
    if obj.name == "bapo":
        c.in_open_unit("objective.rho")
        c.require(
            "objective.ratio_low_start",
            lambda v: 0 < v <= obj.ratio_low_max < 1,
            "needs 0 < ratio_low_start <= ratio_low_max < 1",
        )
        c.require(
            "objective.ratio_high_start",
            lambda v: 1 < v <= obj.ratio_high_max,
            "needs 1 < ratio_high_start <= ratio_high_max",
        )
        c.positive("objective.ratio_low_step", "objective.ratio_high_step")
        c.one_of("objective.rule", ("paper", "recipe"))
    if obj.name == "troll":
        c.positive("objective.eps")
        c.non_negative("objective.alpha")
        c.at_least("objective.k", 1)
        c.in_open_unit("objective.delta")
        c.require("objective.p_default", lambda v: 0 < v < 1e-3, "must be in (0, 1e-3)")
        c.at_least("objective.chunk_size", 1)
        c.at_least("objective.num_points", 2)
        c.at_least("objective.max_steps", 1)
        c.positive("objective.tol", "objective.eta_min")
        c.require("objective.eta_max", lambda v: v > obj.eta_min, "must be > objective.eta_min")
    if obj.name == "gtpo":
        c.non_negative("objective.gamma")
        c.one_of("objective.combine", ("or", "product"))
        c.one_of("objective.entropy_term", ("penalty", "advantage_shift"))
        c.at_least("objective.h_ini_prompts", 1)
        c.positive("objective.entropy_threshold", "objective.conflict_weight")

    for key in ("delta", "delta_avg", "delta_w", "delta_ser"):
        if key in mask:
            c.positive(f"mask.{key}")

    if ec.name in ("repo_r", "repo_d"):
        c.positive("entropy_control.zeta_min", "entropy_control.zeta_max")
        c.require("entropy_control.zeta_max", lambda v: v >= ec.zeta_min, "must be >= entropy_control.zeta_min")
        c.require(
            "entropy_control.zeta0",
            lambda v: ec.zeta_min <= abs(v) <= ec.zeta_max,
            "|zeta0| must lie in [zeta_min, zeta_max]",
        )
    if ec.name == "adapo":
        c.in_open_unit("entropy_control.eps_low")
        c.require(
            "entropy_control.eps_high",
            lambda v: ec.eps_high_min <= v <= ec.eps_high_max,
            "must lie in [eps_high_min, eps_high_max]",
        )
        c.require("entropy_control.increase", lambda v: v > 1, "must be > 1")
        c.in_open_unit("entropy_control.decrease")
        if obj.name != "clip":
            raise ConfigError(
                "entropy_control.name", f"adapo steers clip_ratio_high and needs objective clip (got {obj.name!r})"
            )
    if ec.name == "bonus":
        c.non_negative("entropy_control.beta0")
        c.require("entropy_control.beta_max", lambda v: v >= ec.beta_min >= 0, "needs 0 <= beta_min <= beta_max")


def _check_run(c: _Checker, cfg: DictConfig) -> None:
    r, t = cfg.rollout, cfg.trainer
    c.one_of("rollout.mode", ("full", "truncated"))
    c.at_least("rollout.max_response_length", 1)
    c.at_least("rollout.max_prompt_length", 1)
    c.positive("rollout.temperature")
    c.require("rollout.top_p", lambda v: 0 < v <= 1, "must be in (0, 1]")
    c.non_negative("rollout.drop_last_k")
    if r.mode == "truncated":
        c.require("rollout.window", lambda v: v is not None and v >= 1, "truncated rollouts need a window >= 1")
        c.require(
            "rollout.window",
            lambda v: v <= r.max_response_length,
            f"window longer than rollout.max_response_length={r.max_response_length}",
        )
        c.require("rollout.drop_last_k", lambda v: v < r.window, f"must be < rollout.window={r.window}")
        if cfg.estimator.name not in CRITIC_ESTIMATORS:
            raise ConfigError(
                "rollout.mode",
                f"truncated rollouts split prompt groups across steps; estimator {cfg.estimator.name!r} needs "
                f"complete groups (use estimator gae or egae)",
            )
    elif r.drop_last_k:
        raise ConfigError("rollout.drop_last_k", "only applies to rollout.mode=truncated")

    c.at_least("trainer.total_steps", 1)
    c.at_least("trainer.prompts_per_step", 1)
    c.at_least("trainer.n", 1)
    if cfg.estimator.name in GROUP_ESTIMATORS or cfg.objective.name == "gtpo":
        c.require(
            "trainer.n",
            lambda v: v >= 2,
            f"{cfg.estimator.name}/{cfg.objective.name} compare responses within a group: needs n >= 2",
        )
    c.at_least("trainer.ppo_epochs", 1)
    c.at_least("trainer.mini_batch_prompts", 1)
    c.require(
        "trainer.mini_batch_prompts",
        lambda v: t.prompts_per_step % v == 0,
        f"must divide trainer.prompts_per_step={t.prompts_per_step}",
    )
    c.non_negative("trainer.micro_batch_size", "trainer.weight_decay", "trainer.grad_clip", "trainer.warmup_steps")
    c.non_negative("trainer.kl_coef", "trainer.eval_every", "trainer.checkpoint_every")
    c.positive("trainer.lr", "trainer.critic_lr", "trainer.eval_temperature")
    c.positive("trainer.value_clip_low", "trainer.value_clip_high")
    for key in ("trainer.adam_beta1", "trainer.adam_beta2"):
        c.require(key, lambda v: 0 <= v < 1, "must be in [0, 1)")
    c.at_least("trainer.eval_n", 1)
    c.one_of("trainer.logprob_precision", ("fp32", "bf16"))
    c.require(
        "trainer.length_buckets",
        lambda v: len(v) >= 2 and all(a < b for a, b in zip(v, v[1:])),
        "must be an increasing list of at least two edges",
    )

    m = cfg.model
    c.one_of("model.kind", MODEL_KINDS)
    c.one_of("model.dtype", DTYPES)
    if m.kind == "hub":
        c.require("model.path", lambda v: bool(v), "model.kind=hub needs a hub id or a local directory")
        if str(m.path).startswith(("/", "./", "../", "~")):
            c.require("model.path", lambda v: Path(v).expanduser().exists(), "local model directory does not exist")
    if m.kind == "tiny":
        c.one_of("model.arch", TINY_ARCHS)
    c.non_negative("model.params_b")

    d = cfg.dataset
    from runners.data.datasets import PRESETS

    c.one_of("dataset.name", sorted(PRESETS))
    if d.eval_name is not None:
        c.one_of("dataset.eval_name", sorted(PRESETS))
    c.require(
        "dataset.extra_eval",
        lambda v: all(x in PRESETS for x in v),
        f"every entry must be one of {', '.join(sorted(PRESETS))}",
    )
    for key in ("path", "eval_path"):
        if d.get(key):
            c.require(f"dataset.{key}", lambda v: Path(v).expanduser().is_file(), "dataset file not found")
    for key in ("train_limit", "eval_limit"):
        if d.get(key) is not None:
            c.at_least(f"dataset.{key}", 1)
    if d.reward is not None:
        from runners.data.rewards import REWARDS

        c.one_of("dataset.reward", REWARDS.names())

    c.one_of("backend.name", BACKENDS)
    c.one_of("backend.device", DEVICES)
    c.non_negative("backend.num_threads")
    c.one_of("tracking.kind", ("sqlite", "server"))
    c.require("tracking.port", lambda v: 0 < v < 65536, "must be a TCP port")
    c.positive("tracking.flush_every_s")
    c.one_of("launcher.name", LAUNCHERS)
    c.non_negative("launcher.max_requeues")
    c.at_least("launcher.time_min", 1)
    c.non_negative("debug.step_delay_s")
    if cfg.debug.delay_steps_below is not None:
        c.non_negative("debug.delay_steps_below")
    if cfg.debug.fail_at_step is not None:
        c.non_negative("debug.fail_at_step")


def validate(cfg: DictConfig) -> None:
    """Raise ``ConfigError`` (naming the key) if ``cfg`` cannot run; return None otherwise."""
    try:
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "?"
        raise ConfigError(str(key), "is missing or cannot be resolved") from None
    _check_component_schemas(cfg)
    checker = _Checker(cfg)
    _check_components(checker, cfg)
    _check_run(checker, cfg)
