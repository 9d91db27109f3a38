"""The keys ``model.options`` may hold for each model kind, checked at compose time.

``model.options`` are the keyword arguments of the kind's loader (``runners.models.loader``): a
misspelt key would otherwise surface only once the model is being built, or never (transformers
configs accept any attribute). ``runners.config.validate`` reads ``option_keys``; importing this
module imports neither torch nor transformers (a tiny model's config keys are read from
transformers only when a tiny model is given options).

    option_keys("embedded")        # the embedded recipe's fields, cache_dir, progress
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields


def _embedded(arch: str | None) -> set[str]:
    from runners.models.embedded import EmbeddedRecipe

    return ({f.name for f in fields(EmbeddedRecipe)} - {"version"}) | {"cache_dir", "progress"}


def _tiny(arch: str | None) -> set[str]:
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    config = {"qwen2": Qwen2Config, "qwen3": Qwen3Config, "llama": LlamaConfig}.get(arch or "qwen2", Qwen2Config)
    return {"seed", *config().to_dict()}


# model kind -> the option keys its loader takes, given model.arch
OPTION_KEYS: dict[str, Callable[[str | None], set[str]]] = {
    "embedded": _embedded,
    "smollm2": lambda arch: set(),
    "hub": lambda arch: {"trust_remote_code"},
    "tiny": _tiny,
}


def option_keys(kind: str, arch: str | None = None) -> set[str] | None:
    """The keys ``model.options`` may hold for ``kind`` (None: a kind registered without a list)."""
    keys = OPTION_KEYS.get(kind)
    return None if keys is None else keys(arch)
