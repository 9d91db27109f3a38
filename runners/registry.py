"""Registries: a short config name mapped to what it names (the bottom layer: imports nothing of the project).

Each extension point has one: the algorithm library's components (``runners.algorithms``), the
backends (``runners.backends``), the model kinds (``runners.models.loader``), the rewards
(``runners.data.rewards``). A registry maps a name ("grpo", "troll", "trm_max", ...) to a target that is
either a callable or a lazy ``"module:attr"`` string. Lazy targets keep ``import runners.algorithms``
free of torch and verl, so ``analysis`` and the CLI can list names without importing either.
Registering a name twice raises; looking up an unknown name raises with the list of valid names.

    from runners.algorithms import ESTIMATORS
    fn = ESTIMATORS.get("grpo")            # imports runners.algorithms.estimators on first use

Plugins register their own entries the same way::

    @OBJECTIVES.register("my_objective", needs=("logits",))
    def my_objective(inp, **params): ...

Declarations: an entry also states what its component needs from the backend or from the other
components of a cell (``needs``), what it offers the others (``provides``), which keys of its config
node the trainer consumes instead of passing them to the function (``trainer_keys``), and the
dataclass that types its config node (``schema``, lazy like the target, or a mapping turned into a
dataclass by the registry's ``schema_builder``). Backends and validation read
these (``Registry.entry``, ``runners.algorithms.method.Method``) instead of testing names; the words
of ``needs`` / ``provides`` are listed in ``runners.algorithms.method.CAPABILITIES``.

An entry may also carry its display name (``label``, and ``preset_labels`` for the named presets of
the entry in ``conf/<group>/``, e.g. ``dapo_clip`` of ``clip``: ``Registry.label``) and named
functions a caller looks up instead of testing the name (``hooks``, lazy like the target:
``Registry.hook``; e.g. how a model kind becomes a Hugging Face directory).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any


class UnknownNameError(KeyError):
    """Raised when a registry has no entry of the requested name."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0])


@dataclass(frozen=True)
class Entry:
    """One registered component and its declarations (see the module docstring)."""

    name: str
    target: str | Callable[..., Any]
    # what the component needs from the backend or another component (e.g. "logits", "critic")
    needs: frozenset[str] = frozenset()
    # what it offers the other components of a cell (e.g. "token_clip": clip_ratio_low/high to steer)
    provides: frozenset[str] = frozenset()
    # config keys the trainer consumes itself (never passed to the target)
    trainer_keys: tuple[str, ...] = ()
    # dataclass typing the component's config node, a lazy "module:attr" string, or a mapping
    # {field: (type, default, *checks)} built into a dataclass on first use; None: untyped
    schema: str | type | Mapping[str, tuple] | None = None
    # display name in run labels ("TROLL"); None: shown as group=name
    label: str | None = None
    # display names of named presets of this entry (conf option -> label, e.g. {"dapo_clip": "Clip-Higher"})
    preset_labels: Mapping[str, str] = field(default_factory=dict)
    # named functions of this entry (hook name -> callable or lazy "module:attr")
    hooks: Mapping[str, str | Callable[..., Any]] = field(default_factory=dict)


def _resolve(target: str | Any) -> Any:
    if not isinstance(target, str):
        return target
    module_name, attr = target.split(":", 1)
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _check_lazy(what: str, target: Any) -> None:
    if isinstance(target, str) and ":" not in target:
        raise ValueError(f"lazy {what} must look like 'module:attr', got {target!r}")


class Registry:
    """A name -> target map for one extension point (e.g. ``kind="estimator"``)."""

    def __init__(
        self, kind: str, *, schema_builder: str | Callable[[str, Mapping[str, tuple]], type] | None = None
    ) -> None:
        _check_lazy(f"schema builder of the {kind} registry", schema_builder)
        self.kind = kind
        # (class name, {field: (type, default, *checks)}) -> dataclass, for schemas declared as a mapping
        self._schema_builder = schema_builder
        self._entries: dict[str, Entry] = {}
        self._resolved: dict[str, Callable[..., Any]] = {}
        self._schemas: dict[str, type] = {}

    def register(
        self,
        name: str,
        target: str | Callable[..., Any] | None = None,
        *,
        needs: Iterable[str] = (),
        provides: Iterable[str] = (),
        trainer_keys: Iterable[str] = (),
        schema: str | type | Mapping[str, tuple] | None = None,
        label: str | None = None,
        preset_labels: Mapping[str, str] | None = None,
        hooks: Mapping[str, str | Callable[..., Any]] | None = None,
    ):
        """Register ``target`` under ``name``; without ``target`` acts as a decorator.

        ``target`` (and ``schema``, and each hook) may be a ``"package.module:attr"`` string, imported on
        first use.
        """
        declared = dict(
            needs=needs,
            provides=provides,
            trainer_keys=trainer_keys,
            schema=schema,
            label=label,
            preset_labels=preset_labels,
            hooks=hooks,
        )
        if target is None:

            def decorator(obj: Callable[..., Any]) -> Callable[..., Any]:
                self.register(name, obj, **declared)
                return obj

            return decorator
        if name in self._entries:
            raise ValueError(
                f"{self.kind} {name!r} is already registered (to {self._describe(self._entries[name].target)}); "
                f"refusing to register {self._describe(target)}"
            )
        _check_lazy(f"target for {self.kind} {name!r}", target)
        _check_lazy(f"schema for {self.kind} {name!r}", schema)
        if isinstance(schema, Mapping) and self._schema_builder is None:
            raise ValueError(
                f"{self.kind} {name!r} declares its schema as a mapping, but this registry has no schema_builder"
            )
        for hook, function in (hooks or {}).items():
            _check_lazy(f"hook {hook!r} for {self.kind} {name!r}", function)
        self._entries[name] = Entry(
            name=name,
            target=target,
            needs=frozenset(needs),
            provides=frozenset(provides),
            trainer_keys=tuple(trainer_keys),
            schema=schema,
            label=label,
            preset_labels=dict(preset_labels or {}),
            hooks=dict(hooks or {}),
        )
        return target

    def entry(self, name: str) -> Entry:
        """The declarations of ``name`` (raises ``UnknownNameError`` listing the valid names)."""
        if name not in self._entries:
            raise UnknownNameError(f"unknown {self.kind} {name!r}; valid names: {', '.join(self.names())}")
        return self._entries[name]

    def get(self, name: str) -> Callable[..., Any]:
        """Return the callable registered as ``name`` (importing it if lazy)."""
        if name not in self._resolved:
            self._resolved[name] = _resolve(self.entry(name).target)
        return self._resolved[name]

    def schema(self, name: str) -> type | None:
        """The config dataclass of ``name`` (imported if lazy); None for an untyped entry.

        A schema declared as a mapping ``{field: (type, default, *checks)}`` on the registry line is
        turned into a dataclass here by the registry's ``schema_builder`` (for the algorithm library:
        ``runners.algorithms.components.component_dataclass``).
        """
        schema = self.entry(name).schema
        if isinstance(schema, Mapping):
            if name not in self._schemas:
                self._schemas[name] = _resolve(self._schema_builder)(f"{self.kind}_{name}", schema)
            return self._schemas[name]
        return None if schema is None else _resolve(schema)

    def hook(self, name: str, hook: str) -> Callable[..., Any] | None:
        """The function ``hook`` of entry ``name`` (imported if lazy), or None when it declares none."""
        function = self.entry(name).hooks.get(hook)
        return None if function is None else _resolve(function)

    def label(self, option: str) -> str | None:
        """Display name of a config option of this group: the label of the entry ``option``, or of the
        entry that declares ``option`` among its ``preset_labels``; None when none is declared."""
        if option in self._entries and self._entries[option].label:
            return self._entries[option].label
        for entry in self._entries.values():
            if option in entry.preset_labels:
                return entry.preset_labels[option]
        return None

    def with_need(self, need: str) -> list[str]:
        """Names whose entry declares ``need`` (for messages and docs; decisions read ``entry``)."""
        return [name for name in self.names() if need in self._entries[name].needs]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def _describe(target: str | Callable[..., Any]) -> str:
        if isinstance(target, str):
            return target
        return f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', repr(target))}"

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"
