"""The policy the built-in trainer samples with: the trained model, or a stale and/or lower-precision copy.

Two regimes where policy-update methods act, as configuration (``rollout.staleness``, ``rollout.dtype``):

- stale rollouts, as in asynchronous RL: responses are sampled by the policy ``staleness`` updates
  behind the one being trained (a copy that receives the weights of ``staleness`` iterations ago);
- a numerics mismatch between sampler and trainer, as a bf16 inference engine beside an fp32 trainer:
  the copy samples in ``rollout.dtype`` while training stays in the model's dtype.

With neither (the default) the trained model samples itself and nothing is copied. Otherwise the
sampler's log-probs (``rollout_logp``) and, for methods that need it, the sparse distribution come
from the copy: the rollout policy of TRM (arXiv 2512.23075) and TROLL's old policy; ``log pi_old``
is recomputed by the trained model as usual, and ``rollout_corr/*`` measure the gap.
"""

from __future__ import annotations

import copy
from collections import deque

import torch


def _cpu_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


class RolloutPolicy:
    """``sampler()`` is the model to sample with this iteration; ``after_update()`` records the new weights."""

    def __init__(self, model: torch.nn.Module, *, staleness: int = 0, dtype: str = "auto") -> None:
        if staleness < 0:
            raise ValueError(f"rollout staleness must be >= 0, got {staleness}")
        self.model = model
        self.staleness = int(staleness)
        param = next(model.parameters())
        self.dtype = param.dtype if dtype in ("auto", None) else getattr(torch, dtype)
        self.separate = self.staleness > 0 or self.dtype != param.dtype
        self.copy: torch.nn.Module | None = None
        # weights of the last staleness + 1 iterations, oldest first (only with a separate copy)
        self.history: deque[dict[str, torch.Tensor]] = deque(maxlen=self.staleness + 1)
        if self.separate:
            self.history.append(_cpu_state(model))

    def sampler(self) -> torch.nn.Module:
        """The trained model, or the copy loaded with the weights of ``staleness`` updates ago."""
        if not self.separate:
            return self.model
        if self.copy is None:
            self.copy = copy.deepcopy(self.model).to(self.dtype).eval().requires_grad_(False)
        self.copy.load_state_dict(self.history[0])  # load_state_dict casts to the copy's dtype
        return self.copy

    def after_update(self) -> None:
        if self.separate:
            self.history.append(_cpu_state(self.model))

    def state_dict(self) -> dict:
        return {"history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        self.history = deque(state.get("history") or [], maxlen=self.staleness + 1)
        if self.separate and not self.history:
            self.history.append(_cpu_state(self.model))


__all__ = ["RolloutPolicy"]
