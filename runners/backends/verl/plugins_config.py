"""Method parameters inside verl's actor config: a dataclass subclass of verl's ``PolicyLossConfig``.

Design: verl 0.9.1 hands a policy loss only ``config: ActorConfig``, built on every worker by
``omega_conf_to_dataclass(actor)``, i.e. ``hydra.utils.instantiate`` of the ``_target_`` of each
node. verl offers no extension slot in ``PolicyLossConfig``, so the least invasive route is to point
``actor.policy_loss._target_`` at ``TrustbenchPolicyLossConfig`` below: the same class with extra
fields (unknown keys would make instantiation fail, and ``global_batch_info``, verl's only free
dict, is splatted into ``agg_loss``). The fields mirror the built-in trainer's config nodes, so the
translation copies them across: ``objective_params`` is the objective node without ``name`` (its
``k``/``delta``/``h_ini_prompts`` are consumed by the trainer, as ``LocalTrainer`` pops them),
``mask``/``mask_params`` and ``entropy_control``/``entropy_control_params`` likewise. Per-iteration
values (controller state, GTPO's H_ini) are NOT config: they travel with each batch
(``plugins_trainer``), so the config stays frozen as verl wants.

Hydra (the ``+`` adds keys to verl's struct config)::

    actor_rollout_ref.actor.policy_loss._target_=runners.backends.verl.plugins_config.TrustbenchPolicyLossConfig
    actor_rollout_ref.actor.policy_loss.loss_mode=trustbench_troll
    +actor_rollout_ref.actor.policy_loss.objective_params={eps: 0.05, k: 64}
    +actor_rollout_ref.actor.policy_loss.mask=trm_max

Tests: ``pytest tests/verl/test_plugins_registry.py tests/verl/test_plugins_losses.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from verl.workers.config import PolicyLossConfig

from runners.algorithms import ENTROPY_CONTROLLERS, MASKS
from runners.backends.verl import LOSS_MODES
from runners.config.validate import EXACT_KL_MASKS

# objective-node keys the trainer consumes (sparsify, H_ini), not the objective function
TRAINER_KEYS = ("k", "delta", "h_ini_prompts")
# sparse storage of the old distribution (troll.txt section 3.2) and its defaults (LocalTrainer's)
SPARSE_DEFAULTS = {"k": 64, "delta": 1e-5, "p_default": 1e-12, "chunk_size": 1024}


@dataclass
class TrustbenchPolicyLossConfig(PolicyLossConfig):
    """verl's policy-loss config plus the trustbench method parameters (see module docstring)."""

    # keyword arguments of the objective (the trustbench objective node without ``name``)
    objective_params: dict = field(default_factory=dict)
    # sequence mask (runners.algorithms MASKS) and its keyword arguments
    mask: str = "none"
    mask_params: dict = field(default_factory=dict)
    # entropy controller (runners.algorithms ENTROPY_CONTROLLERS) and its constructor arguments
    entropy_control: str = "none"
    entropy_control_params: dict = field(default_factory=dict)
    # sample-based masks compare with the rollout engine's log-probs instead of the old log-probs
    mask_use_rollout_log_probs: bool = False

    def __post_init__(self) -> None:
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:
            parent()
        for key in ("objective_params", "mask_params", "entropy_control_params"):
            if not isinstance(getattr(self, key), Mapping):
                raise TypeError(f"policy_loss.{key} must be a mapping, got {getattr(self, key)!r}")
        if self.mask not in MASKS:
            raise ValueError(f"policy_loss.mask={self.mask!r}; valid: {', '.join(MASKS.names())}")
        if self.entropy_control not in ENTROPY_CONTROLLERS:
            raise ValueError(
                f"policy_loss.entropy_control={self.entropy_control!r}; valid: {', '.join(ENTROPY_CONTROLLERS.names())}"
            )


@dataclass(frozen=True)
class LossSettings:
    """What a ``trustbench_*`` loss and the trustbench trainer read from ``policy_loss``."""

    loss_mode: str
    # library objective name and its keyword arguments (plugin-fixed ones included)
    objective: str
    objective_kw: dict
    mask: str
    mask_kw: dict
    entropy_control: str
    entropy_control_kw: dict
    # sparsify's k, delta, p_default, chunk_size
    sparse: dict
    h_ini_prompts: int
    mask_use_rollout_log_probs: bool

    @property
    def needs_sparse_old(self) -> bool:
        """TROLL and the exact-KL masks need the old distribution's top-K (and the logits)."""
        return self.objective == "troll" or self.mask in EXACT_KL_MASKS

    @property
    def needs_grad_entropy(self) -> bool:
        """GTPO and the entropy bonus differentiate the current token entropy."""
        return self.objective == "gtpo" or self.entropy_control == "bonus"


def _get(node: Any, key: str, default: Any) -> Any:
    if isinstance(node, Mapping) or hasattr(node, "get"):
        value = node.get(key, default)
    else:
        value = getattr(node, key, default)
    return default if value is None else value


def _plain(value: Any) -> dict:
    """A mapping (dict, DictConfig, dataclass mapping) as a plain dict with plain values."""
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(value, DictConfig):
            return dict(OmegaConf.to_container(value, resolve=True))
    except ImportError:  # pragma: no cover - omegaconf ships with hydra
        pass
    return dict(value)


def is_trustbench_loss(policy_loss: Any) -> bool:
    return policy_loss is not None and _get(policy_loss, "loss_mode", "vanilla") in LOSS_MODES


def loss_settings(policy_loss: Any, loss_mode: str | None = None) -> LossSettings:
    """Resolve a ``policy_loss`` node (our dataclass, verl's, a DictConfig, a dict or None) for a
    trustbench loss; ``loss_mode`` overrides the node's (a registered loss knows its own mode)."""
    policy_loss = {} if policy_loss is None else policy_loss
    mode = loss_mode or _get(policy_loss, "loss_mode", "vanilla")
    if mode not in LOSS_MODES:
        raise ValueError(f"policy_loss.loss_mode={mode!r} is not a trustbench loss; valid: {', '.join(LOSS_MODES)}")
    objective, fixed = LOSS_MODES[mode]
    params = _plain(_get(policy_loss, "objective_params", {}))
    sparse = {key: params.get(key, default) for key, default in SPARSE_DEFAULTS.items()}
    h_ini_prompts = int(params.get("h_ini_prompts", 100))
    objective_kw = {k: v for k, v in params.items() if k not in TRAINER_KEYS}
    objective_kw.update(fixed)
    mask = _get(policy_loss, "mask", "none")
    control = _get(policy_loss, "entropy_control", "none")
    if mask not in MASKS:
        raise ValueError(f"policy_loss.mask={mask!r}; valid: {', '.join(MASKS.names())}")
    if control not in ENTROPY_CONTROLLERS:
        raise ValueError(f"policy_loss.entropy_control={control!r}; valid: {', '.join(ENTROPY_CONTROLLERS.names())}")
    return LossSettings(
        loss_mode=mode,
        objective=objective,
        objective_kw=objective_kw,
        mask=mask,
        mask_kw=_plain(_get(policy_loss, "mask_params", {})),
        entropy_control=control,
        entropy_control_kw=_plain(_get(policy_loss, "entropy_control_params", {})),
        sparse=sparse,
        h_ini_prompts=h_ini_prompts,
        mask_use_rollout_log_probs=bool(_get(policy_loss, "mask_use_rollout_log_probs", False)),
    )


__all__ = [
    "LossSettings",
    "SPARSE_DEFAULTS",
    "TRAINER_KEYS",
    "TrustbenchPolicyLossConfig",
    "is_trustbench_loss",
    "loss_settings",
]
