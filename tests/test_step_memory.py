"""Sizes no machine can hold are refused before anything starts; every shipped sweep still passes (each
sweep's cells are estimated under 1 GiB in ``tests/test_sweep_plan.py``'s per-sweep test, which plans them
anyway).

The estimate is a lower bound of one step's memory (``runners.config.validate.step_memory``): the
reference values below are worked out by hand from the embedded model's shape (hidden 64, 4 layers,
a 24-character vocabulary) and the byte counts the docstring states. The limit is this machine's
physical memory (``os.sysconf``, replaced here by a made-up machine) or ``launcher.mem_gb`` on Slurm.

Run:  pytest tests/test_step_memory.py
"""

from __future__ import annotations

import os

import pytest

from runners.config import ConfigError, compose
from runners.config.validate import TOTAL_STEPS_MAX, step_memory, validate

GIB = 2**30


def _cfg(*overrides: str):
    # the sizes here are far beyond the embedded model's 2048 positions (tests/test_context_length.py):
    # a context length to match, so the step-memory bound is what these tests meet
    cfg, _ = compose(["model.context_length=1000000000", *overrides], check=False)
    return cfg


def test_the_default_cells_estimate_worked_out_by_hand():
    """Defaults: 8 prompts x 8 responses of 64 + 48 tokens; 13 bytes a token for every response,
    and one forward over the whole mini-batch (64 responses) keeping 4 bytes x (64 x 4 + 24) a token."""
    need, _ = step_memory(_cfg())
    assert need == 64 * 112 * 13 + 64 * 112 * 4 * (64 * 4 + 24) == 8_121_344


def test_micro_batches_verl_and_bf16_shrink_the_forward_term():
    """A micro-batch of 2 responses, or verl (one response), or bfloat16 (2 bytes) scale only the
    forward's share; the responses' 13 bytes a token stay."""
    buffers = 64 * 112 * 13
    assert step_memory(_cfg("trainer.micro_batch_size=2"))[0] == buffers + 2 * 112 * 4 * 280
    assert step_memory(_cfg("model.dtype=bfloat16"))[0] == buffers + 64 * 112 * 2 * 280


def test_refused_exactly_above_the_limit(monkeypatch):
    """On a machine with exactly the estimate the cell is accepted; one byte less and it is refused,
    naming the key, the estimate and the limit."""
    cfg = _cfg("rollout.max_response_length=4000")
    need, _ = step_memory(cfg)
    for memory, refused in ((need, False), (need - 1, True)):
        monkeypatch.setattr(os, "sysconf", lambda name, m=memory: {"SC_PHYS_PAGES": m, "SC_PAGE_SIZE": 1}[name])
        if not refused:
            validate(cfg)
            continue
        with pytest.raises(ConfigError) as err:
            validate(cfg)
        assert err.value.key == "rollout.max_response_length"
        assert f"{need / GIB:,.1f} GiB" in str(err.value) and f"than the {memory / GIB:,.1f} GiB" in str(err.value)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("rollout.max_response_length=100000000", "rollout.max_response_length"),
        ("trainer.prompts_per_step=100000000", "trainer.prompts_per_step"),
        ("trainer.n=100000000", "trainer.n"),
        ("rollout.max_prompt_length=100000000", "rollout.max_prompt_length"),
    ],
)
def test_the_message_names_the_size_that_grew(override, key):
    with pytest.raises(ConfigError) as err:
        validate(_cfg(override, "trainer.mini_batch_prompts=1"))
    assert err.value.key == key and "100000000" in str(err.value) and "this machine" in str(err.value)


def test_slurm_cells_are_compared_with_launcher_mem_gb():
    """150,064 tokens x 64 responses: (13 + 4 x 280) bytes a token = 10.1 GiB, above a 1 GB node, below 16 GB."""
    sizes = ["launcher=slurm", "rollout.max_response_length=150000"]
    need, limit = step_memory(_cfg(*sizes, "launcher.mem_gb=1"))
    assert need == 64 * 150_064 * (13 + 4 * 280) and limit == GIB
    with pytest.raises(ConfigError, match=r"more than the 1.0 GiB of launcher.mem_gb"):
        validate(_cfg(*sizes, "launcher.mem_gb=1"))
    validate(_cfg(*sizes, "launcher.mem_gb=16"))


def test_total_steps_has_a_stated_upper_bound():
    validate(_cfg(f"trainer.total_steps={TOTAL_STEPS_MAX}"))
    with pytest.raises(ConfigError, match="116 days") as err:
        validate(_cfg(f"trainer.total_steps={TOTAL_STEPS_MAX + 1}"))
    assert err.value.key == "trainer.total_steps"
