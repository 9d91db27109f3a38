"""The trainer's forward without padding: Llama-family layers on the real tokens only.

Design: a training batch is a left-padded context and a right-padded segment (``RolloutBatch``);
with 8 x 8 responses of 5 to 48 tokens, about a third of the ``[B, C+R]`` grid is padding, and the
HF forward spends its matmuls, norms and MLPs on it (forward and backward). Here every per-token
operation runs on the ``N`` real tokens packed into ``[N, H]``: the embedding, each layer's norms,
projections, RoPE and MLP (the model's own modules, so the same arithmetic per token) and the
final norm. Only attention needs the rows' layout: q, k and v are scattered into ``[B, heads, L, d]``
for one SDPA call with the causal and padding mask (a padding query attends to itself, so no row is
fully masked: no NaN to propagate), and gathered back. The hidden states predicting the segment are
returned as ``[B, R, H]``, zero at positions no real token predicts (they are masked everywhere).

Supported: ``llama``, ``qwen2``, ``qwen3`` with SDPA and only full-attention layers
(``runners.models.decoders.supports_fast_decode``) and no dropout in the current mode; anything
else takes the HF forward (``runners.backends.local.policy.segment_hidden``).
tests/backends/test_packed.py checks values and gradients against the HF forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def supports_packed(model: nn.Module) -> bool:
    from runners.backends.local.policy import dropout_free
    from runners.models.decoders import supports_fast_decode

    return supports_fast_decode(model) and dropout_free(model)


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """HF's ``apply_rotary_pos_emb`` for one tensor: x [N, heads, d], cos/sin [N, 1, d] (half-split rotation)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _attention(attn, x: Tensor, cos: Tensor, sin: Tensor, real: Tensor, mask: Tensor, shape: tuple[int, int]) -> Tensor:
    """One self-attention block on packed tokens x [N, H] -> [N, H] (``real``: flat indices of the tokens)."""
    batch, width = shape
    d = attn.head_dim
    q = attn.q_proj(x).view(x.shape[0], -1, d)
    k = attn.k_proj(x).view(x.shape[0], -1, d)
    v = attn.v_proj(x).view(x.shape[0], -1, d)
    if hasattr(attn, "q_norm"):  # qwen3: per-head RMSNorm before RoPE
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = _rope(q, cos, sin), _rope(k, cos, sin)

    def grid(t: Tensor) -> Tensor:  # [N, heads, d] -> [B, heads, L, d], zeros at padding
        full = t.new_zeros(batch * width, t.shape[1], d).index_copy(0, real, t)
        return full.view(batch, width, t.shape[1], d).transpose(1, 2)

    out = F.scaled_dot_product_attention(
        grid(q), grid(k), grid(v), attn_mask=mask, scale=attn.scaling, enable_gqa=q.shape[1] != k.shape[1]
    )
    out = out.transpose(1, 2).reshape(batch * width, -1)[real]
    return attn.o_proj(out)


def packed_segment_hidden(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, context_length: int) -> Tensor:
    """Last hidden states [B, R, H] at the positions that predict the segment (``segment_hidden``'s contract)."""
    base = model.model
    batch, width = input_ids.shape
    valid = attention_mask.bool()
    real = valid.reshape(-1).nonzero().squeeze(-1)  # flat indices of the N real tokens
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0).reshape(-1)[real]
    hidden = base.embed_tokens(input_ids.reshape(-1)[real])  # [N, H]
    cos, sin = base.rotary_emb(hidden[None], positions[None])
    cos, sin = cos[0, :, None, :], sin[0, :, None, :]  # [N, 1, d]
    causal = torch.ones(width, width, dtype=torch.bool, device=input_ids.device).tril()
    diagonal = torch.eye(width, dtype=torch.bool, device=input_ids.device)
    mask = (causal[None, None] & valid[:, None, None, :]) | diagonal[None, None]  # [B, 1, L, L]
    for layer in base.layers[: model.config.num_hidden_layers]:
        hidden = hidden + _attention(
            layer.self_attn, layer.input_layernorm(hidden), cos, sin, real, mask, (batch, width)
        )
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    hidden = base.norm(hidden)
    # packed index of each grid cell (-1: padding), then the cells C-1 .. L-2 that predict the segment
    index = torch.full((batch * width,), -1, dtype=torch.long, device=input_ids.device)
    index[real] = torch.arange(real.numel(), device=input_ids.device)
    segment = index.view(batch, width)[:, context_length - 1 : -1].reshape(-1)
    keep = (segment >= 0).nonzero().squeeze(-1)
    out = hidden.new_zeros(segment.numel(), hidden.shape[-1]).index_copy(0, keep, hidden[segment[keep]])
    return out.view(batch, width - context_length, -1)


__all__ = ["packed_segment_hidden", "supports_packed"]
