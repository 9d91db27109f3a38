"""Registries of the algorithm library (runners/registry.py) on fresh registries built here:
registration (direct and as a decorator) stores every declaration as given, lazy ``"module:attr"``
targets, schemas and hooks are checked for their colon and resolved on use (dotted attributes too),
mapping schemas become a cached config dataclass, unknown names and duplicates raise naming the
registry's kind and the name.

Written for mutation testing (``make mutation``): the registry's behaviour is otherwise exercised only
through the built-in entries, registered once at import.

Run: ``pytest tests/algorithms/test_registry_mutants.py``.
"""

from __future__ import annotations

import dataclasses
import os.path
import re

import pytest

from runners.registry import Entry, Registry, UnknownNameError

LAZY = "runners.registry:Registry.names"  # a dotted attribute after the colon


def _fn(x):
    return x


def _other(x):
    return -x


# -- registration ---------------------------------------------------------------------------------------
def test_direct_registration_stores_every_declaration():
    reg = Registry("estimator")
    out = reg.register(
        "mine",
        _fn,
        needs=["critic", "logits", "critic"],
        provides=("token_clip",),
        trainer_keys=["top_k", "tail_mass"],
        schema="runners.algorithms.components:GrpoEstimator",
        label="Mine",
        preset_labels={"mine_fast": "Mine-Fast"},
        hooks={"hf_dir": "os.path:join"},
    )
    assert out is _fn
    entry = reg.entry("mine")
    assert entry == Entry(
        name="mine",
        target=_fn,
        needs=frozenset({"critic", "logits"}),
        provides=frozenset({"token_clip"}),
        trainer_keys=("top_k", "tail_mass"),
        schema="runners.algorithms.components:GrpoEstimator",
        label="Mine",
        preset_labels={"mine_fast": "Mine-Fast"},
        hooks={"hf_dir": "os.path:join"},
    )
    assert type(entry.needs) is frozenset and type(entry.provides) is frozenset
    assert type(entry.trainer_keys) is tuple
    assert type(entry.preset_labels) is dict and type(entry.hooks) is dict


def test_direct_registration_defaults():
    reg = Registry("mask")
    reg.register("plain", _fn)
    assert reg.entry("plain") == Entry(name="plain", target=_fn)
    entry = reg.entry("plain")
    assert entry.needs == frozenset() and entry.provides == frozenset() and entry.trainer_keys == ()
    assert entry.schema is None and entry.label is None
    assert entry.preset_labels == {} and entry.hooks == {}
    assert reg.schema("plain") is None


def test_decorator_registration_passes_every_declaration():
    reg = Registry("objective")

    @reg.register(
        "deco",
        needs=("logits",),
        provides=("token_clip",),
        trainer_keys=("h_ini_prompts",),
        schema="runners.algorithms.components:ClipObjective",
        label="Deco",
        preset_labels={"deco_high": "Deco-High"},
        hooks={"make": _other},
    )
    def deco(x):
        return 2 * x

    assert deco(3) == 6  # the decorator returns the function itself
    assert reg.get("deco") is deco
    assert reg.entry("deco") == Entry(
        name="deco",
        target=deco,
        needs=frozenset({"logits"}),
        provides=frozenset({"token_clip"}),
        trainer_keys=("h_ini_prompts",),
        schema="runners.algorithms.components:ClipObjective",
        label="Deco",
        preset_labels={"deco_high": "Deco-High"},
        hooks={"make": _other},
    )
    from runners.algorithms.components import ClipObjective

    assert reg.schema("deco") is ClipObjective


def test_decorator_registration_defaults():
    reg = Registry("objective")

    @reg.register("bare")
    def bare():
        return 1

    assert reg.entry("bare") == Entry(name="bare", target=bare)


def test_names_are_sorted_and_duplicates_raise():
    reg = Registry("entropy control")
    reg.register("b", _fn)
    reg.register("a", "os.path:join")
    assert reg.names() == ["a", "b"] and list(reg) == ["a", "b"] and len(reg) == 2
    assert "a" in reg and "c" not in reg
    with pytest.raises(ValueError, match=r"^entropy control 'b' is already registered \(to .*_fn\); refusing"):
        reg.register("b", _other)
    assert reg.get("b") is _fn  # the first registration stands


def test_a_second_registration_names_both_targets_exactly():
    """The refusal names the registered and the refused target as ``module:qualname`` (a lazy target as
    written; ``?`` and the repr for an object without a module or a qualified name)."""
    reg = Registry("mask")
    reg.register("b", _fn)
    reg.register("lazy", "os.path:join")
    with pytest.raises(ValueError) as err:
        reg.register("b", _other)
    assert str(err.value) == (
        f"mask 'b' is already registered (to {_fn.__module__}:_fn); refusing to register {_other.__module__}:_other"
    )
    with pytest.raises(ValueError) as err:
        reg.register("lazy", 5)
    assert str(err.value) == "mask 'lazy' is already registered (to os.path:join); refusing to register ?:5"


# -- lazy targets ------------------------------------------------------------------------------------------
def test_lazy_target_is_resolved_once_with_a_dotted_attribute():
    reg = Registry("estimator")
    reg.register("lazy", LAZY)
    reg.register("join", "os.path:join")
    assert reg.get("lazy") is Registry.names
    assert reg.get("join") is os.path.join
    assert reg.get("lazy") is reg.get("lazy")
    assert reg.entry("lazy").target == LAZY  # the entry keeps the string


def test_lazy_target_with_a_second_colon_looks_up_an_attribute():
    """Only the first colon splits module from attribute: ``os.path`` has no attribute ``join:x``."""
    reg = Registry("estimator")
    reg.register("two", "os.path:join:x")
    with pytest.raises(AttributeError, match="join:x"):
        reg.get("two")


@pytest.mark.parametrize("what", ["target", "schema", "hook 'hf_dir'"])
def test_lazy_string_without_a_colon_raises_naming_kind_name_and_what(what):
    reg = Registry("estimator")
    kw = {"target": _fn}
    if what == "target":
        kw["target"] = "os.path.join"
    elif what == "schema":
        kw["schema"] = "runners.algorithms.components.GrpoEstimator"
    else:
        kw["hooks"] = {"hf_dir": "os.path.join"}
    message = f"lazy {what} for estimator 'bad' must look like 'module:attr', got '"
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        reg.register("bad", **kw)
    assert "bad" not in reg


def test_lazy_strings_with_a_colon_and_callables_are_accepted():
    reg = Registry("estimator")
    reg.register(
        "ok", "os.path:join", schema="runners.algorithms.components:GrpoEstimator", hooks={"a": "os:getcwd", "b": _fn}
    )
    assert reg.hook("ok", "a") is os.getcwd and reg.hook("ok", "b") is _fn and reg.hook("ok", "c") is None


# -- unknown names -------------------------------------------------------------------------------------------
def test_unknown_name_raises_naming_the_kind_and_the_valid_names():
    reg = Registry("loss aggregation")
    reg.register("b", _fn)
    reg.register("a", _other)
    for call in (reg.entry, reg.get, reg.schema):
        with pytest.raises(UnknownNameError, match=r"^unknown loss aggregation 'zz'; valid names: a, b$"):
            call("zz")


# -- schemas ---------------------------------------------------------------------------------------------
def test_a_mapping_schema_needs_the_registry_to_have_a_builder():
    """The registry (the bottom layer) builds no dataclass itself: a mapping schema on a registry without
    a ``schema_builder`` is refused at registration, and a builder must be a callable or 'module:attr'."""
    with pytest.raises(ValueError, match=r"^objective 'x' declares its schema as a mapping, but this registry has no"):
        Registry("objective").register("x", "math:sqrt", schema={"alpha": (float, 0.5)})
    with pytest.raises(ValueError, match=r"schema builder of the objective registry must look like 'module:attr'"):
        Registry("objective", schema_builder="runners.algorithms.components.component_dataclass")
    built = []
    reg = Registry("mask", schema_builder=lambda name, fields: built.append((name, dict(fields))) or int)
    reg.register("x", "math:sqrt", schema={"alpha": (float, 0.5)})
    assert reg.schema("x") is int and reg.schema("x") is int
    assert built == [("mask_x", {"alpha": (float, 0.5)})]  # called once, with "<kind>_<name>"


def test_mapping_schema_becomes_a_cached_dataclass():
    reg = Registry("rollout_correction", schema_builder="runners.algorithms.components:component_dataclass")
    reg.register("my_cap", _fn, schema={"cap": (float, 2.0), "name_of": (str, "x")})
    cls = reg.schema("my_cap")
    assert cls.__name__ == "RolloutCorrectionMyCap"  # from "<kind>_<name>"
    assert dataclasses.is_dataclass(cls)
    assert {f.name: f.default for f in dataclasses.fields(cls) if f.name != "name"} == {"cap": 2.0, "name_of": "x"}
    assert reg.schema("my_cap") is cls


def test_lazy_and_class_schemas_resolve():
    from runners.algorithms.components import GrpoEstimator

    reg = Registry("estimator")
    reg.register("lazy", _fn, schema="runners.algorithms.components:GrpoEstimator")
    reg.register("cls", _fn, schema=GrpoEstimator)
    assert reg.schema("lazy") is GrpoEstimator
    assert reg.schema("cls") is GrpoEstimator
