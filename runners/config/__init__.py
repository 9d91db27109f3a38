"""Configuration: Hydra config tree (conf/), sweeps (sweeps/), structured schemas and validation.

- ``compose(overrides)`` composes one cell the way ``trustbench run`` does and validates it.
- ``run_key(cfg)`` is the stable identity of a cell: a hash of the resolved config without the
  fields that do not change what is trained (launcher, tracking, display label, progress bar).
- ``method_label(cfg, choices)`` names a run for tables and the MLflow UI: the preset's label plus
  every component swapped away from the preset (``GRPO + TROLL``, ``GRPO + TRM-Max + REPO-R``).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping, Sequence

import yaml
from omegaconf import DictConfig, OmegaConf

from runners.config.errors import ConfigError
from runners.config.schema import TrustbenchConfig, register_configs
from runners.config.validate import validate
from runners.paths import CONF_DIR, SWEEPS_DIR, repo_root

SEARCHPATH_OVERRIDE = f"hydra.searchpath=[file://{repo_root()}]"

# top-level keys that do not change what a cell trains
NON_SEMANTIC_KEYS = ("tracking", "launcher", "label", "progress", "force", "debug", "hydra")
# a group's option when a preset does not choose it (swapping it shows in the label too)
COMPONENT_DEFAULTS = {"rollout_correction": "none"}
# groups named first in a label, in this order; the other component groups (every registry of
# runners.algorithms.REGISTRIES) follow in registry order
LABEL_FIRST = ("objective", "mask", "entropy_control", "estimator", "loss_agg", "rollout")


def component_groups() -> tuple[str, ...]:
    """The groups a cell composes its method from, in label order: every algorithm registry and the rollout."""
    from runners.algorithms import REGISTRIES

    return (*LABEL_FIRST, *(group for group in REGISTRIES if group not in LABEL_FIRST))


def component_label(group: str, option: str) -> str:
    """Display name of a group's option: declared on its registry line (``label`` / ``preset_labels``)
    or the rollout mode's (``schema.ROLLOUT_MODES``); ``group=option`` when none is declared."""
    from runners.algorithms import REGISTRIES
    from runners.config.schema import ROLLOUT_MODES

    if group in REGISTRIES:
        label = REGISTRIES[group].label(option)
    else:
        label = ROLLOUT_MODES.get(option) if group == "rollout" else None
    return label or f"{group}={option}"


def _div(numerator: int, denominator: int) -> int:
    """``${div:a,b}`` in a config: integer division, at least 1 (``conf/regime/multi_epoch.yaml`` takes a
    quarter of ``trainer.prompts_per_step`` per mini-batch with it)."""
    return max(1, int(numerator) // int(denominator))


def preset_components(name: str) -> DictConfig:
    """``${preset_components:NAME}``: the components the algorithm preset ``conf/algorithm/NAME.yaml`` selects,
    read from its defaults list (``- override /objective: clip`` gives ``{objective: clip}``), so that
    ``algorithm.components`` (logged with every run; method labels name the components swapped from it)
    is written once, in the list that selects them. Empty for a name without a preset file."""
    return OmegaConf.create(_preset_components(str(name)))


@functools.cache
def _preset_components(name: str) -> dict[str, str]:
    path = CONF_DIR / "algorithm" / f"{name}.yaml"
    if not path.is_file():
        return {}
    chosen = {}
    for entry in yaml.safe_load(path.read_text()).get("defaults", []):
        for key, option in entry.items() if isinstance(entry, dict) else ():
            if key.startswith("override /"):
                chosen[key.removeprefix("override /")] = str(option)
    return chosen


OmegaConf.register_new_resolver("div", _div, replace=True)
OmegaConf.register_new_resolver("preset_components", preset_components, replace=True)


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
    for group in component_groups():
        chosen = choices.get(group)
        base = preset.get(group, COMPONENT_DEFAULTS.get(group))
        if chosen is not None and base is not None and chosen != base:
            extras.append(component_label(group, chosen))
    return " + ".join([label, *extras])


def run_name(cfg: DictConfig, label: str) -> str:
    """Readable MLflow run name, method and seed first: ``GRPO + TROLL · s0``. The MLflow runs table
    cuts names to its narrow first column; the model and dataset are the run's ``model`` and
    ``dataset`` tags (columns of its runs view, ``runners.mlflow_ui``) and params."""
    return f"{label} · s{cfg.seed}"


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
    "ConfigError",
    "SWEEPS_DIR",
    "TrustbenchConfig",
    "component_groups",
    "component_label",
    "compose",
    "method_label",
    "register_configs",
    "resolved",
    "run_key",
    "run_name",
    "validate",
]
