"""Fast composition of a sweep's cells, identical to Hydra's full composition.

composing a cell with Hydra takes ~0.3 s, so a 256-cell grid would
take over a minute. A cell's config is (1) the config files its group overrides select, merged in
order, then (2) its value overrides applied with OmegaConf. Step 1 runs once per distinct
combination of group overrides, without the ``hydra`` node cells do not need; step 2 uses Hydra's
own ``_apply_overrides_to_config``. Cells of one combination whose value overrides set the same
scalar keys reuse one scratch copy (each cell rewrites every key the previous one set). Anything
else (a ``hydra.*`` or deletion override in a cell) falls back to Hydra's full composition.
``tests/test_sweep_plan.py`` checks the result equals full composition for every real sweep.
Validation runs once per distinct config up to ``seed`` (``VALIDATION_FREE_KEYS``: the validator
never reads it; a test holds it to that).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hydra._internal.config_repository import CachingConfigRepository
from omegaconf import DictConfig, OmegaConf, flag_override

# keys the validator never reads: cells differing only there share one validation
VALIDATION_FREE_KEYS = ("seed",)


def master_hydra(overrides: Sequence[str]):
    """A Hydra instance and the composed MULTIRUN master config for ``overrides``."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    from runners.config import CONF_DIR, register_configs

    register_configs()
    GlobalHydra.instance().clear()
    hydra = Hydra.create_main_hydra2(
        task_name="trustbench", config_search_path=create_config_search_path(str(CONF_DIR))
    )
    master = hydra.compose_config("config", list(overrides), run_mode=RunMode.MULTIRUN, with_log_configuration=False)
    return hydra, master


def _bare_key(key: str) -> str:
    return key.strip().lstrip("+~")


def expand_grid(
    master: DictConfig, user_overrides: Sequence[str], config_loader, fixed_overrides: Sequence[str] = ()
) -> list[list[str]]:
    """Cells as override lists: sweep params x command-line sweeps (Hydra BasicSweeper semantics).

    ``fixed_overrides`` are the command line's single-value overrides: one that sets a key the sweep
    sweeps pins that axis to its value (as in Hydra, where the last override of a key wins).
    """
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = master.hydra.sweeper.get("params") or {}
    arguments = [f"{k}={v}" for k, v in params.items()] + list(user_overrides)
    # a later override of the same key replaces the sweep's axis (`trustbench sweep demo seed=0`: one seed)
    swept = {_bare_key(k) for k in params}
    arguments += [o for o in fixed_overrides if _bare_key(o.split("=", 1)[0]) in swept]
    parsed = OverridesParser.create(config_loader=config_loader).parse_overrides(arguments)
    batches = BasicSweeper.split_arguments(parsed, None)
    return [list(cell) for batch in batches for cell in batch]


# -- composing cells -------------------------------------------------------------------------------------
@dataclass
class Composed:
    """One cell's configuration as the planner needs it."""

    cfg: DictConfig  # without the hydra node; may be reused by the next cell: read it at once
    choices: dict[str, str]  # Hydra's group choices (method labels)
    data: dict | None  # resolved plain config; None if it does not resolve (validate names the key)
    check: Any  # equal for cells whose configs are equal up to VALIDATION_FREE_KEYS


@dataclass
class _Combo:
    cfg: DictConfig
    choices: dict[str, str]
    data: dict | None  # resolved, when the config holds no interpolation (cells patch a copy)


class Composer:
    """Cell configs equal to Hydra's full composition, composing once per group-override combination.

    Config files are parsed once for the whole plan (``_SharedFiles``; each composition gets its own
    deep copies, as Hydra's per-composition cache would). When a combination holds no interpolation,
    a cell's resolved config is the combination's with the overridden keys set to the values the
    typed config converted them to (read back from it), so most cells are never resolved whole.
    """

    def __init__(self, hydra, master: DictConfig, base: Sequence[str]) -> None:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        self.hydra, self.master = hydra, master
        self.loader = hydra.config_loader
        self.parser = OverridesParser.create()
        self.prefix = [str(o) for o in master.hydra.overrides.hydra]  # e.g. the sweeps search path
        self.base = list(base)
        _, self.repo = self.loader._parse_overrides_and_create_caching_repo("config", self.prefix + self.base)
        self.files: dict[str, Any] = {}
        self._parsed: dict[str, Any] = {}
        self._combos: dict[tuple, _Combo] = {}
        self._scratch: dict[tuple, tuple[tuple, DictConfig]] = {}
        self.full_compositions = 0

    def _parse(self, text: str):
        if text not in self._parsed:
            self._parsed[text] = self.parser.parse_override(text)
        return self._parsed[text]

    def compose(self, cell: Sequence[str]) -> Composed:
        """The cell's configuration (Hydra's full composition only for unusual overrides)."""
        from hydra.core.override_parser.types import OverrideType

        groups, values = [], []
        for text in cell:
            o = self._parse(text)
            if o.is_hydra_override() or o.is_sweep_override():
                return self._full(cell)
            is_group = self.repo.group_exists(o.key_or_group) and not isinstance(o.value(), dict)
            if is_group and (o.is_delete() or o.is_force_add()):
                return self._full(cell)
            (groups if is_group else values).append(text)
        combo = tuple(groups)
        if combo not in self._combos:
            self._combos[combo] = self._compose_combo(groups)
        entry = self._combos[combo]
        if not values:
            return Composed(
                entry.cfg, entry.choices, entry.data if entry.data is not None else _resolve(entry.cfg), (combo,)
            )
        parsed = [self._parse(t) for t in values]
        signature = tuple((o.key_or_group, o.type) for o in parsed)
        scalar = all(o.type == OverrideType.CHANGE and not isinstance(o.value(), (dict, list)) for o in parsed)
        held = self._scratch.get(combo)
        if scalar and held is not None and held[0] == signature:
            cfg = held[1]  # every key the previous cell set is set again
        else:
            cfg = copy.deepcopy(entry.cfg)
            if scalar:
                self._scratch[combo] = (signature, cfg)
        _apply_overrides(parsed, cfg)
        patched = _patch(entry.data, cfg, parsed) if scalar and entry.data is not None else None
        if patched is not None:
            check = (combo, *((k, v) for k, v in patched[1] if k not in VALIDATION_FREE_KEYS))
            return Composed(cfg, entry.choices, patched[0], check)
        data = _resolve(cfg)
        return Composed(cfg, entry.choices, data, None if data is None else _hash(data, VALIDATION_FREE_KEYS))

    def _compose_combo(self, groups: Sequence[str]) -> _Combo:
        """Hydra's composition (defaults list, merge, value overrides), skipping the hydra node's files."""
        from hydra._internal.defaults_list import create_defaults_list
        from hydra.errors import ConfigCompositionException
        from omegaconf.errors import OmegaConfBaseException

        overrides = [self._parse(t) for t in (*self.prefix, *self.base, *groups)]
        repo = _SharedFiles(self.repo.delegate, self.files)
        dl = create_defaults_list(
            repo=repo, config_name="config", overrides_list=overrides, prepend_hydra=True, skip_missing=False
        )
        cfg = OmegaConf.create()
        with flag_override(cfg, "no_deepcopy_set_nodes", True):
            for default in dl.defaults:
                if default.package == "hydra" or (default.package or "").startswith("hydra."):
                    continue  # the hydra node: cells do not need it
                loaded = self.loader._load_single_config(default=default, repo=repo).config
                if "hydra" in loaded:  # root-level files (config.yaml, sweeps, launcher profiles)
                    loaded = copy.copy(loaded)
                    with flag_override(loaded, ["readonly", "struct"], False):
                        del loaded["hydra"]
                try:
                    cfg.merge_with(loaded)
                except OmegaConfBaseException as err:
                    raise ConfigCompositionException(
                        f"In '{default.config_path}': {type(err).__name__} raised while composing config:\n{err}"
                    ) from err
        _strip_defaults(cfg)
        OmegaConf.set_struct(cfg, True)
        _apply_overrides([o for o in dl.config_overrides if not o.is_hydra_override()], cfg)
        choices = {k: v for k, v in dl.overrides.known_choices.items() if not k.startswith("hydra/")}
        raw = OmegaConf.to_container(cfg, resolve=False)
        data = _resolve(cfg) if "${" not in json.dumps(raw, default=str) else None
        return _Combo(cfg, choices, data)

    def compose_full(self, cell: Sequence[str]) -> tuple[DictConfig, dict[str, str]]:
        """Hydra's own composition of one cell (the reference, and the fallback)."""
        self.full_compositions += 1
        cfg = self.loader.load_sweep_config(self.master, [*self.base, *cell])
        choices = {k: v for k, v in cfg.hydra.runtime.choices.items() if not k.startswith("hydra/")}
        with flag_override(cfg, ["readonly", "struct"], False):
            del cfg["hydra"]
        return cfg, choices

    def _full(self, cell: Sequence[str]) -> Composed:
        cfg, choices = self.compose_full(cell)
        data = _resolve(cfg)
        return Composed(cfg, choices, data, None if data is None else _hash(data, VALIDATION_FREE_KEYS))


class _SharedFiles(CachingConfigRepository):
    """Hydra's per-composition config cache, filled from one parse of each file per plan."""

    def __init__(self, delegate, files: dict[str, Any]) -> None:  # the delegate is shared, not copied
        self.delegate = delegate  # its sources already hold the search path
        self.cache = {}
        self.files = files

    def load_config(self, config_path: str):
        if config_path not in self.cache:
            if config_path not in self.files:
                self.files[config_path] = self.delegate.load_config(config_path=config_path)
            self.cache[config_path] = copy.deepcopy(self.files[config_path])
        return self.cache[config_path]


def _resolve(cfg: DictConfig) -> dict | None:
    try:
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)  # type: ignore[return-value]
    except Exception:  # noqa: BLE001 - validate() reports it, naming the key
        return None


def _patch(data: dict, cfg: DictConfig, overrides: list) -> tuple[dict, list[tuple[str, Any]]] | None:
    """``data`` with each overridden key set to its converted value in ``cfg`` (paths copied, rest shared).

    None when an override is not a plain dotted path of dict keys or sets an interpolation."""
    out = dict(data)
    values = []
    for o in overrides:
        key = o.key_or_group
        raw = o.value()
        if isinstance(raw, str) and "${" in raw:
            return None
        parts = key.split(".")
        node = out
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                return None
            node[part] = node = dict(child)
        if parts[-1] not in node:
            return None
        value = OmegaConf.select(cfg, key)
        node[parts[-1]] = value
        values.append((key, value))
    return out, values


def _apply_overrides(overrides: list, cfg: DictConfig) -> None:
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    ConfigLoaderImpl._apply_overrides_to_config(overrides, cfg)


def _strip_defaults(cfg: Any) -> None:
    """Drop the ``defaults`` lists Hydra leaves in merged nodes (as Hydra's own composition does)."""
    if isinstance(cfg, DictConfig):
        if cfg._is_missing() or cfg._is_none():
            return
        with flag_override(cfg, ["readonly", "struct"], False):
            if cfg._get_flag("HYDRA_REMOVE_TOP_LEVEL_DEFAULTS"):
                cfg._set_flag("HYDRA_REMOVE_TOP_LEVEL_DEFAULTS", None)
                cfg.pop("defaults", None)
        for _key, value in cfg.items_ex(resolve=False):
            _strip_defaults(value)


def _hash(data: dict, drop: Sequence[str]) -> str:
    import hashlib

    text = json.dumps(
        {k: v for k, v in data.items() if k not in drop}, sort_keys=True, separators=(",", ":"), default=str
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]
