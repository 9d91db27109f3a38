"""Hydra's override grammar: writing trustbench values as ``key=value`` lines verl's Hydra accepts.

``format_value`` quotes strings unless they are plainly safe, writes dicts and lists in Hydra's
syntax, and refuses dict keys Hydra would turn into bool / None / float. It is the one writer of
Hydra values: the translation's lines and the plugin selection (``plugin_overrides``) both use it.
``merge_overrides`` lets a user's ``backend.options.overrides`` replace generated lines of the same
key. Tests round-trip values through Hydra's own parser (``tests/verl/test_translate.py``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from runners.config.validate import ConfigError

_PLAIN = re.compile(r"^[A-Za-z0-9_./:-]+$")
_KEY = re.compile(r"^[+~]{0,2}([A-Za-z0-9_.@/-]+)=")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# words Hydra's parser reads, in any letter case, as bool, None or float rather than as a string
_CONVERTED_WORDS = ("true", "false", "null", "inf", "nan")


def format_value(value: Any) -> str:
    """A Python value in Hydra's override grammar (strings quoted unless plainly safe)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"non-finite override value {value!r}")
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        for key in value:
            # Hydra turns the keys true / false / null / inf / nan (any case) into bool, None or float
            if not (isinstance(key, str) and _IDENT.match(key)) or key.lower() in _CONVERTED_WORDS:
                raise ValueError(f"dict key {key!r} cannot be written as a Hydra override")
        return "{" + ",".join(f"{k}:{format_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if _PLAIN.match(text) and text.lower() not in _CONVERTED_WORDS and not _looks_numeric(text):
        return text
    # Hydra quoted strings: backslashes are literal except a run before a quote or the end (halved)
    text = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    text = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, text)
    return "'" + text + "'"


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def format_override(key: str, value: Any) -> str:
    return f"{key}={format_value(value)}"


def override_key(override: str) -> str:
    """The config key an override sets (``+a.b=1`` -> ``a.b``)."""
    match = _KEY.match(override)
    if not match:
        raise ConfigError("backend.options.overrides", f"{override!r} is not a key=value override")
    return match.group(1)


def merge_overrides(generated: Sequence[str], extra: Sequence[str]) -> list[str]:
    """``generated`` with each ``extra`` override replacing the generated one of the same key."""
    extra_keys = {override_key(o) for o in extra}
    return [o for o in generated if override_key(o) not in extra_keys] + list(extra)
