"""The keys ``model.options`` may hold for each model kind, checked at compose time.

``model.options`` are the keyword arguments of the kind's loader (``runners.models.loader``): a
misspelt key would otherwise surface only once the model is being built, or never (transformers
configs accept any attribute). The keys are read from the loader itself: its named keyword
parameters (``model.path`` / ``model.arch`` / ``model.dtype`` excepted: they have their own keys),
plus, for a loader that takes ``**kwargs``, what it passes them to (``EXTRA_KEYS``): the embedded
recipe's fields, a tiny model's transformers config fields. Importing this module imports neither
torch nor transformers; ``option_keys`` imports the loader's module (and transformers' config
classes for a tiny model) only when a cell sets options.

    option_keys("embedded")        # cache_dir, progress and the embedded recipe's fields
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import fields

# model keys of their own, never options
_OWN_KEYS = {"path", "arch", "dtype"}


def _recipe_fields(arch: str | None) -> set[str]:
    from runners.models.embedded import EmbeddedRecipe

    return {f.name for f in fields(EmbeddedRecipe)} - {"version"}


def _tiny_config_fields(arch: str | None) -> set[str]:
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    config = {"qwen2": Qwen2Config, "qwen3": Qwen3Config, "llama": LlamaConfig}.get(arch or "qwen2", Qwen2Config)
    return set(config().to_dict())


# model kind -> the keys its loader's **kwargs accept, given model.arch (hub: none, it refuses them)
EXTRA_KEYS: dict[str, Callable[[str | None], set[str]]] = {
    "embedded": _recipe_fields,
    "tiny": _tiny_config_fields,
    "hub": lambda arch: set(),
}


def option_keys(kind: str, arch: str | None = None) -> set[str] | None:
    """The keys ``model.options`` may hold for ``kind`` (None: its loader takes keywords nobody lists)."""
    from runners.models.loader import MODEL_KINDS

    params = inspect.signature(MODEL_KINDS.get(kind)).parameters.values()
    named = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)} - _OWN_KEYS
    if not any(p.kind == p.VAR_KEYWORD for p in params):
        return named
    extra = EXTRA_KEYS.get(kind)
    return None if extra is None else named | extra(arch)
