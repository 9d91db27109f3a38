"""A generated dataset asks for no more problems than its split holds: the generator's problem space is
counted here by enumerating every problem it can draw (small digits), and a size beyond the split's
capacity is refused at compose time, naming the key, instead of drawing for ever
(``dataset.train_limit=1000000000`` ran past 90 s before)."""

from __future__ import annotations

import random

import pytest

from runners.config import ConfigError, compose
from runners.data.embedded import _sample_problem, generate_embedded, problem_space, split_capacity


@pytest.mark.parametrize(("digits", "ops"), [(1, "+-*"), (2, "+"), (2, "-*"), (1, "*")])
def test_problem_space_counts_what_the_sampler_draws(digits, ops):
    """Enumerate every (a, op, b) the sampler can produce and compare the count; 200,000 random draws
    find nothing outside it."""
    values = range(10**digits)
    space = set()
    for op in ops:
        for a in values:
            for b in range(2, 10) if op == "*" else values:
                space.add((max(a, b), op, min(a, b)) if op == "-" else (a, op, b))
    assert problem_space(digits, ops) == len(space)
    rng = random.Random(0)
    assert all(_sample_problem(rng, digits, ops) in space for _ in range(200_000))


def test_the_generator_refuses_more_than_the_split_holds():
    capacity = split_capacity("train", 2, "+", 0.1)
    assert capacity == int(100 * 100 * 0.9)
    assert len(generate_embedded(capacity // 2, split="train", digits=2, ops="+")) == capacity // 2
    with pytest.raises(ValueError, match=f"n={capacity + 1} is more than the train split's {capacity:,}"):
        generate_embedded(capacity + 1, split="train", digits=2, ops="+")


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["dataset.train_limit=1000000000"], "dataset.train_limit"),
        (["dataset.eval_limit=400000"], "dataset.eval_limit"),
        (["+dataset.options.train_size=5000000"], "dataset.options.train_size"),
    ],
)
def test_compose_names_the_size_that_is_too_large(overrides, key):
    with pytest.raises(ConfigError) as err:
        compose(overrides)
    assert err.value.key == key and "raise dataset.options.digits or ask for fewer" in str(err.value)
    compose(["dataset.train_limit=20000", "dataset.eval_limit=1000"])
