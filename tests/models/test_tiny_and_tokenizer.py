"""Tiny architectures and the character tokenizer.

Checked against: the parameter count formula of the architecture (by hand), transformers' own
save/load round trip, and the embedded task's alphabet and prompts.
"""

from __future__ import annotations

import pytest
import torch

from runners.data.embedded import EMBEDDED_ALPHABET, generate_embedded
from runners.models.tiny import TINY_ARCHS, build_tiny_model, count_parameters
from runners.models.tokenizer import build_char_tokenizer


def expected_parameters(arch: str, vocab: int, h: int = 64, inter: int = 256, layers: int = 4) -> int:
    """Hand count for the TINY_DEFAULTS shape: 4 heads and 2 KV heads of dim 16, tied embeddings."""
    q, kv = 4 * 16, 2 * 16
    attention = h * q + 2 * h * kv + q * h
    if arch == "qwen2":
        attention += q + 2 * kv  # q/k/v biases
    if arch == "qwen3":
        attention += 2 * 16  # q_norm and k_norm over the head dimension
    mlp = 3 * h * inter
    norms = 2 * h
    return vocab * h + layers * (attention + mlp + norms) + h


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_tiny_model_shape_and_size(arch):
    model = build_tiny_model(arch, vocab_size=64)
    assert type(model).__name__.lower().startswith(arch)
    assert count_parameters(model) == expected_parameters(arch, 64)
    assert 0.2e6 < count_parameters(model) < 0.4e6
    assert not model.training and model.dtype == torch.float32


def test_tiny_model_deterministic_and_leaves_global_rng_alone():
    torch.manual_seed(0)
    before = torch.rand(3)
    torch.manual_seed(0)
    a = build_tiny_model("llama", vocab_size=32, seed=4)
    after = torch.rand(3)
    b = build_tiny_model("llama", vocab_size=32, seed=4)
    c = build_tiny_model("llama", vocab_size=32, seed=5)
    assert torch.equal(before, after)
    pa, pb, pc = (torch.cat([p.flatten() for p in m.parameters()]) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)


def test_tiny_model_overrides_and_errors():
    model = build_tiny_model("qwen2", vocab_size=40, num_hidden_layers=2, hidden_size=32, head_dim=8)
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 32
    with pytest.raises(ValueError, match="unknown tiny model arch 'gpt2'.*qwen2, qwen3, llama"):
        build_tiny_model("gpt2", vocab_size=40)


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer(EMBEDDED_ALPHABET)


def test_char_tokenizer_ids_and_round_trip(tokenizer):
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (
        0,
        1,
        2,
        3,
    )
    assert len(tokenizer) == 4 + len(set(EMBEDDED_ALPHABET))
    for example in generate_embedded(20, split="train", seed=3):
        text = example.prompt + example.solution
        ids = tokenizer(text).input_ids
        assert ids[0] == tokenizer.bos_token_id and len(ids) == 1 + len(text)  # one token per character
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert tokenizer("12\n=?").input_ids[1:] == [tokenizer.convert_tokens_to_ids(c) for c in "12\n=?"]
    assert tokenizer("a").input_ids == [1, tokenizer.unk_token_id]


def test_char_tokenizer_left_pads_and_saves(tokenizer, tmp_path):
    from transformers import AutoTokenizer

    batch = tokenizer(["1+2=?\n", "347+285=?\n"], padding=True, return_tensors="pt")
    assert batch.attention_mask.tolist()[0] == [0, 0, 0, 0] + [1] * 7
    assert batch.input_ids[0, :4].tolist() == [tokenizer.pad_token_id] * 4
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "9*7=?\n7*9=63\n\\boxed{63}"
    assert loaded(text).input_ids == tokenizer(text).input_ids
    assert loaded.padding_side == "left" and loaded.eos_token == "<eos>" and loaded.pad_token == "<pad>"


def test_char_tokenizer_rejects_bad_alphabets():
    with pytest.raises(ValueError, match="non-empty"):
        build_char_tokenizer("")
