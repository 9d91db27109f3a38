"""The trainer's forward without padding: Llama-family layers on the real tokens only.

Design: a training batch is a left-padded context and a right-padded segment (``RolloutBatch``);
with 8 x 8 responses of 5 to 48 tokens, about a third of the ``[B, C+R]`` grid is padding, and the
HF forward spends its matmuls, norms and MLPs on it (forward and backward). Here every per-token
operation runs on the ``N`` real tokens packed into ``[N, H]``: the embedding, each layer's norms,
projections, RoPE and MLP (the model's own modules, so the same arithmetic per token) and the
final norm. Only attention needs rows: each row's real tokens (contiguous in the packed order) are
laid out from column 0, rows sorted by length and split into up to ``ATTENTION_BUCKETS`` buckets of
about equal row counts, each bucket only as wide as its longest row; one SDPA call per bucket with
the causal mask over the row's real keys (a padding query sees the row's keys, so no row is fully
masked: no NaN to propagate), and the outputs gathered back into packed order. Attention's cost
grows with the square of the width: with 8 x 8 responses of 5 to 48 tokens one bucket as wide as the
longest row costs about twice what four do. RoPE keeps every token's own position, so the result is
the padded forward's. The hidden states predicting the segment are returned as ``[B, R, H]``, zero
at positions no real token predicts (they are masked everywhere).

Supported: ``llama``, ``qwen2``, ``qwen3`` with SDPA and only full-attention layers
(``runners.models.decoders.supports_fast_decode``) and no dropout in the current mode; anything
else takes the HF forward (``runners.backends.local.policy.segment_hidden``).
tests/backends/test_packed.py checks values and gradients against the HF forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# rows of a forward are split by real length into at most this many attention calls
ATTENTION_BUCKETS = 4


def supports_packed(model: nn.Module) -> bool:
    from runners.backends.local.policy import dropout_free
    from runners.models.decoders import supports_fast_decode

    return supports_fast_decode(model) and dropout_free(model)


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """HF's ``apply_rotary_pos_emb`` for one tensor: x [N, heads, d], cos/sin [N, 1, d] (half-split rotation)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


@dataclass(frozen=True)
class _Bucket:
    """Rows attending together: ``gather`` [rows * width] packed index of each grid cell (padding: the
    row's first token), ``mask`` [rows, 1, width, width], ``real`` the grid cells that hold tokens."""

    rows: int
    width: int
    gather: Tensor
    mask: Tensor
    real: Tensor


@dataclass(frozen=True)
class AttentionLayout:
    """How packed tokens are laid out for attention: the buckets, and ``inverse`` [N], the position of each
    packed token in the buckets' real cells concatenated."""

    buckets: list[_Bucket]
    inverse: Tensor

    @classmethod
    def of(cls, lengths: Tensor, buckets: int) -> AttentionLayout:
        """lengths [B] real tokens per row, each row's tokens contiguous in the packed order."""
        device = lengths.device
        starts = lengths.cumsum(0) - lengths
        total = int(lengths.sum())
        order = torch.argsort(lengths, stable=True)
        out, cells = [], []
        for rows in torch.tensor_split(order, min(buckets, len(order))):
            if rows.numel() == 0:
                continue
            length = lengths[rows]
            width = max(int(length.max()), 1)
            col = torch.arange(width, device=device)
            inside = col[None, :] < length[:, None]  # [rows, width]
            # padding cells repeat the row's first token: only padding queries, whose outputs are
            # dropped, see them, so no zero row has to be appended to q, k and v
            gather = (starts[rows, None] + torch.where(inside, col[None, :], 0)).reshape(-1)
            causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
            diagonal = torch.eye(width, dtype=torch.bool, device=device)
            mask = (causal[None, None] & inside[:, None, None, :]) | diagonal[None, None]
            real = inside.reshape(-1).nonzero().squeeze(-1)
            out.append(_Bucket(len(rows), width, gather, mask, real))
            cells.append(gather[real])
        inverse = torch.empty(total, dtype=torch.long, device=device)
        inverse[torch.cat(cells)] = torch.arange(total, device=device)
        return cls(out, inverse)


def _attention(attn, x: Tensor, cos: Tensor, sin: Tensor, layout: AttentionLayout) -> Tensor:
    """One self-attention block on packed tokens x [N, H] -> [N, H]."""
    d = attn.head_dim
    q = attn.q_proj(x).view(x.shape[0], -1, d)
    k = attn.k_proj(x).view(x.shape[0], -1, d)
    v = attn.v_proj(x).view(x.shape[0], -1, d)
    if hasattr(attn, "q_norm"):  # qwen3: per-head RMSNorm before RoPE
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = _rope(q, cos, sin), _rope(k, cos, sin)
    outs = []
    for b in layout.buckets:
        # [N, heads, d] -> [rows, heads, width, d]
        q_b, k_b, v_b = (t[b.gather].view(b.rows, b.width, t.shape[1], d).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(
            q_b, k_b, v_b, attn_mask=b.mask, scale=attn.scaling, enable_gqa=q.shape[1] != k.shape[1]
        )
        outs.append(out.transpose(1, 2).reshape(b.rows * b.width, -1)[b.real])
    return attn.o_proj(torch.cat(outs)[layout.inverse])


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
    layout = AttentionLayout.of(valid.sum(-1), ATTENTION_BUCKETS)
    for layer in base.layers[: model.config.num_hidden_layers]:
        hidden = hidden + _attention(layer.self_attn, layer.input_layernorm(hidden), cos, sin, layout)
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
