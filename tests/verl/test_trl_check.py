"""``check_trl``: a TRL verl 0.9.1 cannot import from is refused before verl starts.

The reference is the import verl's ``apply_monkey_patch`` performs (``from trl.experimental.ppo import
AutoModelForCausalLMWithValueHead``, else ``from trl import ...``), run on stand-in ``trl`` packages.
"""

from __future__ import annotations

import importlib
import sys

import pytest

from runners.backends.verl.process import check_trl


def _verl_import_succeeds() -> bool:
    try:
        from trl.experimental.ppo import AutoModelForCausalLMWithValueHead  # noqa: F401
    except ImportError:
        try:
            from trl import AutoModelForCausalLMWithValueHead  # noqa: F401, F811
        except ImportError:
            return False
    return True


def _fake_trl(root, files: dict[str, str]):
    for name, text in files.items():
        path = root / "trl" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.fixture
def isolated_trl(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "trl" or m.startswith("trl.")]:
        monkeypatch.delitem(sys.modules, name)
    importlib.invalidate_caches()
    yield tmp_path
    for name in [m for m in sys.modules if m == "trl" or m.startswith("trl.")]:
        del sys.modules[name]


CASES = {
    "top-level class (TRL < 0.2x)": {"__init__.py": "class AutoModelForCausalLMWithValueHead: ...\n"},
    "experimental.ppo": {
        "__init__.py": "",
        "experimental/__init__.py": "",
        "experimental/ppo/__init__.py": "class AutoModelForCausalLMWithValueHead: ...\n",
    },
    "neither (TRL 1.x)": {"__init__.py": "class GRPOTrainer: ...\n", "experimental/__init__.py": ""},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_check_trl_refuses_exactly_what_verl_cannot_import(isolated_trl, case, monkeypatch):
    _fake_trl(isolated_trl, CASES[case])
    monkeypatch.setattr("importlib.metadata.version", lambda name: "9.9-fake")
    works = _verl_import_succeeds()
    for name in [m for m in sys.modules if m == "trl" or m.startswith("trl.")]:
        del sys.modules[name]
    if works:
        check_trl()
    else:
        with pytest.raises(RuntimeError, match=r"trl 9\.9-fake .*uninstall trl"):
            check_trl()
    assert works == (case != "neither (TRL 1.x)")


def test_no_trl_installed_is_fine(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trl" else real(name, *a))
    check_trl()
