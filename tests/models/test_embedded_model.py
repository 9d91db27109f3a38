"""The embedded default: built from scratch with a reduced recipe, cached, reused, deterministic.

References: the recipe fields (cache key), the embedded task's own prompts and solutions (SFT
labels), the reward registry (accuracy), and counting how often training runs.
"""

from __future__ import annotations

import json
import threading

import pytest
import torch

import runners.models.embedded as embedded
from runners.data.embedded import EMBEDDED_ALPHABET, generate_embedded
from runners.models.embedded import (
    build_embedded_model,
    embedded_model_dir,
    encode_sft_batch,
    load_embedded_model,
    make_recipe,
)
from runners.models.tokenizer import build_char_tokenizer

# a few seconds on 2 cores; the default recipe is the same code with more steps and data
SMALL = {"steps": 12, "n_train": 300, "batch_size": 16}


def weights(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.fixture
def count_training(monkeypatch):
    """Counts calls of the training function (wrapping the real one)."""
    calls = []
    real = embedded.train_embedded_model

    def counting(recipe, **kw):
        calls.append(recipe)
        return real(recipe, **kw)

    monkeypatch.setattr(embedded, "train_embedded_model", counting)
    return calls


def test_builds_then_reuses_cache(tmp_path, count_training):
    model, tokenizer = load_embedded_model(cache_dir=tmp_path, progress=False, **SMALL)
    folder = embedded_model_dir(make_recipe(**SMALL), tmp_path)
    assert folder.parent == tmp_path / "embedded" and len(count_training) == 1
    build = json.loads((folder / "build.json").read_text())
    assert json.loads((folder / "recipe.json").read_text())["steps"] == SMALL["steps"]
    assert len(build["loss_curve"]) == SMALL["steps"]
    assert build["loss_curve"][-1] < build["loss_curve"][0]  # supervised training made progress
    assert type(model).__name__ == "LlamaForCausalLM" and not model.training

    again, tokenizer2 = load_embedded_model(cache_dir=tmp_path, progress=False, **SMALL)
    assert len(count_training) == 1, "second load must come from the cache"
    assert torch.equal(weights(model), weights(again))
    text = "12+9=?\n2+9=11\n1+0+1=2\n\\boxed{21}"
    assert tokenizer2(text).input_ids == tokenizer(text).input_ids

    load_embedded_model(cache_dir=tmp_path, progress=False, **{**SMALL, "seed": 1})
    assert len(count_training) == 2, "a different recipe is a different model"


def test_deterministic_from_seed(tmp_path):
    a, _ = load_embedded_model(cache_dir=tmp_path / "a", progress=False, **SMALL)
    b, _ = load_embedded_model(cache_dir=tmp_path / "b", progress=False, **SMALL)
    assert torch.equal(weights(a), weights(b))


def test_parallel_builders_train_once(tmp_path, count_training):
    """Two concurrent loads of a missing model: the file lock makes one build and one wait."""
    errors: list[BaseException] = []

    def load():
        try:
            load_embedded_model(cache_dir=tmp_path, progress=False, **SMALL)
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=load) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(count_training) == 1


def test_recipe_hash_and_validation():
    assert make_recipe().key() == make_recipe().key()
    assert make_recipe(lr=1e-3).key() != make_recipe().key()
    with pytest.raises(TypeError, match=r"unknown embedded recipe field\(s\) \['learning_rate'\]"):
        make_recipe(learning_rate=1e-3)
    with pytest.raises(ValueError, match="steps"):
        make_recipe(steps=0)


def test_sft_labels_cover_exactly_the_response_and_eos():
    tokenizer = build_char_tokenizer(EMBEDDED_ALPHABET)
    examples = generate_embedded(5, split="train", seed=2)
    ids, mask, labels = encode_sft_batch(examples, tokenizer)
    for row, example in enumerate(examples):
        n = int(mask[row].sum())
        prompt_len = 1 + len(example.prompt)  # <bos> + one token per character
        assert tokenizer.decode(ids[row, :n]) == "<bos>" + example.prompt + example.solution + "<eos>"
        assert (labels[row, :prompt_len] == -100).all() and (labels[row, n:] == -100).all()
        target = tokenizer.decode(labels[row, prompt_len:n])
        assert target == example.solution + "<eos>"


def test_built_model_is_saved_with_a_portable_tokenizer(tmp_path):
    """A plain AutoTokenizer (as verl uses) reads the cached folder without mangling newlines."""
    from transformers import AutoTokenizer

    folder = build_embedded_model(make_recipe(**SMALL), cache_dir=tmp_path, progress=False)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = "5*7=?\n5*7=35\n\\boxed{35}"
    assert tokenizer.decode(tokenizer(text).input_ids, skip_special_tokens=True) == text


def test_recipe_fields_added_later_keep_the_old_key_at_their_default():
    """The long-mix fields enter the cache key only when set: the default recipe's key is the hash of the
    fields it had before them (recomputed here), so an existing cached model is still found."""
    import dataclasses
    import hashlib

    old = {k: v for k, v in dataclasses.asdict(make_recipe()).items() if k not in ("long_fraction", "long_digits")}
    assert make_recipe().key() == hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:16]
    assert make_recipe(long_fraction=0.1, long_digits=10).key() != make_recipe().key()
