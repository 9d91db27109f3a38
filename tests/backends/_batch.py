"""A ``RolloutBatch`` from only the fields a test's pass reads (the others None, no slots)."""

from __future__ import annotations

from dataclasses import MISSING, fields

from runners.backends.local.rollout import RolloutBatch


def rollout_batch(**given) -> RolloutBatch:
    """``RolloutBatch(**given)``; a required field not given is None (``context_length`` 0, ``slots`` empty)."""
    defaults = {f.name: None for f in fields(RolloutBatch) if f.default is MISSING} | {"context_length": 0, "slots": []}
    return RolloutBatch(**(defaults | given))
