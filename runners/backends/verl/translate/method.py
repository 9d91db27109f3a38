"""What a cell's method becomes in verl 0.9.1: verl's own estimator and loss where one matches exactly,
the ``trustbench_*`` plugins otherwise.

Design: ``VERL_TWINS`` is the verl backend's table of components that have an exact verl built-in,
each mapped to a function from the component's parameters to verl keys (or None when those
parameters fall outside what the built-in does). Everything else a method needs comes from its
registry declarations (``runners.algorithms.method.Method``): a critic (``critic.enable`` and its
model, optimiser and value clip, for every estimator that needs one), entropy with gradient
(``calculate_entropy``), the KL-to-reference term. No component name is tested here.

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
mask none                   no mask
entropy_control none/bonus  ``entropy_coeff`` 0 / beta0 when the bonus is not adaptive
loss_agg                    ``loss_agg_mode``; ``loss_scale_factor`` = ``loss_agg.norm_len`` or
                            ``rollout.max_response_length`` where the mode needs a constant length
rollout_correction          ``algorithm.rollout_correction``: ``rollout_is=token`` + threshold (token_tis),
                            ``rollout_rs=seq_max_k2|k3`` + threshold (verl's implementation of the same)
trainer.kl_coef > 0         ``use_kl_loss``, ``kl_loss_type=low_var_kl`` (k3 clamped as verl does); with
                            a plugin loss the term is added inside it (under the sequence mask, as on the
                            built-in backend) and verl's ``kl_loss_coef`` is 0
==========================  ===========================================================================

A ``trustbench_<objective>`` policy loss is used whenever any of objective, mask or entropy control
has no twin (TROLL, GTPO, BAPO, every TRM / LN-TRM / SER mask, REPO-R/D, ADAPO, the adaptive bonus);
a ``trustbench_<estimator>`` whenever the estimator's parameters fall outside verl's (``std_eps`` other
than 1e-6, ``center=false``, ``whiten=false``, GPG ``rescale``/``f_norm``, EGAE).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from runners.algorithms.method import Method
from runners.config.validate import ConfigError

ACTOR = "actor_rollout_ref.actor"
# dual-clip bound that never binds: verl clamps log-ratios to [-20, 20] (ratio <= e^20 ~ 4.9e8)
NEVER_CLIP = 1e10
# verl's GRPO epsilon (compute_grpo_outcome_advantage's default; not configurable)
VERL_GRPO_EPS = 1e-6


def _unsupported(key: str, why: str) -> ConfigError:
    return ConfigError(key, f"cannot be expressed with the verl backend: {why}")


# -- verl's built-ins, per component: params -> verl keys, or None when they do not match ------------
def _grpo(p: Mapping[str, Any]) -> dict[str, Any] | None:
    if not math.isclose(float(p["std_eps"]), VERL_GRPO_EPS, rel_tol=0, abs_tol=1e-15):
        return None
    return {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": bool(p["norm_by_std"])}


def _rfpp(p: Mapping[str, Any]) -> dict[str, Any] | None:
    if not p["center"]:
        return None
    return {"algorithm.adv_estimator": "reinforce_plus_plus", "algorithm.gamma": float(p["gamma"])}


def _gpg_estimator(p: Mapping[str, Any]) -> dict[str, Any] | None:
    return {"algorithm.adv_estimator": "gpg"} if p["rescale"] == "verl" and float(p["f_norm"]) == 1.0 else None


def _gae(p: Mapping[str, Any]) -> dict[str, Any] | None:
    if not p["whiten"]:
        return None
    return {"algorithm.adv_estimator": "gae", "algorithm.gamma": float(p["gamma"]), "algorithm.lam": float(p["lam"])}


def _ratio_bounds(mode: str, low: float, high: float, dual: float) -> dict[str, Any]:
    return {
        f"{ACTOR}.policy_loss.loss_mode": mode,
        f"{ACTOR}.clip_ratio": low,
        f"{ACTOR}.clip_ratio_low": low,
        f"{ACTOR}.clip_ratio_high": high,
        f"{ACTOR}.clip_ratio_c": dual,
    }


def _clip(p: Mapping[str, Any]) -> dict[str, Any]:
    dual = NEVER_CLIP if p.get("clip_ratio_c") is None else float(p["clip_ratio_c"])
    return _ratio_bounds("vanilla", float(p["clip_ratio_low"]), float(p["clip_ratio_high"]), dual)


def _bonus(p: Mapping[str, Any]) -> dict[str, Any] | None:
    return None if p["adaptive"] else {f"{ACTOR}.entropy_coeff": float(p["beta0"])}


_RC_KEY = "algorithm.rollout_correction"
_RC = {f"{_RC_KEY}.rollout_is_batch_normalize": False}
Twin = Callable[[Mapping[str, Any]], "dict[str, Any] | None"]
VERL_TWINS: dict[str, dict[str, Twin]] = {
    "estimator": {
        "grpo": _grpo,
        "drgrpo": lambda p: {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": False},
        "rloo": lambda p: {"algorithm.adv_estimator": "rloo"},
        "loop": lambda p: {"algorithm.adv_estimator": "rloo"},
        "rfpp": _rfpp,
        "rfpp_baseline": lambda p: {"algorithm.adv_estimator": "reinforce_plus_plus_baseline", "algorithm.gamma": 1.0},
        "gpg": _gpg_estimator,
        "gae": _gae,
    },
    "objective": {
        "clip": _clip,
        "token_is": lambda p: _ratio_bounds("vanilla", 1.0, NEVER_CLIP, NEVER_CLIP),  # r * A: bounds never bind
        "gspo": lambda p: _ratio_bounds("gspo", float(p["clip_ratio_low"]), float(p["clip_ratio_high"]), NEVER_CLIP),
        "gpg": lambda p: {f"{ACTOR}.policy_loss.loss_mode": "gpg"},
    },
    "mask": {"none": lambda p: {}},
    # verl's own rollout correction (algorithm.rollout_correction), computed by its trainer from the same log-probs
    "rollout_correction": {
        "none": lambda p: {},
        "token_tis": lambda p: {
            **_RC,
            f"{_RC_KEY}.rollout_is": "token",
            f"{_RC_KEY}.rollout_is_threshold": float(p["cap"]),
        },
        "seq_max_k2": lambda p: {
            **_RC,
            f"{_RC_KEY}.rollout_rs": "seq_max_k2",
            f"{_RC_KEY}.rollout_rs_threshold": float(p["threshold"]),
        },
        "seq_max_k3": lambda p: {
            **_RC,
            f"{_RC_KEY}.rollout_rs": "seq_max_k3",
            f"{_RC_KEY}.rollout_rs_threshold": float(p["threshold"]),
        },
    },
    "entropy_control": {"none": lambda p: {f"{ACTOR}.entropy_coeff": 0.0}, "bonus": _bonus},
}


def _params(node: DictConfig) -> dict[str, Any]:
    return {k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if k != "name"}


def _twin(cfg: DictConfig, group: str) -> dict[str, Any] | None:
    twin = VERL_TWINS[group].get(str(cfg[group].name))
    return None if twin is None else twin(_params(cfg[group]))


def builtin_estimator(cfg: DictConfig) -> dict[str, Any] | None:
    """``algorithm.*`` keys of verl's own estimator for ``cfg.estimator``; None if none matches exactly."""
    return _twin(cfg, "estimator")


def builtin_loss(cfg: DictConfig) -> dict[str, Any] | None:
    """``actor.*`` keys of verl's own policy loss; None when objective, mask or entropy control has no twin."""
    parts = [_twin(cfg, group) for group in ("entropy_control", "mask", "objective")]
    if any(part is None for part in parts):
        return None
    return {key: value for part in parts for key, value in part.items()}


def plugin_method(cfg: DictConfig, method: Method, *, loss: bool, estimator: bool) -> tuple[dict[str, Any], list[str]]:
    """The ``trustbench_*`` plugin selection (``runners.backends.verl.plugin_overrides``, part of the
    plugins' contract) for the loss and/or the estimator, plus the flags the plugins rely on."""
    from runners.backends.verl import plugin_overrides
    from runners.backends.verl.hydra import override_key

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
    lines = [line for line in lines if line.startswith(keep) and override_key(line) != "trainer.v1.trainer_mode"]
    values: dict[str, Any] = {}
    if loss:
        values[f"{ACTOR}.entropy_coeff"] = 0.0  # the plugin loss adds the entropy term itself
        values[f"{ACTOR}.calculate_entropy"] = method.requires("grad_entropy")
    return values, lines


def _kl_overrides(kl: float, *, plugin_loss: bool) -> dict[str, Any]:
    """verl computes the reference log-probs when ``use_kl_loss``; a plugin loss adds the term itself."""
    values: dict[str, Any] = {
        "algorithm.use_kl_in_reward": False,
        f"{ACTOR}.use_kl_loss": kl > 0,
        f"{ACTOR}.kl_loss_coef": 0.0 if plugin_loss else kl,
        f"{ACTOR}.kl_loss_type": "low_var_kl",
    }
    if plugin_loss and kl > 0:
        values[f"+{ACTOR}.policy_loss.kl_coef"] = kl
    return values


def algorithm_overrides(cfg: DictConfig, method: Method) -> tuple[dict[str, Any], list[str]]:
    """What the method decides (estimator, objective, mask, entropy control, aggregation, KL):
    verl keys with values, and the plugin selection as ready override strings (``method``: the cell's,
    built once by ``translate.build_overrides``)."""
    if cfg.rollout.mode != "full":
        raise _unsupported(
            "rollout.mode", "verl generates every response to completion within a step (no T-PPO windows)"
        )
    if cfg.trainer.logprob_precision != "fp32":
        raise _unsupported("trainer.logprob_precision", "verl computes log-probs from fp32 logits only")
    if int(cfg.rollout.staleness) > 0:
        raise _unsupported(
            "rollout.staleness", "the synchronous verl trainer samples with the current weights (use verl's async mode)"
        )
    est, loss = builtin_estimator(cfg), builtin_loss(cfg)
    values: dict[str, Any] = {**(est or {}), **(loss or {})}
    lines: list[str] = []
    if est is None or loss is None:
        extra, lines = plugin_method(cfg, method, loss=loss is None, estimator=est is None)
        values.update(extra)
    critic = method.requires("critic")
    if est is None and critic:  # the plugin estimator reads its own parameters; verl's critic the discount
        values["algorithm.gamma"], values["algorithm.lam"] = float(cfg.estimator.gamma), float(cfg.estimator.lam)
    values["critic.enable"] = critic
    values[f"{ACTOR}.loss_agg_mode"] = str(cfg.loss_agg.name)
    if method.requires("norm_len"):
        values[f"{ACTOR}.loss_scale_factor"] = int(method.norm_len)
    values.update(_kl_overrides(float(cfg.trainer.kl_coef), plugin_loss=loss is None))
    correction = _twin(cfg, "rollout_correction")
    if correction is None:
        raise _unsupported("rollout_correction.name", f"no verl twin for {cfg.rollout_correction.name!r}")
    values.update(correction)
    return values, lines


__all__ = [
    "ACTOR",
    "NEVER_CLIP",
    "VERL_GRPO_EPS",
    "VERL_TWINS",
    "algorithm_overrides",
    "builtin_estimator",
    "builtin_loss",
    "plugin_method",
]
