"""Checkpoints of the built-in trainer: the latest and the previous one, written atomically.

``save`` writes ``<run_dir>/checkpoint.pt.tmp``, fsyncs it, renames the current ``checkpoint.pt``
to ``checkpoint.prev.pt`` and the new file to ``checkpoint.pt``: a kill at any point leaves a
complete checkpoint, and a write that fails (a full disk) removes its partial file, giving the space
back. The previous checkpoint is dropped just before a new one is written, so at most two full
checkpoints are ever on disk. ``load`` falls back to the previous checkpoint when the latest cannot
be read (a truncated or damaged file, moved aside to ``checkpoint.pt.corrupt`` with a warning
naming it); the steps in between are recomputed and, already in MLflow, not logged twice. With no
readable checkpoint left it raises ``CheckpointError`` naming the files to remove.

The state holds model, optimiser and scheduler, critic, entropy controller, rollout (unfinished
T-PPO slots and the prompt stream position) and every RNG, so a resumed run recomputes exactly the
steps it lost.

Files are read with torch's safe loader (``torch.load(weights_only=True)``): tensors, containers and
numbers, plus the four numpy globals a checkpoint holds (numpy's RNG state is a ``uint32`` array:
``ndarray``, ``dtype``, ``dtypes.UInt32DType`` and the ``_reconstruct`` function that rebuilds it;
``SAFE_GLOBALS``). A file
naming any other global (a pickle payload that would run code when loaded) is refused before
anything in it runs, and treated as an unreadable checkpoint, with a message saying so.
"""

from __future__ import annotations

import os
import pickle
import random
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

FILENAME = "checkpoint.pt"
PREVIOUS = "checkpoint.prev.pt"
CORRUPT_SUFFIX = ".corrupt"
# the globals of numpy's RNG state (np.random.get_state()[1], a uint32 array), as numpy pickles it
SAFE_GLOBALS = [np.ndarray, np.dtype, type(np.dtype(np.uint32)), np.zeros(0, dtype=np.uint32).__reduce__()[0]]
_REFUSED = re.compile(r"GLOBAL (\S+)|but got <class '([^']+)'>")


class CheckpointError(RuntimeError):
    """No readable checkpoint of a run that has some; the message names the files to remove."""


def path(run_dir: str | Path) -> Path:
    return Path(run_dir) / FILENAME


def previous_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / PREVIOUS


def save(run_dir: str | Path, state: dict[str, Any]) -> Path:
    target, previous = path(run_dir), previous_path(run_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".pt.tmp")
    if target.exists():
        previous.unlink(missing_ok=True)  # the current one stays the good one while the new one is written
    try:
        # our own file object: closed on any error, so that removing the partial file gives its space
        # back at once (torch's own writer would keep it open as long as the traceback lives)
        with open(tmp, "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        cause = _os_error(err)  # torch reports a failed write as "unexpected pos", a flush names no file
        if cause is not None and cause.errno is not None:
            raise OSError(cause.errno, f"checkpoint {target} not written: {cause.strerror}") from err
        raise
    if target.exists():
        os.replace(target, previous)
    os.replace(tmp, target)
    return target


def _os_error(err: BaseException | None) -> OSError | None:
    """The ``OSError`` (e.g. ENOSPC) behind ``err``, following ``__cause__`` / ``__context__``."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, OSError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def discard(run_dir: str | Path) -> None:
    """Remove every checkpoint of the run (``force=true``: start afresh)."""
    for file in (path(run_dir), previous_path(run_dir), path(run_dir).with_suffix(".pt.tmp")):
        file.unlink(missing_ok=True)


def load(run_dir: str | Path) -> dict[str, Any] | None:
    """The latest readable checkpoint's state (module docstring), or None if the run has none."""
    target, previous = path(run_dir), previous_path(run_dir)
    problems = []
    for file in (target, previous):
        if not file.exists():
            continue
        try:
            state = _safe_load(file)
            if not isinstance(state, dict) or "step" not in state:
                raise ValueError("not a trustbench checkpoint (no step)")
        except Exception as err:  # noqa: BLE001 - any unreadable file: try the previous one
            problems.append((file, _why(err)))
            continue
        if problems:
            _set_aside(problems, fallback=file)
        return state
    if problems:
        (first, why), files = problems[0], " and ".join(str(f) for f, _ in problems)
        also = "; the previous one cannot be read either" if len(problems) > 1 else " and there is no previous one"
        raise CheckpointError(
            f"checkpoint {first} cannot be read ({why}){also}: remove {files} to restart the cell from step 0 "
            "(its MLflow run is kept and resumed)"
        )
    return None


def _safe_load(file: Path) -> Any:
    if not hasattr(torch.serialization, "safe_globals"):  # torch 2.4: the process-wide allowlist only
        torch.serialization.add_safe_globals(SAFE_GLOBALS)
        return torch.load(file, map_location="cpu", weights_only=True)
    with torch.serialization.safe_globals(SAFE_GLOBALS):
        return torch.load(file, map_location="cpu", weights_only=True)


def _why(err: BaseException) -> str:
    """One line on why a checkpoint could not be read."""
    text = str(err).strip()
    refused = _REFUSED.search(text) if isinstance(err, pickle.UnpicklingError) else None
    if refused is not None or "Weights only load failed" in text:
        what = (refused[1] or refused[2]) if refused is not None else "a type outside its allowlist"
        return (
            f"refused by torch's safe loader: it names {what}, which no trustbench checkpoint holds "
            "(a pickle payload would run code when loaded); nothing in it was run"
        )
    return f"{type(err).__name__}: {(text.splitlines() or [''])[0]}"


def _set_aside(problems: list[tuple[Path, str]], fallback: Path) -> None:
    for file, why in problems:
        aside = file.with_name(file.name + CORRUPT_SUFFIX)
        os.replace(file, aside)
        print(f"[trustbench] checkpoint {file} cannot be read ({why}); moved to {aside}, resuming from {fallback}",
              file=sys.stderr)  # fmt: skip


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
