"""The embedded task: column steps checked against Python's own arithmetic, split disjointness,
determinism, the alphabet and the difficulty knob."""

from __future__ import annotations

import itertools
import operator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runners.data.embedded import (
    EMBEDDED_ALPHABET,
    generate_embedded,
    parse_prompt,
    problem_split,
    reference_solution,
    solution_lines,
)

PY_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


@given(a=st.integers(0, 10**9), b=st.integers(0, 10**9), op=st.sampled_from("+-*"))
def test_column_steps_match_python_arithmetic(a, b, op):
    """The worked column procedure (the warm-start target) gives Python's result for any operands."""
    if op == "-" and a < b:
        a, b = b, a
    if op == "*":
        b %= 10
    _, result = solution_lines(a, op, b)
    assert result == PY_OPS[op](a, b)


@given(a=st.integers(0, 10**6), b=st.integers(0, 10**6), op=st.sampled_from("+-*"))
def test_each_column_line_is_true_arithmetic(a, b, op):
    """Every step line 't op d [+-c] = v' is itself a true equation (checked by evaluating it)."""
    if op == "-" and a < b:
        a, b = b, a
    if op == "*":
        b %= 10
    lines, _ = solution_lines(a, op, b)
    for line in lines:
        lhs, rhs = line.split("=")
        assert eval(lhs) == int(rhs), line  # noqa: S307 - digits and + - * only


def test_hand_worked_cases():
    """Hand-computed: carries, borrows across zeros, a final carry, multiplication carries."""
    assert reference_solution(95, "+", 17) == "5+7=12\n9+1+1=11\n\\boxed{112}"
    assert reference_solution(347, "-", 285) == "7-5=2\n4-8=-4\n3-2-1=0\n\\boxed{62}"
    assert reference_solution(1000, "-", 1) == "0-1=-1\n0-0-1=-1\n0-0-1=-1\n1-0-1=0\n\\boxed{999}"
    assert reference_solution(347, "*", 6) == "7*6=42\n4*6+4=28\n3*6+2=20\n\\boxed{2082}"
    assert reference_solution(0, "+", 0) == "0+0=0\n\\boxed{0}"


def test_generated_answers_equal_the_evaluated_prompt():
    """Gold answers equal Python's evaluation of the prompt text itself (an independent parser)."""
    for ex in generate_embedded(300, split="train", seed=3) + generate_embedded(100, split="test", seed=3):
        expression = ex.prompt.removesuffix("=?\n")
        assert int(ex.answer) == eval(expression)  # noqa: S307
        assert ex.solution.endswith(f"\\boxed{{{ex.answer}}}")
        assert parse_prompt(ex.prompt) == (ex.meta["a"], ex.meta["op"], ex.meta["b"])


def test_train_and_test_are_disjoint_even_under_commutation():
    train = generate_embedded(3000, split="train", digits=2)
    test = generate_embedded(300, split="test", digits=2)

    def canon(e):
        a, op, b = e.meta["a"], e.meta["op"], e.meta["b"]
        return (min(a, b), op, max(a, b)) if op in "+*" else (a, op, b)

    assert not {canon(e) for e in train} & {canon(e) for e in test}
    assert len({e.prompt for e in train}) == len(train)  # distinct within a split


def test_test_fraction_of_the_problem_space():
    """About 10% of all 2-digit additions (canonical forms) hash into the test split."""
    pairs = {(min(a, b), max(a, b)) for a, b in itertools.product(range(100), repeat=2)}
    frac = sum(problem_split(a, "+", b) == "test" for a, b in pairs) / len(pairs)
    assert 0.08 < frac < 0.12


def test_deterministic_seeded_and_prefix_stable():
    a = generate_embedded(50, seed=1)
    assert [e.prompt for e in a] == [e.prompt for e in generate_embedded(50, seed=1)]
    assert [e.prompt for e in a] != [e.prompt for e in generate_embedded(50, seed=2)]
    assert [e.prompt for e in generate_embedded(20, seed=1)] == [e.prompt for e in a[:20]]
    assert [e.prompt for e in generate_embedded(5, split="validation")] == [
        e.prompt for e in generate_embedded(5, split="test")
    ]


def test_alphabet_covers_prompts_and_solutions():
    used = set()
    for digits in (1, 3, 6):
        for ex in generate_embedded(200, digits=digits):
            used |= set(ex.prompt) | set(ex.solution)
    assert used <= set(EMBEDDED_ALPHABET)
    assert len(EMBEDDED_ALPHABET) == len(set(EMBEDDED_ALPHABET)) < 32


@pytest.mark.parametrize("digits", [1, 2, 4])
def test_difficulty_knob_bounds_operands_and_lengthens_responses(digits):
    examples = generate_embedded(150 if digits == 1 else 400, digits=digits)
    assert max(max(e.meta["a"], e.meta["b"]) for e in examples) < 10**digits
    assert max(e.meta["columns"] for e in examples) == digits
    mean_len = sum(len(e.solution) for e in examples) / len(examples)
    assert 10 < mean_len < 20 * digits + 20


def test_default_responses_have_tens_of_characters():
    mean_len = sum(len(e.solution) for e in generate_embedded(500)) / 500
    assert 20 <= mean_len <= 60


def test_ops_knob_and_clear_errors():
    assert {e.meta["op"] for e in generate_embedded(100, ops="*")} == {"*"}
    with pytest.raises(ValueError, match="digits=1"):
        generate_embedded(500, split="test", digits=1, ops="+")
    with pytest.raises(ValueError, match="split 'dev'"):
        generate_embedded(5, split="dev")
    with pytest.raises(ValueError, match="ops"):
        generate_embedded(5, ops="/")


def test_long_mix_gives_long_tailed_responses():
    """long_fraction of the problems get digits+1..long_digits-digit operands (a binomial share), one column
    line per digit: their responses are several times longer than the others; every answer is still
    Python's, splits stay disjoint, and the mix is deterministic."""
    n, p = 2000, 0.1
    examples = generate_embedded(n, seed=3, digits=3, long_fraction=p, long_digits=10)
    long_ = [e for e in examples if e.meta["columns"] > 3]
    share = len(long_) / n
    assert abs(share - p) < 4 * (p * (1 - p) / n) ** 0.5  # within 4 binomial standard deviations
    assert all(4 <= e.meta["columns"] <= 10 and max(e.meta["a"], e.meta["b"]) < 10**10 for e in long_)
    assert all(int(e.answer) == PY_OPS[e.meta["op"]](e.meta["a"], e.meta["b"]) for e in examples)
    short = [len(e.solution) for e in examples if e.meta["columns"] <= 3]
    assert sum(len(e.solution) for e in long_) / len(long_) > 2.5 * sum(short) / len(short)
    assert max(len(e.solution) for e in long_) > 3 * max(short) - 10
    again = generate_embedded(n, seed=3, digits=3, long_fraction=p, long_digits=10)
    assert [e.prompt for e in again] == [e.prompt for e in examples]
    test = {e.prompt for e in generate_embedded(300, split="test", long_fraction=p, long_digits=10)}
    assert not test & {e.prompt for e in examples}


def test_without_the_long_mix_the_generator_draws_what_it_drew_before():
    """long_fraction=0 consumes no extra random draw: the problems are those of the generator without the
    option (re-implemented here from the documented sampling rule: op, then the operands)."""
    import random

    rng = random.Random("trustbench-embedded:5:train:3:*+-")
    expected = []
    while len(expected) < 30:
        op = rng.choice("+-*")
        k = rng.randint(1, 3)
        a = rng.randint(0 if k == 1 else 10 ** (k - 1), 10**k - 1)
        if op == "*":
            b = rng.randint(2, 9)
        else:
            k = rng.randint(1, 3)
            b = rng.randint(0 if k == 1 else 10 ** (k - 1), 10**k - 1)
            a, b = (b, a) if op == "-" and a < b else (a, b)
        if problem_split(a, op, b) == "train" and f"{a}{op}{b}=?\n" not in expected:
            expected.append(f"{a}{op}{b}=?\n")
    assert [e.prompt for e in generate_embedded(30, seed=5, long_fraction=0.0)] == expected


def test_long_mix_errors_name_the_knob():
    with pytest.raises(ValueError, match="long_fraction"):
        generate_embedded(5, long_fraction=1.0, long_digits=6)
    with pytest.raises(ValueError, match="long_digits"):
        generate_embedded(5, digits=3, long_fraction=0.1, long_digits=3)


def test_dataset_options_reach_the_long_mix():
    from runners.data.datasets import load_examples

    plain = load_examples("embedded", split="train", limit=300)
    mixed = load_examples("embedded", split="train", limit=300, long_fraction=0.2, long_digits=8)
    assert max(e.meta["columns"] for e in plain) == 3
    assert 20 < sum(e.meta["columns"] > 3 for e in mixed) < 100 and max(e.meta["columns"] for e in mixed) <= 8
