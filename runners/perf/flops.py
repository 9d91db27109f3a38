"""FLOPs and memory traffic of a decoder-only transformer's phases, from its shape and the sequence lengths.

Design: model FLOPs count the matrix multiplications, as ``torch.utils.flop_counter.FlopCounterMode``
does (2 FLOPs per multiply-add; elementwise work, norms and softmax are not counted), on the real
tokens of each sequence (no padding), as verl's ``FlopsCounter`` does for ``perf/mfu/actor``:

- a full forward over a sequence of L tokens whose last H positions go through the LM head:
  ``2 N L + 2 N_head H + 4 n_layers n_q d L^2`` (N: weights of the matmuls inside the decoder layers;
  attention scores and their product with the values over the whole L x L square, as the kernels
  compute them under a causal mask);
- backward: twice the forward (gradients with respect to the inputs and to the weights);
- generation of r tokens after a prompt of p: a prefill forward over p with one head position, then
  r - 1 single-token steps over a cache of p + t tokens: ``2 N + 2 N_head + 4 n_layers n_q d (p + t)``.

Rows that share a context (a GRPO group's prompt) may run it once (the built-in trainer's packed
forward and its sampler's prefill do): ``computed`` gives the tokens each row runs through the
layers' matmuls (its response alone when another row runs its context; attention still covers the
whole sequence), ``prefilled`` the rows whose prompt is prefilled. Counted so, the FLOPs are those
executed, and MFU and the Roofline points stay below the hardware's ceiling.

Bytes moved (the Roofline's denominator) are a first-order model in the parameter dtype: every matmul
reads its weights once per forward (once per decode step) and its input and output activations once;
attention reads q, k, v and writes its output (fused kernels keep the scores on chip) and a decode
step reads each row's KV cache; backward moves twice the forward's bytes plus the weight gradients;
AdamW reads parameter, gradient and two moments and writes three per optimiser step. For decode this is
T-PPO's arithmetic-intensity model (arXiv 2506.15050, figure 5; ``analysis.roofline``).

Torch-free; ``TransformerShape.from_model`` reads a Hugging Face causal LM.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ADAMW_BYTES_PER_PARAM_FACTOR = 7  # read p, g, m, v; write p, m, v


@dataclass(frozen=True)
class TransformerShape:
    """What the counts need: matmul weights inside the layers and in the head, attention geometry, dtype size."""

    body_params: int  # weights of the matmuls every token goes through (all decoder layers)
    body_io: int  # sum over those matmuls of (in_features + out_features): activation elements per token
    head_params: int  # LM head: hidden x vocab
    hidden: int
    vocab: int
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    bytes_per_param: int = 4
    params: int = 0  # every parameter (embeddings included): weight gradients and optimiser traffic

    @classmethod
    def from_model(cls, model) -> TransformerShape:
        """From a Hugging Face causal LM: its config and the ``nn.Linear`` modules of its decoder layers."""
        import torch

        config = model.config
        head = model.get_output_embeddings()
        linears = [m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m is not head and name]
        q_heads = int(config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // q_heads)
        weight = head.weight
        return cls(
            body_params=sum(m.weight.numel() for m in linears),
            body_io=sum(m.in_features + m.out_features for m in linears),
            head_params=weight.numel(),
            hidden=int(weight.shape[1]),
            vocab=int(weight.shape[0]),
            layers=int(config.num_hidden_layers),
            q_heads=q_heads,
            kv_heads=int(getattr(config, "num_key_value_heads", None) or q_heads),
            head_dim=head_dim,
            bytes_per_param=weight.element_size(),
            params=sum(p.numel() for p in model.parameters()),
        )

    @classmethod
    def from_pretrained_config(
        cls, path: str, *, bytes_per_param: int, trust_remote_code: bool = False
    ) -> TransformerShape:
        """From a Hugging Face model directory or hub id without loading weights: the model is built from
        its config on the meta device. ``bytes_per_param``: the dtype the model computes in (a bf16
        mixed-precision trainer: 2), which the parameters' default float32 would not tell."""
        import dataclasses

        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
        return dataclasses.replace(cls.from_model(model), bytes_per_param=bytes_per_param)

    # -- FLOPs ----------------------------------------------------------------------------------------
    def attention_flops(self, queries: float, keys: float) -> float:
        """QK^T and (scores)V of ``queries`` query tokens over ``keys`` keys, all layers."""
        return 4.0 * self.layers * self.q_heads * self.head_dim * queries * keys

    def forward_flops(
        self, lengths: Sequence[int], head_tokens: Sequence[int], computed: Sequence[int] | None = None
    ) -> float:
        """One forward over sequences of ``lengths`` tokens, ``head_tokens`` of each through the LM head,
        ``computed`` of each through the layers' matmuls (default: all)."""
        computed = lengths if computed is None else computed
        return sum(
            2.0 * self.body_params * c + 2.0 * self.head_params * h + self.attention_flops(n, n)
            for n, h, c in zip(lengths, head_tokens, computed)
        )

    def train_flops(
        self, lengths: Sequence[int], head_tokens: Sequence[int], computed: Sequence[int] | None = None
    ) -> float:
        """Forward and backward (backward = 2 x forward)."""
        return 3.0 * self.forward_flops(lengths, head_tokens, computed)

    def decode_step_flops(self, context: float) -> float:
        """One new token attending to ``context`` cached tokens (itself included)."""
        return 2.0 * self.body_params + 2.0 * self.head_params + self.attention_flops(1, context)

    def generation_flops(
        self, prompts: Sequence[int], responses: Sequence[int], prefilled: Sequence[bool] | None = None
    ) -> float:
        """Prefill of each prompt (of the ``prefilled`` rows; default all), then one decode step per
        response token after the first."""
        total = self.forward_flops(*_prefills(prompts, prefilled))
        for p, r in zip(prompts, responses):
            steps = max(int(r) - 1, 0)
            # sum over t = 1..steps of decode_step_flops(p + t)
            total += steps * (2.0 * self.body_params + 2.0 * self.head_params)
            total += self.attention_flops(1, steps * p + steps * (steps + 1) / 2)
        return total

    # -- bytes --------------------------------------------------------------------------------------
    def forward_bytes(
        self, lengths: Sequence[int], head_tokens: Sequence[int], computed: Sequence[int] | None = None
    ) -> float:
        """Weights once, each matmul's input and output, attention's q, k, v and output (of ``computed``
        tokens per row; default all)."""
        tokens, heads = float(sum(lengths if computed is None else computed)), float(sum(head_tokens))
        per_token = self.body_io + self.layers * (2 * self.q_heads + 2 * self.kv_heads) * self.head_dim
        elements = self.body_params + self.head_params + tokens * per_token + heads * (self.hidden + self.vocab)
        return self.bytes_per_param * elements

    def train_bytes(
        self, lengths: Sequence[int], head_tokens: Sequence[int], computed: Sequence[int] | None = None
    ) -> float:
        """Forward and backward: three times the forward's bytes plus the weight gradients."""
        return 3.0 * self.forward_bytes(lengths, head_tokens, computed) + self.bytes_per_param * self.params

    def optimizer_bytes(self, steps: int = 1) -> float:
        """AdamW: parameter, gradient and two moments read, three written, per step."""
        return ADAMW_BYTES_PER_PARAM_FACTOR * self.bytes_per_param * self.params * steps

    def kv_bytes_per_token(self) -> float:
        """Keys and values of one token in every layer's cache."""
        return 2.0 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_param

    def decode_step_bytes(self, batch: int, context: float) -> float:
        """One decode step of ``batch`` rows over ``context`` cached tokens: weights once, each row's KV cache."""
        return (
            self.bytes_per_param * (self.body_params + self.head_params) + batch * context * self.kv_bytes_per_token()
        )

    def generation_bytes(
        self, prompts: Sequence[int], responses: Sequence[int], prefilled: Sequence[bool] | None = None
    ) -> float:
        """Prefill (of the ``prefilled`` rows), then per decode step the weights once (rows decode together)
        and each active row's KV cache."""
        steps = [max(int(r) - 1, 0) for r in responses]
        weights = max(steps, default=0) * self.decode_step_bytes(0, 0)
        cache = sum(s * p + s * (s + 1) / 2 for p, s in zip(prompts, steps)) * self.kv_bytes_per_token()
        return self.forward_bytes(*_prefills(prompts, prefilled)) + weights + cache


def _prefills(prompts: Sequence[int], prefilled: Sequence[bool] | None) -> tuple[list[int], list[int]]:
    """(lengths, head tokens) of the prefill forward: the prompts of the prefilled rows, one head position each."""
    lengths = [p for i, p in enumerate(prompts) if prefilled is None or prefilled[i]]
    return lengths, [1] * len(lengths)


__all__ = ["TransformerShape"]
