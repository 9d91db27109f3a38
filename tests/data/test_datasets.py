"""Presets and loaders on hand-written fixtures in each source's schema: golds read as expected by
hand, each preset's reward credits a hand-written correct response and rejects a wrong one, local
file formats agree, and the hub path calls ``datasets.load_dataset`` with the preset's id/split."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from runners.data import datasets as ds
from runners.data.datasets import PRESETS, load_examples, read_rows
from runners.data.rewards import compute_reward

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "datasets"

# preset, fixture, split, options, expected golds (by hand), a correct and a wrong response for the first
CASES = [
    ("gsm8k", "gsm8k.jsonl", "train", {}, ["26", "6", "5000"], "36 - 10 = 26\n#### 26", "#### 36"),
    ("dapo_math", "dapo_math.jsonl", "train", {"holdout": 1}, None, None, None),
    (
        "math500",
        "math500.jsonl",
        "test",
        {},
        ["5\\sqrt{2}", "\\frac{1}{2}"],
        "\\boxed{5\\sqrt{2}}",
        "\\boxed{\\sqrt{50}/2}",
    ),
    ("amc23", "amc23.jsonl", "test", {}, ["54", "23"], "so \\boxed{54}", "\\boxed{30}"),
    ("aime24", "aime24.jsonl", "test", {}, ["22"], "\\boxed{022}", "\\boxed{25}"),
    ("aime25", "aime25.jsonl", "test", {}, ["43"], "\\boxed{43}", "\\boxed{3^5}"),
    ("minerva", "minerva.jsonl", "test", {}, ["300"], "\\boxed{300 \\text{ m}}", "\\boxed{20 \\cdot 15}"),
    ("olympiadbench", "olympiadbench.jsonl", "test", {}, ["\\frac{1}{2}"], "\\boxed{0.5}", "\\boxed{-\\frac{1}{2}}"),
    ("omni_math", "omni_math.jsonl", "test", {}, ["9"], "\\boxed{9}", "\\boxed{6}"),
    ("eurus2_math", "eurus2.jsonl", "train", {}, ["50", "4"], "\\boxed{50}", "\\boxed{7 \\times 8 - 6}"),
    ("embedded", "embedded.json", "train", {}, ["42", "81"], "2+0=2\n1+3=4\n\\boxed{42}", "\\boxed{12+30}"),
]


@pytest.mark.parametrize(("name", "fixture", "split", "options", "golds", "right", "wrong"), CASES)
def test_fixture_golds_and_rewards(name, fixture, split, options, golds, right, wrong):
    examples = load_examples(name, split=split, path=FIXTURES / fixture, **options)
    assert examples and all(e.data_source == name and e.reward_fn == PRESETS[name].reward_fn for e in examples)
    assert all(e.meta["split"] == ("train" if split == "train" else "test") for e in examples)
    if golds is not None:
        assert [e.answer for e in examples] == golds
        first = examples[0]
        assert compute_reward(first.reward_fn, right, first.answer, prompt=first.prompt_text()) == 1.0
        assert compute_reward(first.reward_fn, wrong, first.answer, prompt=first.prompt_text()) == 0.0


def test_source_instructions_are_stripped_from_questions():
    """DAPO's 'Answer:' wrapper and Eurus's boxed instruction go; our prompt style re-adds one."""
    for e in load_examples("dapo_math", split="train", path=FIXTURES / "dapo_math.jsonl", holdout=1):
        assert "Answer:" not in e.prompt and "Remember" not in e.prompt and e.prompt.endswith(("?", "."))
    for e in load_examples("eurus2_math", split="train", path=FIXTURES / "eurus2.jsonl"):
        assert "Present the answer" not in e.prompt and e.meta["source_prompt"][0]["role"] == "system"


def test_dapo_holdout_is_disjoint_fixed_and_complete():
    train = load_examples("dapo_math", split="train", path=FIXTURES / "dapo_math.jsonl", holdout=1, seed=5)
    test = load_examples("dapo_math", split="validation", path=FIXTURES / "dapo_math.jsonl", holdout=1, seed=9)
    assert len(train) == 3 and len(test) == 1
    assert sorted(e.answer for e in train + test) == sorted(["28", "9", "2", "20"])
    again = load_examples("dapo_math", split="test", path=FIXTURES / "dapo_math.jsonl", holdout=1, seed=123)
    assert [e.answer for e in again] == [e.answer for e in test]  # the run seed does not move it


def test_eurus_code_rows_score_with_the_sandbox():
    examples = load_examples("eurus2_code", split="test", path=FIXTURES / "eurus2.jsonl")
    assert [e.meta["source"] for e in examples] == ["taco", "apps"]
    stdin_task, call_task = examples
    json.loads(stdin_task.answer)  # test cases stay a JSON string
    add = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    assert compute_reward("code", add, stdin_task.answer) == 1.0
    assert compute_reward("code", "```python\nprint(3)\n```", stdin_task.answer) == 0.5
    double = "```python\ndef double_all(xs):\n    return [2 * x for x in xs]\n```"
    assert compute_reward("code", double, call_task.answer) == 1.0


def test_parquet_and_json_readers_agree_with_jsonl(tmp_path):
    """Nested columns (chat prompts, reward_model dicts) survive parquet, as on the hub."""
    rows = read_rows(FIXTURES / "eurus2.jsonl")
    parquet = tmp_path / "eurus2.parquet"
    pd.DataFrame(rows).to_parquet(parquet)
    as_json = tmp_path / "eurus2.json"
    as_json.write_text(json.dumps({"data": rows}))
    for name in ("eurus2_math", "eurus2_code"):
        reference = load_examples(name, split="train", path=FIXTURES / "eurus2.jsonl")
        for path in (parquet, as_json):
            loaded = load_examples(name, split="train", path=path)
            assert [(e.prompt, e.answer) for e in loaded] == [(e.prompt, e.answer) for e in reference]


def test_missing_file_names_the_file(tmp_path):
    missing = tmp_path / "nope.parquet"
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        load_examples("gsm8k", split="train", path=missing)


def test_missing_field_names_preset_and_fields(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "q", "solution": "s"}\n')
    with pytest.raises(ValueError, match="'math500'.*answer"):
        load_examples("math500", split="test", path=bad)


def test_hub_path_calls_load_dataset_with_the_preset(monkeypatch):
    """The real code path without network: load_dataset receives the preset's id, config and split."""
    datasets = pytest.importorskip("datasets")
    calls = []

    def fake_load_dataset(hub_id, config=None, split=None):
        calls.append((hub_id, config, split))
        return [json.loads(line) for line in (FIXTURES / "gsm8k.jsonl").read_text().splitlines()]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    examples = load_examples("gsm8k", split="test")
    assert calls == [("openai/gsm8k", "main", "test")] and [e.answer for e in examples] == ["26", "6", "5000"]
    load_examples("eurus2_math", split="validation")
    assert calls[-1] == ("PRIME-RL/Eurus-2-RL-Data", None, "validation")


def test_hub_failure_is_a_clear_error(monkeypatch):
    datasets = pytest.importorskip("datasets")

    def offline(*_args, **_kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(RuntimeError, match=r"'aime25'.*math-ai/aime25.*path="):
        load_examples("aime25", split="test")


def test_limit_random_for_train_first_n_for_eval():
    path = FIXTURES / "gsm8k.jsonl"
    subsets = {
        tuple(e.answer for e in load_examples("gsm8k", split="train", path=path, limit=2, seed=s)) for s in range(12)
    }
    assert len(subsets) > 1  # the seed picks the training subset
    for s in range(5):
        assert [e.answer for e in load_examples("gsm8k", split="test", path=path, limit=2, seed=s)] == ["26", "6"]


def test_embedded_preset_sizes_options_and_fixed_eval_set():
    train = load_examples("embedded", split="train", limit=50, seed=1, digits=2)
    assert len(train) == 50 and max(e.meta["a"] for e in train) < 100
    assert [e.prompt for e in load_examples("embedded", split="train", limit=50, seed=2, digits=2)] != [
        e.prompt for e in train
    ]
    evals = [[e.prompt for e in load_examples("embedded", split="test", limit=20, seed=s)] for s in (0, 7)]
    assert evals[0] == evals[1]  # evaluation problems do not depend on the run seed
    assert len(load_examples("embedded", split="validation")) == PRESETS["embedded"].options["test_size"]


def test_unknown_preset_split_and_option_errors():
    with pytest.raises(KeyError, match="valid presets"):
        load_examples("mnist", split="train")
    with pytest.raises(ValueError, match="no split 'train'.*valid splits"):
        load_examples("aime24", split="train")
    with pytest.raises(ValueError, match="no option.*'digits'"):
        load_examples("gsm8k", split="train", path=FIXTURES / "gsm8k.jsonl", digits=3)


def test_every_preset_is_complete():
    from runners.data.prompts import INSTRUCTIONS
    from runners.data.rewards import REWARDS

    expected = {
        "gsm8k",
        "dapo_math",
        "math500",
        "amc23",
        "aime24",
        "aime25",
        "minerva",
        "olympiadbench",
        "omni_math",
        "eurus2_math",
        "eurus2_code",
        "embedded",
    }
    assert set(PRESETS) == expected
    for preset in PRESETS.values():
        assert preset.reward_fn in REWARDS
        assert preset.prompt_style is None or preset.prompt_style in INSTRUCTIONS
        assert preset.hub_id is not None or preset.name == "embedded"
    assert ds.answer_to_str(27.0) == "27" and ds.answer_to_str(["$3$", "$4$"]) == "3, 4"
