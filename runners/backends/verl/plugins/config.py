"""Method parameters inside verl's actor config: a dataclass subclass of verl's ``PolicyLossConfig``.

Design: verl 0.9.1 hands a policy loss only ``config: ActorConfig``, built on every worker by
``omega_conf_to_dataclass(actor)``, i.e. ``hydra.utils.instantiate`` of the ``_target_`` of each
node. verl offers no extension slot in ``PolicyLossConfig``, so the least invasive route is to point
``actor.policy_loss._target_`` at ``TrustbenchPolicyLossConfig`` below: the same class with extra
fields (unknown keys would make instantiation fail, and ``global_batch_info``, verl's only free
dict, is splatted into ``agg_loss``). The fields mirror the built-in trainer's config nodes, so the
translation copies them across: ``objective_params`` is the objective node without ``name``,
``mask``/``mask_params`` and ``entropy_control``/``entropy_control_params`` likewise; ``loss_settings``
turns them into the same ``runners.algorithms.method.Method`` the built-in trainer builds (the
registry entries' ``trainer_keys``, e.g. TROLL's ``top_k``/``tail_mass``, go to the trainer, not to
the objective). ``kl_coef`` puts the KL-to-reference term inside the trustbench loss, under the
sequence mask as on the built-in backend (verl's own KL loss is then given coefficient 0). Per-iteration
values (controller state, GTPO's H_ini) are NOT config: they travel with each batch
(``plugins_trainer``), so the config stays frozen as verl wants.

Hydra (the ``+`` adds keys to verl's struct config)::

    actor_rollout_ref.actor.policy_loss._target_=runners.backends.verl.plugins.config.TrustbenchPolicyLossConfig
    actor_rollout_ref.actor.policy_loss.loss_mode=trustbench_troll
    +actor_rollout_ref.actor.policy_loss.objective_params={eps: 0.05, top_k: 64}
    +actor_rollout_ref.actor.policy_loss.mask=trm_max

Tests: ``pytest tests/verl/test_plugins_registry.py tests/verl/test_plugins_losses.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from verl.workers.config import PolicyLossConfig

from runners.algorithms import ENTROPY_CONTROLLERS, MASKS
from runners.algorithms.method import Method
from runners.backends.verl import LOSS_MODES


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
    # coefficient of the k3 KL-to-reference term inside the trustbench loss (under the sequence mask)
    kl_coef: float = 0.0

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
    """A ``trustbench_*`` loss mode and the ``Method`` its ``policy_loss`` node describes.

    What the method needs (the sparse old distribution, the logits, entropy with gradient, rollout
    log-probs, H_ini) comes from the registry declarations through ``method``, as on the built-in
    backend; the properties below only name those answers for the trainer and the engine hooks.
    """

    loss_mode: str
    method: Method

    @property
    def objective(self) -> str:
        return self.method.objective

    @property
    def objective_kw(self) -> dict:
        return dict(self.method.objective_kw)

    @property
    def mask(self) -> str:
        return self.method.mask

    @property
    def mask_kw(self) -> dict:
        return dict(self.method.mask_kw)

    @property
    def entropy_control(self) -> str:
        return self.method.entropy_control

    @property
    def entropy_control_kw(self) -> dict:
        return dict(self.method.entropy_control_kw)

    @property
    def sparse(self) -> dict:
        """``sparsify``'s k, delta, p_default, chunk_size."""
        return self.method.sparse

    @property
    def h_ini_prompts(self) -> int:
        return self.method.h_ini_prompts

    @property
    def needs_sparse_old(self) -> bool:
        """The old-log-prob pass stores the sparse distribution and the update pass keeps the logits."""
        return self.method.requires("sparse_old") or self.method.requires("logits")

    @property
    def needs_grad_entropy(self) -> bool:
        return self.method.requires("grad_entropy")


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


def loss_fields(policy_loss: Any, loss_mode: str | None = None) -> dict[str, Any]:
    """What ``loss_settings`` reads of a ``policy_loss`` node, as plain values (also the key under which
    the plugins reuse a built loss: two nodes with equal fields give the same settings)."""
    policy_loss = {} if policy_loss is None else policy_loss
    return {
        "mode": loss_mode or _get(policy_loss, "loss_mode", "vanilla"),
        "mask": _get(policy_loss, "mask", "none"),
        "entropy_control": _get(policy_loss, "entropy_control", "none"),
        "objective_params": _plain(_get(policy_loss, "objective_params", {})),
        "mask_params": _plain(_get(policy_loss, "mask_params", {})),
        "entropy_control_params": _plain(_get(policy_loss, "entropy_control_params", {})),
        "kl_coef": float(_get(policy_loss, "kl_coef", 0.0)),
    }


def loss_settings(policy_loss: Any, loss_mode: str | None = None) -> LossSettings:
    """Resolve a ``policy_loss`` node (our dataclass, verl's, a DictConfig, a dict or None) for a
    trustbench loss; ``loss_mode`` overrides the node's (a registered loss knows its own mode)."""
    return settings_from_fields(loss_fields(policy_loss, loss_mode))


def settings_from_fields(fields: dict[str, Any]) -> LossSettings:
    """``loss_settings`` of a node whose ``loss_fields`` are ``fields`` (checked here)."""
    mode, mask, control = fields["mode"], fields["mask"], fields["entropy_control"]
    if mode not in LOSS_MODES:
        raise ValueError(f"policy_loss.loss_mode={mode!r} is not a trustbench loss; valid: {', '.join(LOSS_MODES)}")
    objective, fixed = LOSS_MODES[mode]
    if mask not in MASKS:
        raise ValueError(f"policy_loss.mask={mask!r}; valid: {', '.join(MASKS.names())}")
    if control not in ENTROPY_CONTROLLERS:
        raise ValueError(f"policy_loss.entropy_control={control!r}; valid: {', '.join(ENTROPY_CONTROLLERS.names())}")
    given = fields["objective_params"]
    for key, value in fixed.items():  # e.g. trustbench_troll fixes sequence=False: a contrary value is an error
        if key in given and given[key] != value:
            others = [m for m, (name, f) in LOSS_MODES.items() if name == objective and f.get(key) == given[key]]
            hint = f"; loss_mode={others[0]!r} sets {key}={given[key]!r}" if others else ""
            raise ValueError(
                f"policy_loss.objective_params.{key}={given[key]!r} contradicts loss_mode={mode!r}, which fixes "
                f"{key}={value!r}{hint}"
            )
    method = Method.from_params(
        objective=objective,
        objective_params={**given, **fixed},
        mask=mask,
        mask_params=fields["mask_params"],
        entropy_control=control,
        entropy_control_params=fields["entropy_control_params"],
        kl_coef=fields["kl_coef"],
    )
    return LossSettings(loss_mode=mode, method=method)


__all__ = [
    "LossSettings",
    "TrustbenchPolicyLossConfig",
    "is_trustbench_loss",
    "loss_fields",
    "loss_settings",
    "settings_from_fields",
]
