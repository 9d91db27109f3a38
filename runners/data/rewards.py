"""Verifiable rewards: a registry of ``fn(response: str, gold: str, **kw) -> float`` in [0, 1].

Design: each dataset preset names its reward function (``Example.reward_fn``); every math reward
extracts the final answer strictly by the dataset's convention, then compares (``answers.py``):

- ``embedded_int``: the last ``\\boxed{}`` must hold a bare integer equal to the gold (exact, no
  math-verify: the embedded task's answers are integers);
- ``math``: the last ``\\boxed{}`` (MATH-500, AMC, AIME, Minerva, OlympiadBench, Omni-Math,
  DAPO-Math as formatted by the TROLL paper's prompt, Eurus-2 math);
- ``math_answer_line``: the last ``Answer: ...`` line (DAPO-Math-17k's original prompt);
- ``gsm8k``: the last ``#### N``, falling back to the last ``\\boxed{}`` when the response has no
  ``####`` (instruct models box by habit; ``allow_boxed=False`` makes it strict);
- ``code``: fraction of the first 10 test cases passed by the response's last Python code block,
  run in the sandbox (0 if any case times out; TROLL (arXiv 2510.03817) appendix C.2);
- ``char_coverage``: a shaped, non-verifiable signal for untrained models in tests.

Keyword arguments every math reward accepts: ``prompt`` (enables the echo check for non-numeric
golds), ``timeout_s`` (math-verify). Unknown keywords are ignored, so the trainer can pass the
same ``**kw`` to every reward.

    from runners.data.rewards import compute_reward
    compute_reward("math", "so the answer is \\\\boxed{\\\\frac{1}{2}}", "0.5")   # -> 1.0
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from runners.data.answers import (
    answers_match,
    extract_answer_line,
    extract_gsm8k_answer,
    extract_last_boxed,
)
from runners.registry import Registry

REWARDS = Registry("reward")
_INTEGER = re.compile(r"\s*-?\d+\s*")


@REWARDS.register("embedded_int")
def embedded_int_reward(response: str, gold: str, **_: Any) -> float:
    """1.0 iff the last ``\\boxed{}`` holds exactly the gold integer (``\\boxed{66+24}`` scores 0)."""
    boxed = extract_last_boxed(response)
    if boxed is None or not _INTEGER.fullmatch(boxed):
        return 0.0
    return float(int(boxed) == int(gold))


@REWARDS.register("math")
def math_reward(response: str, gold: str, *, prompt: str | None = None, timeout_s: float = 5.0, **_: Any) -> float:
    """1.0 iff the last ``\\boxed{}`` is equivalent to ``gold`` (see ``answers.answers_match``)."""
    return float(answers_match(extract_last_boxed(response), gold, timeout_s=timeout_s, prompt=prompt))


@REWARDS.register("math_answer_line")
def math_answer_line_reward(
    response: str, gold: str, *, prompt: str | None = None, timeout_s: float = 5.0, **_: Any
) -> float:
    """1.0 iff the last ``Answer: ...`` line is equivalent to ``gold``."""
    return float(answers_match(extract_answer_line(response), gold, timeout_s=timeout_s, prompt=prompt))


@REWARDS.register("gsm8k")
def gsm8k_reward(response: str, gold: str, *, allow_boxed: bool = True, prompt: str | None = None, **_: Any) -> float:
    """1.0 iff the last ``#### N`` (else, with ``allow_boxed``, the last box) equals the gold number.

    ``gold`` may be the bare number or GSM8K's full solution ending in ``#### N``.
    """
    gold = extract_gsm8k_answer(gold) or gold
    answer = extract_gsm8k_answer(response)
    if answer is None and allow_boxed:
        answer = extract_last_boxed(response)
    return float(answers_match(answer, gold, prompt=prompt))


REWARDS.register("code", "runners.data.code_tests:code_reward")

_ALPHANUMERIC = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")


@REWARDS.register("char_coverage")
def char_coverage_reward(response: str, gold: str, **_: Any) -> float:
    """Share of the 36 lowercase letters and digits that occur in the response, in [0, 1].

    Not a verifiable reward (it ignores ``gold``): a shaped signal for untrained (random) models in
    tests and smoke runs, where every verifiable reward is 0 for the whole group (no advantage, no
    update); random text over a real vocabulary gets values that differ within a group.
    """
    return len(_ALPHANUMERIC & set(response.lower())) / len(_ALPHANUMERIC)


def compute_reward(name: str, response: str, gold: str, **kw: Any) -> float:
    """``REWARDS[name](response, gold, **kw)`` as a float."""
    return float(REWARDS.get(name)(response, gold, **kw))


# rewards whose cost is waiting on a subprocess: worth running concurrently from threads
_CONCURRENT = frozenset({"code"})


def compute_rewards(
    names: Sequence[str], responses: Sequence[str], golds: Sequence[str], *, max_workers: int = 4, **kw: Any
) -> list[float]:
    """Rewards of a batch, in order. Code rewards run ``max_workers`` at a time (each waits on
    sandbox subprocesses); the others run in the calling thread, where math-verify's signal
    timeout works without the worker-process fallback."""
    if not len(names) == len(responses) == len(golds):
        raise ValueError(f"compute_rewards needs equal lengths, got {len(names)}, {len(responses)}, {len(golds)}")
    scores: list[float] = [0.0] * len(names)
    concurrent = [i for i, name in enumerate(names) if name in _CONCURRENT]
    if concurrent and max_workers > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=max_workers) as pool:
            futures = {i: pool.submit(compute_reward, names[i], responses[i], golds[i], **kw) for i in concurrent}
            for i in range(len(names)):
                if i not in futures:
                    scores[i] = compute_reward(names[i], responses[i], golds[i], **kw)
            for i, future in futures.items():
                scores[i] = future.result()
        return scores
    return [compute_reward(n, r, g, **kw) for n, r, g in zip(names, responses, golds)]
