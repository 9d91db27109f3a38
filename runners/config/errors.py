"""``ConfigError``, the error of every configuration check (defined in ``runners.checks``, the bottom of the
config layer, so that layers under the config's, such as the datasets, raise it without importing this
package), and ``Checker``, the key-by-key checks the validation modules share (``runners.config.validate``,
``runners.config.validate_more``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, OmegaConf

from runners.checks import ConfigError


class Checker:
    """Checks of ``cfg``'s values by dotted key, each raising ``ConfigError`` naming the key."""

    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg

    def get(self, key: str) -> Any:
        return OmegaConf.select(self.cfg, key, throw_on_missing=True)

    def require(self, key: str, ok: Callable[[Any], bool], what: str) -> None:
        value = self.get(key)
        try:
            good = ok(value)
        except TypeError:
            good = False
        if not good:
            raise ConfigError(key, f"{what} (got {value!r})")

    def positive(self, *keys: str) -> None:
        for key in keys:
            self.require(key, lambda v: v is not None and v > 0 and math.isfinite(v), "must be > 0")

    def non_negative(self, *keys: str) -> None:
        for key in keys:
            self.require(key, lambda v: v is not None and v >= 0, "must be >= 0")

    def at_least(self, key: str, low: int) -> None:
        self.require(key, lambda v: v is not None and v >= low, f"must be >= {low}")

    def one_of(self, key: str, allowed) -> None:
        allowed = tuple(allowed)
        self.require(key, lambda v: v in allowed, f"must be one of {', '.join(map(str, allowed))}")

    def in_open_unit(self, *keys: str) -> None:
        for key in keys:
            self.require(key, lambda v: 0 < v < 1, "must be in (0, 1)")
