"""Rules a config value must satisfy (``Check``) and the common ones, and the error a broken rule raises
(``ConfigError``): the bottom of the config layer.

Imports nothing of the project and no config library, so that the algorithm registry
(``runners.algorithms``), which declares each component's checks, loads without Hydra or OmegaConf
(``analysis`` imports ``runners.algorithms.bounds``; tests/test_layering.py). The config dataclasses
(``runners.algorithms.components``) attach these checks to their fields, and ``runners.config.validate``
applies them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """A configuration value that cannot run; ``key`` is the dotted config key (or the name of an
    environment variable, in capitals), ``reason`` the why."""

    def __init__(self, key: str, message: str) -> None:
        self.key, self.reason = key, message
        where = f"environment variable {key}" if key.isupper() else f"config key '{key}'"
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class Check:
    """A rule one config value must satisfy, and how to say it when it does not."""

    ok: Callable[[Any], bool]
    what: str

    def holds(self, value: Any) -> bool:
        try:
            return bool(self.ok(value))
        except TypeError:  # None or a string where a number belongs
            return False


POSITIVE = Check(lambda v: v is not None and v > 0 and math.isfinite(v), "must be > 0")
NON_NEGATIVE = Check(lambda v: v is not None and v >= 0, "must be >= 0")
OPEN_UNIT = Check(lambda v: 0 < v < 1, "must be in (0, 1)")
UNIT = Check(lambda v: 0 <= v <= 1, "must be in [0, 1]")
OPEN_UNIT_OR_ONE = Check(lambda v: 0 < v <= 1, "must be in (0, 1]")
GREATER_THAN_ONE = Check(lambda v: v > 1, "must be > 1")
BELOW_ONE = Check(lambda v: v < 1, "must be < 1 (the ratio's lower bound is 1 - value)")
DUAL_CLIP = Check(lambda v: v is None or v > 1, "dual-clip bound must be > 1")


def at_least(low: int) -> Check:
    return Check(lambda v: v is not None and v >= low, f"must be >= {low}")


def one_of(*allowed: Any) -> Check:
    return Check(lambda v: v in allowed, f"must be one of {', '.join(map(str, allowed))}")


def check_arguments(owner: str, schema: type | None, **values: Any) -> None:
    """Apply ``schema``'s declared checks to keyword arguments; ``ValueError`` naming the first that fails.

    ``schema`` is a component's config dataclass (fields with ``checks`` metadata and an optional
    ``cross_checks(node)``): a registered function called outside a validated config (a test, a
    plugin) refuses exactly what the config validation refuses, with the same rules. Fields absent
    from ``values`` are skipped, and so is a cross-field rule that reads one.
    """
    fields = getattr(schema, "__dataclass_fields__", {})
    for key, value in values.items():
        for check in fields[key].metadata.get("checks", ()) if key in fields else ():
            if not check.holds(value):
                raise ValueError(f"{owner} {key} {check.what} (got {value!r})")
    node = type("Arguments", (), dict(values))
    try:
        for key, ok, message in getattr(schema, "cross_checks", lambda _: ())(node):
            if not ok:
                raise ValueError(f"{owner} {key} {message} (got {values[key]!r})")
    except AttributeError:  # a rule on a field the caller does not pass (a trainer key)
        return
