"""The one record every dataset loader returns (torch-free).

Design: loaders normalise each hub schema (GSM8K's ``question/answer``, MATH-500's
``problem/answer/solution``, Eurus-2's chat ``prompt`` plus ``reward_model.ground_truth``, ...) into an
:class:`Example`, so the trainer, the prompt formatter, the reward registry and the verl exporter
see one shape. ``answer`` is always a string (the gold answer as the verifier expects it: a number,
a LaTeX expression, or for code the JSON test cases); ``reward_fn`` names an entry of
``runners.data.rewards.REWARDS``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ChatMessages = list[dict[str, str]]


@dataclass
class Example:
    """One task instance: what the policy sees, what the verifier checks, where it came from."""

    # plain text (embedded task, raw questions) or chat messages [{"role": ..., "content": ...}]
    prompt: str | ChatMessages
    # gold answer as a string ("632", "\\frac{1}{2}", or JSON test cases for code)
    answer: str
    # dataset name used for per-dataset metrics (val-core/<data_source>/...) and verl's data_source
    data_source: str
    # name of the reward function in runners.data.rewards.REWARDS
    reward_fn: str
    # reference worked solution (supervised warm-start), when the dataset has one
    solution: str | None = None
    # anything else: split, index in the source, difficulty, original fields
    meta: dict[str, Any] = field(default_factory=dict)

    def prompt_text(self) -> str:
        """The user question as plain text (the last user message of a chat prompt)."""
        if isinstance(self.prompt, str):
            return self.prompt
        for message in reversed(self.prompt):
            if message.get("role") == "user":
                return message["content"]
        raise ValueError(f"example from {self.data_source!r} has no user message: {self.prompt!r}")
