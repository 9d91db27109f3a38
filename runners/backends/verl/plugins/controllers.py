"""Per-iteration controllers of a verl run, kept on the driver: entropy control and GTPO's H_ini.

Design: the state lives in ONE place, the trainer process, as ``runners.algorithms`` controller
objects (REPO-R/REPO-D zeta, ADAPO eps_high, adaptive entropy-bonus beta). Once per iteration the
trustbench trainer feeds ``observe`` the entropy verl measured in the old-log-prob pass (the
pre-update entropy of the current policy on this iteration's batch, the quantity verl logs as
``actor/entropy`` and the built-in trainer feeds its controller); ``runtime()`` is then attached to
the batch of that iteration's actor update, where every worker's loss rebuilds the controller from
it (``plugins_losses.build_controller``). Nothing is pushed into worker configs, so there is no
worker state to keep in sync, and checkpointing is a JSON file next to verl's checkpoint
(``save`` / ``load``).

The entropy fed to the controller is the token mean over the batch's response tokens, as the
built-in trainer computes it (verl's logged ``actor/entropy`` aggregates with ``loss_agg_mode``
and equals it under ``token-mean``). GTPO's H_ini (GTPO, arXiv 2508.03772, section 5.2: the initial model's
entropy on the first training prompts) is measured on the first iteration's batch, restricted to
its first ``h_ini_prompts`` prompt groups: responses sampled by the initial model on the first
training prompts, before any update.

    control = IterationControl(loss_settings(cfg.actor_rollout_ref.actor.policy_loss))
    metrics.update(control.observe(entropy, response_mask, uids))
    batch.extra_info["trustbench_runtime"] = control.runtime()

Tests: ``pytest tests/verl/test_plugins_controllers.py``.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import torch
from torch import Tensor

from runners.algorithms.gtpo import compute_initial_entropy
from runners.algorithms.policy_loss import build_controller
from runners.backends.verl.plugins.config import LossSettings

STATE_FILE = "trustbench_control.json"


class IterationControl:
    """Driver-side state of the per-iteration controllers of one run."""

    def __init__(self, settings: LossSettings) -> None:
        self.settings = settings
        self.controller = build_controller(settings.method)
        self.h_ini: float | None = settings.objective_kw.get("h_ini")
        self.needs_h_ini = settings.method.requires("h_ini") and self.h_ini is None

    @property
    def active(self) -> bool:
        """Whether ``observe`` does anything (a controller fed the batch entropy, or H_ini still to measure)."""
        return self.settings.method.requires("batch_entropy") or self.needs_h_ini

    def observe(self, entropy: Tensor, response_mask: Tensor, group_index: Any = None) -> dict[str, float]:
        """One iteration: entropy [B,T] of the old-log-prob pass, response_mask [B,T], uids [B].

        Updates the controller with the token-mean entropy and, on the first call of a GTPO run,
        sets H_ini. Returns the controller's metrics (``entropy/zeta``, ``entropy/eps_high``, ...).
        """
        mask = response_mask.to(torch.float64)
        token_mean = float((entropy.to(torch.float64) * mask).sum() / mask.sum().clamp(min=1))
        if self.needs_h_ini and self.h_ini is None:
            rows = self._first_groups(group_index, entropy.shape[0])
            self.h_ini = compute_initial_entropy(entropy[rows], response_mask[rows])
        return self.controller.update(token_mean)

    def _first_groups(self, group_index: Any, batch: int) -> Tensor:
        """Rows of the first ``h_ini_prompts`` prompt groups (in batch order); all rows without groups."""
        if group_index is None:
            return torch.arange(batch)
        groups = np.asarray(group_index if not isinstance(group_index, Tensor) else group_index.cpu().numpy())
        _, first = np.unique(groups, return_index=True)
        chosen = set(groups[np.sort(first)][: self.settings.h_ini_prompts].tolist())
        return torch.tensor([i for i, g in enumerate(groups.tolist()) if g in chosen], dtype=torch.long)

    def runtime(self) -> dict[str, Any]:
        """What the workers' losses need this iteration (attached to the update batch)."""
        return {"entropy_control_state": self.controller.state_dict(), "h_ini": self.h_ini}

    def state_dict(self) -> dict[str, Any]:
        return {"entropy_control": self.controller.state_dict(), "h_ini": self.h_ini}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.controller.load_state_dict(dict(state["entropy_control"]))
        self.h_ini = state["h_ini"]

    def save(self, folder: str) -> str:
        """Write the state as ``<folder>/trustbench_control.json``; returns the path."""
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, STATE_FILE)
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.state_dict(), f)
        os.replace(tmp, path)
        return path

    def load(self, folder: str) -> bool:
        """Restore from ``<folder>/trustbench_control.json``; False if the file does not exist."""
        path = os.path.join(folder, STATE_FILE)
        if not os.path.exists(path):
            return False
        with open(path) as f:
            self.load_state_dict(json.load(f))
        return True


__all__ = ["STATE_FILE", "IterationControl"]
