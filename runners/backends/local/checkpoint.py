"""Checkpoints of the built-in trainer: one file per run, written atomically.

``save`` writes ``<run_dir>/checkpoint.pt.tmp`` then renames it over ``checkpoint.pt``, so a kill
during the write leaves the previous checkpoint intact (nothing lost on failure). The state holds
model, optimiser and scheduler, critic, entropy controller, rollout (unfinished T-PPO slots and the
prompt stream position) and every RNG, so a resumed run recomputes exactly the steps it lost.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

FILENAME = "checkpoint.pt"


def path(run_dir: str | Path) -> Path:
    return Path(run_dir) / FILENAME


def save(run_dir: str | Path, state: dict[str, Any]) -> Path:
    target = path(run_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".pt.tmp")
    torch.save(state, tmp)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, target)
    return target


def load(run_dir: str | Path) -> dict[str, Any] | None:
    target = path(run_dir)
    if not target.exists():
        return None
    return torch.load(target, map_location="cpu", weights_only=False)


def step_of(run_dir: str | Path) -> int | None:
    """Step of the saved checkpoint, or None (loads the file: use for tests and reports)."""
    state = load(run_dir)
    return None if state is None else int(state["step"])
