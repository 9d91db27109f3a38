"""Checkpoints of the built-in trainer: one file per run, written atomically.

``save`` writes ``<run_dir>/checkpoint.pt.tmp`` then renames it over ``checkpoint.pt``, so a kill
during the write leaves the previous checkpoint intact (nothing lost on failure). The state holds
model, optimiser and scheduler, critic, entropy controller, rollout (unfinished T-PPO slots and the
prompt stream position) and every RNG, so a resumed run recomputes exactly the steps it lost.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
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


def state_of(trainer, step: int) -> dict[str, Any]:
    """Everything ``trainer`` (a ``LocalTrainer``) needs to continue after ``step``."""
    critic, critic_optimizer = trainer.critic, trainer.critic_optimizer
    return {
        "step": step,
        "model": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "scheduler": trainer.scheduler.state_dict(),
        "critic": critic.state_dict() if critic is not None else None,
        "critic_optimizer": critic_optimizer.state_dict() if critic_optimizer is not None else None,
        "controller": trainer.controller.state_dict(),
        "rollout": trainer.rollout.state_dict(),
        "rollout_policy": trainer.rollout_policy.state_dict(),
        "h_ini": trainer.h_ini,
        "rng": {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "sample": trainer.sample_generator.get_state(),
            "shuffle": trainer.shuffle_generator.get_state(),
        },
    }


def restore(trainer, state: dict[str, Any]) -> int:
    """Load ``state`` (from ``state_of``) into ``trainer``; returns the step it was saved after."""
    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.scheduler.load_state_dict(state["scheduler"])
    if trainer.critic is not None and state["critic"] is not None:
        trainer.critic.load_state_dict(state["critic"])
        trainer.critic_optimizer.load_state_dict(state["critic_optimizer"])
    trainer.controller.load_state_dict(state["controller"])
    trainer.rollout.load_state_dict(state["rollout"])
    trainer.rollout_policy.load_state_dict(state.get("rollout_policy") or {})
    trainer.h_ini = state["h_ini"]
    rng = state["rng"]
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    trainer.sample_generator.set_state(rng["sample"])
    trainer.shuffle_generator.set_state(rng["shuffle"])
    return int(state["step"])
