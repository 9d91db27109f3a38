"""Configuration: Hydra config tree (conf/), sweeps (sweeps/), structured schemas and validation.

- ``compose(overrides)`` composes one cell the way ``trustbench run`` does and validates it.
- ``run_key(cfg)`` is the stable identity of a cell: a hash of the resolved config without the
  fields that do not change what is trained (launcher, tracking, display label, progress bar).
- ``method_label(cfg, choices)`` names a run for tables and the MLflow UI: the preset's label plus
  every component swapped away from the preset (``GRPO + TROLL``, ``GRPO + TRM-Max + REPO-R``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from runners.config.schema import TrustbenchConfig, register_configs
from runners.config.validate import ConfigError, validate
from runners.paths import repo_root

CONF_DIR: Path = repo_root() / "conf"
SWEEPS_DIR: Path = repo_root() / "sweeps"
SEARCHPATH_OVERRIDE = f"hydra.searchpath=[file://{repo_root()}]"

# top-level keys that do not change what a cell trains
NON_SEMANTIC_KEYS = ("tracking", "launcher", "label", "progress", "force", "debug", "hydra")
COMPONENT_GROUPS = ("estimator", "objective", "mask", "entropy_control", "loss_agg", "rollout_correction", "rollout")
# a group's option when a preset does not choose it (swapping it shows in the label too)
COMPONENT_DEFAULTS = {"rollout_correction": "none"}

# display names of swapped components
COMPONENT_LABELS = {
    "objective": {
        "clip": "Clip",
        "dapo_clip": "Clip-Higher",
        "dual_clip": "Dual-Clip",
        "token_is": "Token-IS",
        "gspo": "GSPO",
        "gpg": "GPG",
        "bapo": "BAPO",
        "troll": "TROLL",
        "troll_seq": "TROLL-Seq",
        "gtpo": "GTPO",
    },
    "mask": {
        "none": "NoMask",
        "trm_max": "TRM-Max",
        "trm_avg": "TRM-Avg",
        "trm_max_avg": "TRM-Max&Avg",
        "trm_max_k2": "TRM-Max(k2)",
        "trm_avg_k3": "TRM-Avg(k3)",
        "trm_max_avg_sample": "TRM-Max&Avg(k2,k3)",
        "ln_trm": "LN-TRM",
        "ser": "SER",
    },
    "entropy_control": {"none": "NoEC", "bonus": "EntBonus", "repo_r": "REPO-R", "repo_d": "REPO-D", "adapo": "ADAPO"},
    "rollout": {"full": "Full", "truncated": "Truncated"},
    "rollout_correction": {"token_tis": "TIS", "seq_max_k2": "RS-max-k2", "seq_max_k3": "RS-max-k3"},
}


def resolved(cfg: DictConfig) -> dict:
    """The fully resolved config as plain containers (no Hydra node)."""
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)  # type: ignore[return-value]


def run_key(cfg: DictConfig | Mapping) -> str:
    """Stable 16-hex identity of a cell (same config -> same key, across machines and sessions)."""
    data = resolved(cfg) if isinstance(cfg, DictConfig) else dict(cfg)
    data = {k: v for k, v in data.items() if k not in NON_SEMANTIC_KEYS}
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def method_label(cfg: DictConfig, choices: Mapping[str, str] | None = None) -> str:
    """Display label: ``cfg.label`` if set, else the preset label plus swapped components."""
    if cfg.get("label"):
        return str(cfg.label)
    label = str(cfg.algorithm.label)
    preset = cfg.algorithm.get("components") or {}
    if not choices:
        return label
    extras = []
    for group in ("objective", "mask", "entropy_control", "estimator", "loss_agg", "rollout", "rollout_correction"):
        chosen = choices.get(group)
        base = preset.get(group, COMPONENT_DEFAULTS.get(group))
        if chosen is not None and base is not None and chosen != base:
            extras.append(COMPONENT_LABELS.get(group, {}).get(chosen, f"{group}={chosen}"))
    return " + ".join([label, *extras])


def run_name(cfg: DictConfig, label: str) -> str:
    """Readable MLflow run name: ``GRPO + TROLL | embedded | embedded | s0``."""
    return f"{label} | {cfg.model.name} | {cfg.dataset.name} | s{cfg.seed}"


_INITIALIZED = False


def compose(overrides: Sequence[str] = (), *, check: bool = True) -> tuple[DictConfig, dict[str, str]]:
    """Compose (and validate) one cell; returns the config and Hydra's group choices."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_configs()
    global _INITIALIZED
    if not (_INITIALIZED and GlobalHydra.instance().is_initialized()):
        GlobalHydra.instance().clear()
        initialize_config_dir(config_dir=str(CONF_DIR), version_base=None)
        _INITIALIZED = True
    cfg = hydra_compose("config", overrides=[*overrides, SEARCHPATH_OVERRIDE], return_hydra_config=True)
    choices = dict(cfg.hydra.runtime.choices)
    with _open(cfg):
        del cfg["hydra"]
    if check:
        validate(cfg)
    return cfg, choices


class _open:
    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg

    def __enter__(self):
        OmegaConf.set_struct(self.cfg, False)

    def __exit__(self, *exc):
        OmegaConf.set_struct(self.cfg, True)


__all__ = [
    "CONF_DIR",
    "COMPONENT_GROUPS",
    "ConfigError",
    "SWEEPS_DIR",
    "TrustbenchConfig",
    "compose",
    "method_label",
    "register_configs",
    "resolved",
    "run_key",
    "run_name",
    "validate",
]
