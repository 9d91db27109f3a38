"""Registries: duplicate detection, helpful errors, lazy targets (one registry per extension point)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from runners.algorithms import REGISTRIES
from runners.registry import Registry, UnknownNameError


def test_unknown_name_lists_valid_names():
    reg = Registry("estimator")
    reg.register("a", "math:sqrt")
    reg.register("b", "math:floor")
    with pytest.raises(UnknownNameError) as err:
        reg.get("c")
    assert "unknown estimator 'c'" in str(err.value)
    assert "a, b" in str(err.value)


def test_duplicate_registration_raises():
    reg = Registry("objective")
    reg.register("x", "math:sqrt")
    with pytest.raises(ValueError, match="already registered"):
        reg.register("x", "math:floor")

    @reg.register("y")
    def y():
        return 1

    with pytest.raises(ValueError, match="already registered"):
        reg.register("y")(lambda: 2)


def test_lazy_target_is_resolved_on_get():
    import math

    reg = Registry("mask")
    reg.register("sqrt", "math:sqrt")
    assert reg.get("sqrt") is math.sqrt


def test_malformed_lazy_target_rejected():
    with pytest.raises(ValueError, match="module:attr"):
        Registry("mask").register("bad", "math.sqrt")


def test_importing_the_library_does_not_import_torch():
    code = "import sys, runners.algorithms, runners.metric_names; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("kind,name", [(kind, name) for kind, reg in REGISTRIES.items() for name in reg.names()])
def test_every_builtin_entry_resolves(kind, name):
    assert callable(REGISTRIES[kind].get(name))


def test_declarations_and_a_schema_written_on_the_registry_line():
    """An entry's needs / provides / trainer keys, and a schema given as {field: (type, default, *checks)}
    become a dataclass with those fields, defaults and checks (what `runners.config.validate` applies)."""
    import dataclasses

    from runners.algorithms.components import POSITIVE, field_checks

    reg = Registry("objective", schema_builder="runners.algorithms.components:component_dataclass")
    reg.register(
        "x", "math:sqrt", needs=("logits",), provides=("token_clip",), schema={"alpha": (float, 0.5, POSITIVE)}
    )
    entry = reg.entry("x")
    assert entry.needs == {"logits"} and entry.provides == {"token_clip"} and entry.trainer_keys == ()
    schema = reg.schema("x")
    assert {f.name: f.default for f in dataclasses.fields(schema) if f.name != "name"} == {"alpha": 0.5}
    assert [(key, check.what) for key, check in field_checks(schema)] == [("alpha", "must be > 0")]
    assert reg.schema("x") is schema  # built once
    assert reg.with_need("logits") == ["x"]
    with pytest.raises(UnknownNameError, match="valid names: x"):
        reg.entry("y")


def test_the_backend_group_offers_exactly_the_registered_backends():
    """`config.validate` checks ``backend.name`` against conf/backend/ (the config layer does not import the
    backends); each option there must be a registered backend and each backend must have its option."""
    from runners.backends import BACKENDS
    from runners.paths import conf_options

    assert conf_options("backend") == BACKENDS.names() == ["local", "verl"]


def test_labels_and_hooks_declared_on_the_registry_line():
    """An entry's label and its presets' labels (``Registry.label``), and its named functions, lazy
    until looked up (``Registry.hook``); an entry without the hook gives None, an unknown name raises."""
    import math

    reg = Registry("objective")
    reg.register(
        "x", "math:sqrt", label="X", preset_labels={"x_big": "X-Big"}, hooks={"size": "math:floor", "now": abs}
    )
    reg.register("y", "math:floor")
    assert (reg.label("x"), reg.label("x_big"), reg.label("y"), reg.label("z")) == ("X", "X-Big", None, None)
    assert reg.hook("x", "size") is math.floor and reg.hook("x", "now") is abs
    assert reg.hook("y", "size") is None
    with pytest.raises(UnknownNameError):
        reg.hook("z", "size")
    with pytest.raises(ValueError, match="module:attr"):
        reg.register("w", "math:sqrt", hooks={"size": "math.floor"})
