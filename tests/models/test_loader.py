"""``load_model``: hub ids and local directories, tiny models, errors that name what is wrong.

The local-directory fixture is a tiny model plus the char tokenizer written with ``save_pretrained``;
the reference is the in-memory model it was saved from (same logits) and the tokenizer's own ids.
"""

from __future__ import annotations

import pytest
import torch

from runners.models import MODEL_KINDS, load_model
from runners.registry import UnknownNameError


@pytest.fixture(scope="module")
def saved_tiny(tmp_path_factory):
    """(directory, model, tokenizer) of a tiny Qwen2 saved in the Hugging Face layout."""
    model, tokenizer = load_model("tiny", arch="qwen2", seed=7)
    folder = tmp_path_factory.mktemp("tiny_qwen2")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, model, tokenizer


def test_hub_kind_loads_local_directory(saved_tiny):
    folder, reference, ref_tokenizer = saved_tiny
    model, tokenizer = load_model("hub", path=str(folder))
    assert type(model) is type(reference) and not model.training
    text = "12+34=?\n2+4=6\n1+3=4\n\\boxed{46}"
    ids = tokenizer(text, return_tensors="pt").input_ids
    assert ids[0].tolist() == ref_tokenizer(text).input_ids
    # newlines survive the reload (a plain AutoTokenizer turns this qwen2 folder's char tokenizer into
    # a byte-level Qwen2Tokenizer that drops them; runners.models.loader.load_tokenizer keeps the file)
    assert tokenizer.decode(ids[0], skip_special_tokens=True) == text
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits)
    assert tokenizer.padding_side == "left" and tokenizer.pad_token_id == ref_tokenizer.pad_token_id


def test_hub_kind_dtype(saved_tiny):
    model, _ = load_model("hub", path=str(saved_tiny[0]), dtype="bfloat16")
    assert model.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown model dtype 'fp8'"):
        load_model("hub", path=str(saved_tiny[0]), dtype="fp8")


def test_hub_kind_errors_name_the_path_or_id(tmp_path, monkeypatch):
    missing = tmp_path / "no_such_model"
    with pytest.raises(FileNotFoundError, match="no_such_model"):
        load_model("hub", path=str(missing))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_model("hub", path=str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="trustbench-tests/no-such-model.*HF_HUB_OFFLINE"):
        load_model("hub", path="trustbench-tests/no-such-model")
    with pytest.raises(ValueError, match="needs `path`"):
        load_model("hub")


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama"])
def test_tiny_kind(arch):
    model, tokenizer = load_model("tiny", arch=arch, seed=1, num_hidden_layers=2)
    assert model.config.model_type == arch and model.config.num_hidden_layers == 2
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.eos_token_id == tokenizer.eos_token_id


def test_unknown_kind_and_misplaced_arguments():
    with pytest.raises(UnknownNameError, match="unknown model kind 'gpt5'; valid names: embedded, hub, smollm2, tiny"):
        load_model("gpt5")
    with pytest.raises(TypeError, match=r"does not take \['path'\]"):
        load_model("smollm2", path="/somewhere")
    assert MODEL_KINDS.names() == ["embedded", "hub", "smollm2", "tiny"]


def test_concurrent_loads_leave_weight_tying_intact(saved_tiny):
    """Threads loading and building models at once: every model ties its lm_head to its embedding,
    and so does a model built afterwards. transformers' load-time contexts swap methods on the
    PreTrainedModel class; unserialised, overlapping loads leave tying switched off process-wide
    (without MODEL_BUILD_LOCK this fails in the first round)."""
    import threading

    from transformers.modeling_utils import PreTrainedModel

    folder = str(saved_tiny[0])
    originals = {name: getattr(PreTrainedModel, name) for name in ("tie_weights", "init_weights")}
    models, errors = [], []

    def work(i: int):
        try:
            kind = {"path": folder} if i % 2 else {"arch": "llama", "seed": i}
            models.append(load_model("hub" if i % 2 else "tiny", **kind)[0])
        except BaseException as err:  # reported below
            errors.append(err)

    try:
        for _ in range(3):
            threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        after, _ = load_model("tiny", arch="qwen3")
        swapped = [name for name, method in originals.items() if getattr(PreTrainedModel, name) is not method]
    finally:  # never leave a broken class behind for the tests that follow
        for name, method in originals.items():
            setattr(PreTrainedModel, name, method)
    assert not errors and len(models) == 12
    assert swapped == []
    for model in [*models, after]:
        assert model.lm_head.weight is model.get_input_embeddings().weight
