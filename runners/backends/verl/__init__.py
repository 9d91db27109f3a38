"""verl 0.9.1 backend: trustbench's methods as verl plugins (this package) and the config translation.

Importing this package imports neither torch nor verl: it only names the plugin contract, so the
config translation and the CLI can use it anywhere. The plugins themselves live in
``runners.backends.verl.plugins.register`` (the module verl imports in every Ray process) and call the same
``runners.algorithms`` functions as the built-in trainer.

How verl 0.9.1 reaches the plugins (the contract the translation emits):

- ``VERL_USE_EXTERNAL_MODULES=runners.backends.verl.plugins.register`` in the environment of the driver and of
  every Ray worker (``verl/__init__.py`` imports the listed modules at ``import verl``; put it in
  ``ray_kwargs.ray_init.runtime_env.env_vars`` too when Ray is started outside the driver). The
  import registers the policy losses, the advantage estimators and the trainer below.
- ``trainer.v1.trainer_mode=trustbench_sync``: verl's synchronous v1 trainer plus the trustbench
  hooks (``plugins_trainer``): sparse old distributions in the old-log-prob pass, the logits handed
  to the loss in the update pass, per-iteration controllers (REPO zeta, ADAPO eps_high, adaptive
  entropy bonus, GTPO's H_ini), critic values for ``trustbench_gae`` / ``trustbench_egae``.
- ``actor_rollout_ref.actor.policy_loss._target_=`` ``POLICY_LOSS_TARGET`` and
  ``...policy_loss.loss_mode=trustbench_<objective>``; the method's parameters are extra fields of
  that config class (``+...policy_loss.objective_params={...}``, ``mask``, ``mask_params``,
  ``entropy_control``, ``entropy_control_params``): see ``plugin_overrides``.
- ``algorithm.adv_estimator=trustbench_<estimator>`` with ``+algorithm.trustbench_estimator={...}``
  (the estimator's keyword arguments).
- ``actor_rollout_ref.actor.calculate_entropy=true`` when the loss needs the current entropy with
  gradient (GTPO, adaptive entropy bonus); ``critic.enable=true`` for the critic estimators.

    from runners.backends.verl import plugin_overrides
    plugin_overrides(objective="troll", mask="trm_max", mask_params={"delta": 0.05})
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from runners.algorithms import ENTROPY_CONTROLLERS, ESTIMATORS, MASKS, OBJECTIVES
from runners.backends.verl.hydra import format_value

# module verl imports through VERL_USE_EXTERNAL_MODULES (comma-separated list of modules)
PLUGIN_MODULE = "runners.backends.verl.plugins.register"
EXTERNAL_MODULES_ENV = "VERL_USE_EXTERNAL_MODULES"
# verl v1 trainer registered by the plugins (trainer.v1.trainer_mode)
TRAINER_MODE = "trustbench_sync"
# policy-loss config class carrying the method parameters (actor.policy_loss._target_)
POLICY_LOSS_TARGET = "runners.backends.verl.plugins.config.TrustbenchPolicyLossConfig"
# key of the estimator's keyword arguments under verl's ``algorithm`` node
ESTIMATOR_PARAMS_KEY = "trustbench_estimator"
PREFIX = "trustbench_"

# an objective whose config declares this boolean field has a token- and a sequence-level form (TROLL's
# GSPO form): one loss mode each, trustbench_<name> and trustbench_<name>_seq
SEQUENCE_FIELD = "sequence"


def _loss_modes() -> dict[str, tuple[str, dict[str, Any]]]:
    modes: dict[str, tuple[str, dict[str, Any]]] = {}
    for name in OBJECTIVES.names():
        schema = OBJECTIVES.schema(name)
        if schema is not None and SEQUENCE_FIELD in {f.name for f in dataclasses.fields(schema)}:
            modes[f"{PREFIX}{name}"] = (name, {SEQUENCE_FIELD: False})
            modes[f"{PREFIX}{name}_seq"] = (name, {SEQUENCE_FIELD: True})
        else:
            modes[f"{PREFIX}{name}"] = (name, {})
    return modes


# policy-loss plugin name -> (library objective, parameters the plugin fixes), read from the objectives' schemas
LOSS_MODES: dict[str, tuple[str, dict[str, Any]]] = _loss_modes()
# advantage-estimator plugin name -> library estimator
ADV_ESTIMATORS: dict[str, str] = {f"{PREFIX}{name}": name for name in ESTIMATORS.names()}
# metric namespaces of the methods (runners.metric_names); verl's trainer prefixes actor metrics with
# "actor/", the trustbench trainer strips it again for these
METHOD_METRIC_PREFIXES = ("troll/", "trm/", "gtpo/", "entropy/", "bapo/")


def loss_mode_for(objective: str, *, sequence: bool = False) -> str:
    """verl ``policy_loss.loss_mode`` of a library objective (``sequence``: TROLL's GSPO form).

    The loss mode whose fixed parameters agree with ``sequence`` (modes that fix none take any)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; valid: {', '.join(OBJECTIVES.names())}")
    for mode, (name, fixed) in LOSS_MODES.items():
        if name == objective and fixed.get(SEQUENCE_FIELD, sequence) == sequence:
            return mode
    raise ValueError(f"objective {objective!r} has no verl loss mode with sequence={sequence}")


def plugin_overrides(
    *,
    objective: str,
    objective_params: Mapping[str, Any] | None = None,
    mask: str = "none",
    mask_params: Mapping[str, Any] | None = None,
    entropy_control: str = "none",
    entropy_control_params: Mapping[str, Any] | None = None,
    estimator: str | None = None,
    estimator_params: Mapping[str, Any] | None = None,
    actor: str = "actor_rollout_ref.actor",
) -> list[str]:
    """Hydra overrides of verl's ``ppo_trainer`` config that select the trustbench plugins.

    ``objective_params`` are the objective node of a trustbench config without ``name`` (TROLL's
    ``k``/``delta``/``p_default``/``chunk_size`` also set the sparse old distribution, as in the
    built-in trainer); ``mask_params`` include ``length_edges``/``position_edges`` if wanted.
    ``objective_params["sequence"]`` selects TROLL's GSPO form. Names are checked here.
    """
    for kind, name, registry in (
        ("mask", mask, MASKS),
        ("entropy_control", entropy_control, ENTROPY_CONTROLLERS),
    ):
        if name not in registry:
            raise ValueError(f"unknown {kind} {name!r}; valid: {', '.join(registry.names())}")
    params = dict(objective_params or {})
    mode = loss_mode_for(objective, sequence=bool(params.get(SEQUENCE_FIELD, False)))
    for key in LOSS_MODES[mode][1]:  # the loss mode fixes these
        params.pop(key, None)
    loss = f"{actor}.policy_loss"
    out = [
        f"{loss}._target_={POLICY_LOSS_TARGET}",
        f"{loss}.loss_mode={mode}",
        f"+{loss}.objective_params={format_value(params)}",
        f"+{loss}.mask={mask}",
        f"+{loss}.mask_params={format_value(dict(mask_params or {}))}",
        f"+{loss}.entropy_control={entropy_control}",
        f"+{loss}.entropy_control_params={format_value(dict(entropy_control_params or {}))}",
        f"trainer.v1.trainer_mode={TRAINER_MODE}",
    ]
    if estimator is not None:
        if estimator not in ESTIMATORS:
            raise ValueError(f"unknown estimator {estimator!r}; valid: {', '.join(ESTIMATORS.names())}")
        out.append(f"algorithm.adv_estimator={PREFIX}{estimator}")
        out.append(f"+algorithm.{ESTIMATOR_PARAMS_KEY}={format_value(dict(estimator_params or {}))}")
    return out


__all__ = [
    "ADV_ESTIMATORS",
    "ESTIMATOR_PARAMS_KEY",
    "EXTERNAL_MODULES_ENV",
    "LOSS_MODES",
    "METHOD_METRIC_PREFIXES",
    "PLUGIN_MODULE",
    "POLICY_LOSS_TARGET",
    "TRAINER_MODE",
    "loss_mode_for",
    "plugin_overrides",
]
