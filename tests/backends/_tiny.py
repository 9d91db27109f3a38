"""Shared settings of trainer tests: tiny-model overrides and a reward tiny random models can earn."""

from __future__ import annotations

from runners.data.rewards import REWARDS

TINY = [
    "model=tiny_qwen2",
    "trainer.total_steps=2",
    "trainer.prompts_per_step=2",
    "trainer.n=4",
    "trainer.mini_batch_prompts=1",
    "trainer.eval_every=0",
    "trainer.checkpoint_every=0",
    "trainer.lr=1e-3",
    "rollout.max_response_length=8",
    "rollout.max_prompt_length=32",
    "dataset.eval_limit=4",
    "dataset.train_limit=64",
    "dataset.reward=test_has_digit",
    "progress=false",
]


def _has_digit(response: str, gold: str, **_) -> float:
    """A dense reward random tiny models earn with variance: the share of digit characters."""
    return sum(c.isdigit() for c in response) / max(len(response), 1)


if "test_has_digit" not in REWARDS:
    REWARDS.register("test_has_digit", _has_digit)
