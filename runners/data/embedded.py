"""The embedded task: column arithmetic the tool generates itself (no network, no files).

Design. A problem is ``a op b`` with ``op`` in ``+ - *``; the prompt is plain text (no chat template,
it serves a tiny character-level model) and the reference solution works the columns from the
least significant digit, one line per column, then gives the answer in a strict ``\\boxed{N}``::

    prompt    "347+285=?\\n"
    solution  "7+5=12\\n4+8+1=13\\n3+2+1=6\\n\\boxed{632}"

Every column line is ``t op d [+c|-c] = v`` with ``t`` the column digit of ``a``, ``d`` that of ``b``
(``0`` past its last digit; for ``*`` always the single digit ``b``), ``c`` the carry from the
previous column; the written digit is ``v mod 10`` and the next carry ``floor(v / 10)``: one rule for
addition (carry 1), subtraction (borrow = carry -1, e.g. ``4-8=-4`` writes 6 and borrows) and
multiplication by a digit (carry up to 8). The answer is the last carry followed by the written
digits, most significant first, without leading zeros. Responses are 20-60 characters.

Difficulty knob: ``digits`` (operands have 1..digits digits, each length equally likely), and
``ops`` (which operations appear). Subtraction keeps ``a >= b`` (answers are non-negative);
multiplication uses a single digit ``b`` in 2..9.

Long-tailed lengths (T-PPO's setting, arXiv 2506.15050 section 1: a few long responses hold up a
synchronous batch): with ``long_fraction`` > 0 that share of the problems has operands of
``digits + 1 .. long_digits`` digits, one column line per digit, so their responses are several times
longer (``long_digits=10``: ~100 characters against 15-45). With ``long_fraction=0`` (the default) the
generator draws exactly the problems it drew before the option existed.

Splits are disjoint by construction: a problem belongs to ``test`` when a hash of its canonical
form (operands sorted for the commutative ``+`` and ``*``) falls below ``test_fraction``, so
``b+a`` never leaks the test problem ``a+b`` into training. Generation is deterministic in
``(seed, split, digits, ops)`` and prefix-stable in ``n``.

    python -c "from runners.data.embedded import generate_embedded as g; print(g(2, split='test')[0])"
"""

from __future__ import annotations

import hashlib
import random

from runners.data.types import Example

DATA_SOURCE = "embedded"
REWARD_FN = "embedded_int"
OPS = "+-*"
# every character a prompt or a reference solution can contain, sorted (for the char tokenizer)
EMBEDDED_ALPHABET = "".join(sorted(set("0123456789" + OPS + "=?\n" + "\\boxed{}")))
SPLITS = ("train", "test")
_SPLIT_ALIASES = {"train": "train", "test": "test", "validation": "test", "val": "test"}


def format_prompt(a: int, op: str, b: int) -> str:
    """The plain-text prompt of ``a op b`` (ends with a newline; the response follows it)."""
    return f"{a}{op}{b}=?\n"


def parse_prompt(prompt: str) -> tuple[int, str, int]:
    """Inverse of :func:`format_prompt`: ``"347+285=?\\n" -> (347, "+", 285)``."""
    body = prompt.strip()
    if not body.endswith("=?"):
        raise ValueError(f"not an embedded prompt: {prompt!r}")
    body = body[:-2]
    for i, ch in enumerate(body):
        if i > 0 and ch in OPS:
            return int(body[:i]), ch, int(body[i + 1 :])
    raise ValueError(f"not an embedded prompt: {prompt!r}")


def compute_answer(a: int, op: str, b: int) -> int:
    """The exact result, independent of the column procedure (used to check it)."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"unknown embedded op {op!r}; valid ops: {OPS!r}")


def solution_lines(a: int, op: str, b: int) -> tuple[list[str], int]:
    """Column steps of ``a op b`` and the result they produce (see the module docstring)."""
    if op not in OPS:
        raise ValueError(f"unknown embedded op {op!r}; valid ops: {OPS!r}")
    if a < 0 or b < 0 or (op == "-" and a < b) or (op == "*" and b > 9):
        raise ValueError(
            f"embedded problem {a}{op}{b} is outside the task (need a, b >= 0, a >= b for -, b <= 9 for *)"
        )
    top = str(a)[::-1]
    bottom = str(b)[::-1]
    width = len(top) if op == "*" else max(len(top), len(bottom))
    lines: list[str] = []
    written: list[str] = []
    carry = 0
    for i in range(width):
        t = int(top[i]) if i < len(top) else 0
        d = b if op == "*" else (int(bottom[i]) if i < len(bottom) else 0)
        if op == "+":
            value = t + d + carry
        elif op == "-":
            value = t - d + carry
        else:
            value = t * d + carry
        carry_term = f"+{carry}" if carry > 0 else (f"-{-carry}" if carry < 0 else "")
        lines.append(f"{t}{op}{d}{carry_term}={value}")
        written.append(str(value % 10))
        carry = value // 10
    digits = (str(carry) if carry else "") + "".join(reversed(written))
    return lines, int(digits)


def reference_solution(a: int, op: str, b: int) -> str:
    """Worked column steps then ``\\boxed{N}``: the supervised warm-start target."""
    lines, result = solution_lines(a, op, b)
    return "\n".join([*lines, f"\\boxed{{{result}}}"])


def problem_split(a: int, op: str, b: int, test_fraction: float = 0.1) -> str:
    """``"test"`` or ``"train"``, from a stable hash of the canonical problem (not Python's ``hash``)."""
    x, y = (min(a, b), max(a, b)) if op in "+*" else (a, b)
    digest = hashlib.blake2b(f"{x}{op}{y}".encode(), digest_size=8).digest()
    u = int.from_bytes(digest, "big") / 2**64
    return "test" if u < test_fraction else "train"


def _sample_operand(rng: random.Random, digits: int) -> int:
    k = rng.randint(1, digits)
    return rng.randint(0 if k == 1 else 10 ** (k - 1), 10**k - 1)


def _sample_long_operand(rng: random.Random, digits: int, long_digits: int) -> int:
    k = rng.randint(digits + 1, long_digits)
    return rng.randint(10 ** (k - 1), 10**k - 1)


def _sample_problem(
    rng: random.Random, digits: int, ops: str, long_fraction: float = 0.0, long_digits: int = 0
) -> tuple[int, str, int]:
    op = rng.choice(ops)
    long_ = long_fraction > 0 and rng.random() < long_fraction  # no extra draw without the long mix
    if long_:
        a = _sample_long_operand(rng, digits, long_digits)
    else:
        a = _sample_operand(rng, digits)
    if op == "*":
        return a, op, rng.randint(2, 9)
    b = _sample_long_operand(rng, digits, long_digits) if long_ else _sample_operand(rng, digits)
    if op == "-" and a < b:
        a, b = b, a
    return a, op, b


def problem_space(digits: int, ops: str, long_fraction: float = 0.0, long_digits: int = 0) -> int:
    """How many distinct problems ``(a, op, b)`` the generator can draw, both splits together (an upper
    bound with the long mix): operands take 10**digits values (10**long_digits with it), ``-`` puts the
    larger operand first, ``*`` multiplies by 2..9."""
    a = 10 ** (long_digits if long_fraction > 0 else digits)
    sizes = {"+": a * a, "-": a * (a + 1) // 2, "*": a * 8}
    return sum(sizes[op] for op in set(ops) if op in sizes)


def split_capacity(split: str, digits: int, ops: str, test_fraction: float, long_fraction: float = 0.0,
                   long_digits: int = 0) -> int:  # fmt: skip
    """The most problems ``generate_embedded`` is asked for in ``split``: the split's share of
    ``problem_space`` (the split of a problem is a hash, so the share is that of the space on average; near it
    the generator may still run out of draws and say so)."""
    share = test_fraction if _SPLIT_ALIASES.get(split, split) == "test" else 1.0 - test_fraction
    return int(problem_space(digits, ops, long_fraction, long_digits) * share)


def make_example(a: int, op: str, b: int, *, split: str = "train", index: int = 0) -> Example:
    """The :class:`Example` of one problem (answer checked against :func:`compute_answer`)."""
    lines, result = solution_lines(a, op, b)
    expected = compute_answer(a, op, b)
    if result != expected:  # the column procedure is the warm-start target: it must be right
        raise AssertionError(f"column steps of {a}{op}{b} give {result}, expected {expected}")
    return Example(
        prompt=format_prompt(a, op, b),
        answer=str(result),
        data_source=DATA_SOURCE,
        reward_fn=REWARD_FN,
        solution="\n".join([*lines, f"\\boxed{{{result}}}"]),
        meta={"split": split, "index": index, "a": a, "op": op, "b": b, "columns": len(lines)},
    )


def generate_embedded(
    n: int,
    *,
    split: str = "train",
    seed: int = 0,
    digits: int = 3,
    ops: str = OPS,
    test_fraction: float = 0.1,
    long_fraction: float = 0.0,
    long_digits: int = 0,
) -> list[Example]:
    """``n`` distinct problems of ``split``, deterministic in ``(seed, split, digits, ops)`` (and the long
    mix: ``long_fraction`` of the problems with ``digits + 1 .. long_digits``-digit operands).

    ``split`` is ``train`` or ``test`` (``validation``/``val`` are aliases of ``test``). Raises
    ``ValueError`` naming the knob when the problem space of the split is too small for ``n``.
    """
    if split not in _SPLIT_ALIASES:
        raise ValueError(f"embedded split {split!r} is unknown; valid splits: {sorted(_SPLIT_ALIASES)}")
    split = _SPLIT_ALIASES[split]
    if not isinstance(digits, int) or digits < 1:
        raise ValueError(f"embedded digits must be a positive integer, got {digits!r}")
    if not ops or any(op not in OPS for op in ops):
        raise ValueError(f"embedded ops must be a non-empty subset of {OPS!r}, got {ops!r}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"embedded test_fraction must be in (0, 1), got {test_fraction!r}")
    if n < 0:
        raise ValueError(f"embedded n must be >= 0, got {n!r}")
    if not 0.0 <= long_fraction < 1.0:
        raise ValueError(f"embedded long_fraction must be in [0, 1), got {long_fraction!r}")
    if long_fraction > 0 and (not isinstance(long_digits, int) or long_digits <= digits):
        raise ValueError(
            f"embedded long_digits must be an integer > digits={digits} with long_fraction > 0, got {long_digits!r}"
        )
    capacity = split_capacity(split, digits, ops, test_fraction, long_fraction, long_digits)
    if n > capacity:
        raise ValueError(
            f"embedded n={n} is more than the {split} split's {capacity:,} problems it draws from (digits={digits}, "
            f"ops={ops!r}); raise digits or ask for fewer"
        )
    key = f"trustbench-embedded:{seed}:{split}:{digits}:{''.join(sorted(set(ops)))}"
    rng = random.Random(key + (f":long:{long_fraction}:{long_digits}" if long_fraction > 0 else ""))
    examples: list[Example] = []
    seen: set[tuple[int, str, int]] = set()
    attempts, max_attempts = 0, 100 * n + 10_000
    while len(examples) < n:
        attempts += 1
        if attempts > max_attempts:
            raise ValueError(
                f"embedded {split} split with digits={digits}, ops={ops!r} has fewer than n={n} distinct "
                f"problems (found {len(examples)}); raise digits or ask for fewer"
            )
        problem = _sample_problem(rng, digits, ops, long_fraction, long_digits)
        if problem in seen or problem_split(*problem, test_fraction) != split:
            continue
        seen.add(problem)
        examples.append(make_example(*problem, split=split, index=len(examples)))
    return examples
