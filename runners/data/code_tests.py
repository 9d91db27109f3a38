"""Code reward: run a response's program on a task's test cases in the sandbox.

Test cases follow the Eurus-2-RL-Data / APPS / TACO schema, stored as a JSON string in
``reward_model.ground_truth`` (our ``Example.answer``)::

    {"inputs": ["1 2\\n", ...], "outputs": ["3\\n", ...]}                 # stdin -> stdout
    {"fn_name": "add", "inputs": [[1, 2], ...], "outputs": [[3], ...]}   # function call

In call mode an input is a list of arguments or a string with one JSON argument per line, and an
output is the value, possibly wrapped in a one-element list (APPS), or its JSON string.

Reward (TROLL, arXiv 2510.03817, appendix C.2, PRIME's verl reward manager): the fraction of the first
``max_tests`` (10) cases passed; if any case exceeds the time limit (10 s) the reward is 0.
stdout is compared line by line ignoring surrounding whitespace, then token by token with a
1e-6 tolerance on numbers.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from runners.data.sandbox import SandboxConfig, run_python

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.S)


@dataclass
class TestCases:
    inputs: list[Any]
    outputs: list[Any]
    fn_name: str | None = None

    def __len__(self) -> int:
        return len(self.inputs)


def parse_test_cases(gold: str | dict) -> TestCases:
    """The test cases of a gold answer (JSON string or dict); ValueError naming what is wrong."""
    data = json.loads(gold) if isinstance(gold, str) else gold
    if not isinstance(data, dict) or "inputs" not in data or "outputs" not in data:
        raise ValueError(f"code test cases need 'inputs' and 'outputs' keys, got {str(gold)[:200]!r}")
    if len(data["inputs"]) != len(data["outputs"]):
        raise ValueError(f"code test cases have {len(data['inputs'])} inputs but {len(data['outputs'])} outputs")
    return TestCases(list(data["inputs"]), list(data["outputs"]), data.get("fn_name") or None)


def extract_code(response: str) -> str | None:
    """The last fenced Python (or unlabeled) code block; the whole response if it has no fence."""
    if not response or not response.strip():
        return None
    blocks = [body for lang, body in _FENCE.findall(response) if lang.lower() in ("", "python", "py", "python3")]
    if blocks:
        return blocks[-1]
    if "```" in response:  # fenced, but no complete python block (e.g. truncated)
        return None
    return response


def _text(value: Any) -> str:
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)


def _numbers_close(a: str, b: str) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-6)
    except ValueError:
        return False


def stdout_matches(actual: str, expected: str) -> bool:
    """Line-wise after stripping whitespace, else token-wise with a 1e-6 tolerance on numbers."""
    lines_a = [line.strip() for line in actual.strip().splitlines()]
    lines_e = [line.strip() for line in expected.strip().splitlines()]
    if lines_a == lines_e:
        return True
    tokens_a, tokens_e = actual.split(), expected.split()
    return len(tokens_a) == len(tokens_e) and all(x == y or _numbers_close(x, y) for x, y in zip(tokens_a, tokens_e))


def _call_args(raw: Any) -> list[Any]:
    if isinstance(raw, str):
        return [json.loads(line) for line in raw.split("\n") if line.strip()]
    return list(raw)


def value_matches(value: Any, expected: Any) -> bool:
    """A returned value against the expected one (JSON string, value, or one-element list)."""
    if isinstance(expected, str):
        try:
            expected = json.loads(expected)
        except json.JSONDecodeError:
            pass
    if value == expected:
        return True
    return isinstance(expected, list) and len(expected) == 1 and value == expected[0]


def run_test_cases(
    code: str, cases: TestCases, *, max_tests: int = 10, config: SandboxConfig | None = None
) -> list[str]:
    """Per-case outcome, one of ``pass``, ``fail``, ``timeout``, ``error`` (at most ``max_tests``)."""
    outcomes = []
    for raw_in, raw_out in list(zip(cases.inputs, cases.outputs))[:max_tests]:
        if cases.fn_name:
            result = run_python(code, fn_name=cases.fn_name, args=_call_args(raw_in), config=config)
            passed = result.ok and value_matches(result.value, raw_out)
        else:
            result = run_python(code, stdin=_text(raw_in), config=config)
            passed = result.ok and stdout_matches(result.stdout, _text(raw_out))
        outcomes.append(
            "pass" if passed else "timeout" if result.status == "timeout" else "fail" if result.ok else "error"
        )
        if result.status == "timeout":
            break  # the reward is 0 anyway: do not spend 10 s per remaining case
    return outcomes


def code_reward(
    response: str, gold: str, *, max_tests: int = 10, timeout_s: float = 10.0, memory_mb: int = 1024, **_: Any
) -> float:
    """Fraction of the first ``max_tests`` cases passed; 0 if no code or any case times out."""
    code = extract_code(response)
    cases = parse_test_cases(gold)
    if code is None or len(cases) == 0:
        return 0.0
    outcomes = run_test_cases(
        code, cases, max_tests=max_tests, config=SandboxConfig(timeout_s=timeout_s, memory_mb=memory_mb)
    )
    if "timeout" in outcomes:
        return 0.0
    return outcomes.count("pass") / len(outcomes)
