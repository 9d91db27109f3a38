"""Shared test configuration: marker routing (gpu, verl, slurm) and small fixtures.

Markers route expensive tests; tests that need what this machine lacks are *skipped* and pytest's
``-ra`` summary lists every skip with its reason, so a skip is never counted as a pass.
"""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

from tests.slurm.cluster import slurm_cluster  # noqa: F401  (session fixture, registered once for all tests)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch missing
        return False


def pytest_collection_modifyitems(config, items):
    has_verl = importlib.util.find_spec("verl") is not None
    has_gpu = None
    for item in items:
        if "gpu" in item.keywords:
            if has_gpu is None:
                has_gpu = _has_cuda()
            if not has_gpu:
                item.add_marker(pytest.mark.skip(reason="gpu: no CUDA device on this machine"))
        if "verl" in item.keywords and not has_verl:
            item.add_marker(pytest.mark.skip(reason="verl: not installed (pip install -e '.[test]')"))
        if "slurm" in item.keywords and shutil.which("sbatch") is None:
            item.add_marker(pytest.mark.skip(reason="slurm: no sbatch on PATH (see slurm/testcluster)"))


@pytest.fixture
def repo_root() -> str:
    return REPO_ROOT
