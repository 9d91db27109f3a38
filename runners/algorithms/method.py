"""A cell's policy-update method: its components, their parameters, and what they need together.

Design: a cell chooses one entry from each registry (estimator, objective, mask, entropy control,
loss aggregation). ``Method`` holds those choices with their keyword arguments and answers the
questions backends and validation used to answer by testing names: does this method need a critic,
the current logits, the rollout policy's sparse distribution, the entropy with gradient, the
rollout engine's log-probs, GTPO's initial entropy, complete prompt groups? The answers come from
the registry declarations (``Registry.register(..., needs=, provides=, trainer_keys=)``), so a new
component states its needs once, on its registry line, and every backend follows.

Capabilities (the words of ``needs`` / ``provides``; ``CAPABILITIES`` below):

- from the backend: ``logits``, ``sparse_old``, ``grad_entropy``, ``critic``, ``rollout_logp``,
  ``h_ini``, ``batch_entropy``, ``norm_len``, ``groups``;
- between components: ``token_clip`` (an objective with ``clip_ratio_low/high`` that an entropy
  controller may steer: ADAPO), ``partial_responses`` (an estimator that scores responses a T-PPO
  window left unfinished: GAE, EGAE).

Torch-free on purpose (validation and the verl translation import it on machines without torch).

    from runners.algorithms.method import Method
    method = Method.from_config(cfg)            # a composed cell config
    method.requires("critic"), method.sparse    # what the backend must provide
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from runners.algorithms import REGISTRIES

# capability -> what it means (a backend provides BACKEND_CAPABILITIES; components the rest)
CAPABILITIES: dict[str, str] = {
    "logits": "the current temperature-scaled logits [B,T,V], differentiable, in the loss",
    "sparse_old": "the sampling policy's sparse top-K distribution per response token (index, log-prob)",
    "grad_entropy": "the current token entropy [B,T], differentiable, in the loss",
    "critic": "a value model trained beside the policy (values per response token)",
    "rollout_logp": "the rollout engine's log-probs of the sampled tokens [B,T]",
    "h_ini": "the initial model's mean token entropy on the first training prompts (GTPO's filter)",
    "batch_entropy": "the training batch's token-mean entropy once per iteration, before the update",
    "norm_len": "a constant response length dividing each sequence's token sum (loss_agg.norm_len)",
    "groups": "whole prompt groups of n >= 2 responses in every batch",
    "token_clip": "an objective with clip_ratio_low / clip_ratio_high that a controller may set per iteration",
    "partial_responses": "an estimator that scores responses a truncated rollout window left unfinished",
}
# what a backend itself supplies (the rest must come from another component of the cell)
BACKEND_CAPABILITIES = frozenset(
    ("logits", "sparse_old", "grad_entropy", "critic", "rollout_logp", "h_ini", "batch_entropy", "norm_len", "groups")
)

# defaults of the sparse old distribution (TROLL section 3.2: K = 64, mass 1 - 1e-5, p_d = 1e-12)
SPARSE_DEFAULTS: dict[str, Any] = {"top_k": 64, "tail_mass": 1e-5, "p_default": 1e-12, "chunk_size": 1024}

# the component groups of a method: the registries, by config group
GROUPS = REGISTRIES


def _plain(node: Any) -> dict[str, Any]:
    """A config node (DictConfig, dataclass-like mapping, dict, None) as a plain dict without ``name``."""
    if node is None:
        return {}
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(node, DictConfig):
            node = OmegaConf.to_container(node, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf ships with hydra
        pass
    return {k: v for k, v in dict(node).items() if k != "name"}


@dataclass(frozen=True)
class Method:
    """The components of a cell's policy update and their keyword arguments (trainer keys removed)."""

    estimator: str = "grpo"
    objective: str = "clip"
    mask: str = "none"
    entropy_control: str = "none"
    loss_agg: str = "token-mean"
    rollout_correction: str = "none"
    estimator_kw: Mapping[str, Any] = field(default_factory=dict)
    objective_kw: Mapping[str, Any] = field(default_factory=dict)
    mask_kw: Mapping[str, Any] = field(default_factory=dict)
    entropy_control_kw: Mapping[str, Any] = field(default_factory=dict)
    rollout_correction_kw: Mapping[str, Any] = field(default_factory=dict)
    # keys the trainer consumes, by group (e.g. {"objective": {"top_k": 64, "tail_mass": 1e-5}})
    trainer_kw: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # constant divisor of seq-mean-token-sum-norm (None: the caller's padded width)
    norm_len: int | None = None
    # coefficient of the k3 KL-to-reference term (0: no reference policy)
    kl_coef: float = 0.0

    def __post_init__(self) -> None:
        for group, registry in GROUPS.items():
            registry.entry(getattr(self, group))  # raises, listing the valid names

    # -- construction -----------------------------------------------------------------------------
    @classmethod
    def from_params(cls, **groups: Any) -> Method:
        """From ``<group>=name`` and ``<group>_params=mapping`` (trainer keys split off here).

        Also takes ``norm_len`` and ``kl_coef``. Unknown names raise ``UnknownNameError``.
        """
        kw: dict[str, Any] = {}
        trainer_kw: dict[str, dict[str, Any]] = {}
        for group, registry in GROUPS.items():
            name = groups.pop(group, cls.__dataclass_fields__[group].default)
            params = _plain(groups.pop(f"{group}_params", None))
            own = registry.entry(name).trainer_keys
            trainer_kw[group] = {k: params.pop(k) for k in own if k in params}
            kw[group] = name
            if group != "loss_agg":
                kw[f"{group}_kw"] = params
        unknown = sorted(set(groups) - {"norm_len", "kl_coef"})
        if unknown:
            raise TypeError(f"Method.from_params got unknown arguments {unknown}")
        return cls(**kw, trainer_kw={g: v for g, v in trainer_kw.items() if v}, **groups)

    @classmethod
    def from_config(cls, cfg: Any) -> Method:
        """From a composed cell config (``cfg.estimator`` ... ``cfg.loss_agg``, ``cfg.trainer``)."""
        edges = list(cfg.trainer.length_buckets)
        mask_params = {**_plain(cfg.mask), "length_edges": edges, "position_edges": edges}
        return cls.from_params(
            estimator=str(cfg.estimator.name),
            estimator_params=cfg.estimator,
            objective=str(cfg.objective.name),
            objective_params=cfg.objective,
            mask=str(cfg.mask.name),
            mask_params=mask_params,
            entropy_control=str(cfg.entropy_control.name),
            entropy_control_params=cfg.entropy_control,
            loss_agg=str(cfg.loss_agg.name),
            rollout_correction=str(cfg.rollout_correction.name) if "rollout_correction" in cfg else "none",
            rollout_correction_params=cfg.get("rollout_correction"),
            norm_len=int(cfg.loss_agg.norm_len or cfg.rollout.max_response_length),
            kl_coef=float(cfg.trainer.kl_coef),
        )

    # -- declarations -----------------------------------------------------------------------------
    def names(self) -> dict[str, str]:
        return {group: getattr(self, group) for group in GROUPS}

    def _entries(self):
        return [GROUPS[group].entry(name) for group, name in self.names().items()]

    @property
    def provided(self) -> frozenset[str]:
        """Capabilities the components offer each other."""
        return frozenset().union(*(e.provides for e in self._entries()))

    @property
    def needs(self) -> frozenset[str]:
        """Everything the components need, from the backend or from each other."""
        return frozenset().union(*(e.needs for e in self._entries()))

    def requires(self, capability: str) -> bool:
        """Whether a component of the method needs ``capability`` (a key of ``CAPABILITIES``)."""
        if capability not in CAPABILITIES:
            raise KeyError(f"unknown capability {capability!r}; valid: {', '.join(CAPABILITIES)}")
        return capability in self.needs

    def unmet(self) -> list[tuple[str, str]]:
        """(group, capability) pairs a component needs from another component that none provides."""
        provided = self.provided
        return [
            (group, need)
            for group, name in self.names().items()
            for need in sorted(GROUPS[group].entry(name).needs)
            if need not in BACKEND_CAPABILITIES and need not in provided
        ]

    def needing(self, capability: str) -> list[str]:
        """``group=name`` of the components that need ``capability`` (for messages)."""
        return [f"{g}={n}" for g, n in self.names().items() if capability in GROUPS[g].entry(n).needs]

    # -- trainer-owned settings ------------------------------------------------------------------
    def trainer_key_conflicts(self) -> list[tuple[str, str, str]]:
        """(key, group, other group) where two components set one trainer key to different values."""
        seen: dict[str, tuple[str, Any]] = {}
        out = []
        for group in GROUPS:
            for key, value in self.trainer_kw.get(group, {}).items():
                if key in seen and seen[key][1] != value:
                    out.append((key, seen[key][0], group))
                seen.setdefault(key, (group, value))
        return out

    @property
    def sparse(self) -> dict[str, Any]:
        """Settings of the sparse old distribution (``troll.sparsify``: k, delta, p_default, chunk_size).

        From the components that own them (the ``top_k`` / ``tail_mass`` trainer keys of TROLL and
        the exact-KL masks, which must agree: ``trainer_key_conflicts``; TROLL's ``p_default`` /
        ``chunk_size`` arguments), else ``SPARSE_DEFAULTS``.
        """
        owned: dict[str, Any] = {}
        for group in GROUPS:
            owned.update(self.trainer_kw.get(group, {}))
        objective_kw = dict(self.objective_kw)
        value = {key: owned.get(key, objective_kw.get(key, default)) for key, default in SPARSE_DEFAULTS.items()}
        return {
            "k": int(value["top_k"]),
            "delta": float(value["tail_mass"]),
            "p_default": float(value["p_default"]),
            "chunk_size": int(value["chunk_size"]),
        }

    @property
    def h_ini_prompts(self) -> int:
        """Prompts GTPO's initial entropy is measured on (its ``h_ini_prompts`` trainer key)."""
        return int(self.trainer_kw.get("objective", {}).get("h_ini_prompts", 100))


__all__ = ["BACKEND_CAPABILITIES", "CAPABILITIES", "Method", "SPARSE_DEFAULTS"]
