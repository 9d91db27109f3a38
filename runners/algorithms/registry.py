"""Registries: one per extension point of the algorithm library.

Design: a registry maps a short config name ("grpo", "troll", "trm_max", ...) to a target that is
either a callable or a lazy ``"module:attr"`` string. Lazy targets keep ``import runners.algorithms``
free of torch and verl, so ``analysis`` and the CLI can list names without importing either.
Registering a name twice raises; looking up an unknown name raises with the list of valid names.

    from runners.algorithms import ESTIMATORS
    fn = ESTIMATORS.get("grpo")            # imports runners.algorithms.estimators on first use

Plugins register their own entries the same way::

    @OBJECTIVES.register("my_objective")
    def my_objective(inp, **params): ...
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any


class UnknownNameError(KeyError):
    """Raised when a registry has no entry of the requested name."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0])


class Registry:
    """A name -> target map for one extension point (e.g. ``kind="estimator"``)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._targets: dict[str, str | Callable[..., Any]] = {}
        self._resolved: dict[str, Callable[..., Any]] = {}

    def register(self, name: str, target: str | Callable[..., Any] | None = None):
        """Register ``target`` under ``name``; without ``target`` acts as a decorator.

        ``target`` may be a ``"package.module:attr"`` string, imported on first ``get``.
        """
        if target is None:

            def decorator(obj: Callable[..., Any]) -> Callable[..., Any]:
                self.register(name, obj)
                return obj

            return decorator
        if name in self._targets:
            raise ValueError(
                f"{self.kind} {name!r} is already registered (to {self._describe(self._targets[name])}); "
                f"refusing to register {self._describe(target)}"
            )
        if isinstance(target, str) and ":" not in target:
            raise ValueError(f"lazy target for {self.kind} {name!r} must look like 'module:attr', got {target!r}")
        self._targets[name] = target
        return target

    def get(self, name: str) -> Callable[..., Any]:
        """Return the callable registered as ``name`` (importing it if lazy)."""
        if name in self._resolved:
            return self._resolved[name]
        if name not in self._targets:
            raise UnknownNameError(f"unknown {self.kind} {name!r}; valid names: {', '.join(self.names())}")
        target = self._targets[name]
        if isinstance(target, str):
            module_name, attr = target.split(":", 1)
            obj: Any = importlib.import_module(module_name)
            for part in attr.split("."):
                obj = getattr(obj, part)
            target = obj
        self._resolved[name] = target
        return target

    def names(self) -> list[str]:
        return sorted(self._targets)

    def __contains__(self, name: object) -> bool:
        return name in self._targets

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._targets)

    @staticmethod
    def _describe(target: str | Callable[..., Any]) -> str:
        if isinstance(target, str):
            return target
        return f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', repr(target))}"

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"
