"""Fixtures for trainer tests: an isolated trustbench home (see _tiny.py for the tiny-model settings)."""

from __future__ import annotations

import pytest

from . import _tiny  # noqa: F401  (registers the test reward)


@pytest.fixture
def tb_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRUSTBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path / "home"
