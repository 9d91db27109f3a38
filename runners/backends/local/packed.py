"""The trainer's forward without padding: Llama-family layers on the real tokens only.

Design: a training batch is a left-padded context and a right-padded segment (``RolloutBatch``);
with 8 x 8 responses of 5 to 48 tokens, about a third of the ``[B, C+R]`` grid is padding, and the
HF forward spends its matmuls, norms and MLPs on it (forward and backward). Here every per-token
operation runs on the ``N`` real tokens packed into ``[N, H]``: the embedding, each layer's norms,
projections, RoPE and MLP (the model's own modules, so the same arithmetic per token) and the
final norm. RoPE keeps every token's own position, so the result is the padded forward's.

Shared contexts: rows with equal contexts (the n responses of a GRPO group share their prompt) run
that context once. Its tokens are packed for the first such row only; the other rows' attention
reads their keys and values from there. With 8 x 8 responses of ~28 tokens after ~10-token prompts,
a quarter fewer tokens go through every matmul, norm and MLP, forward and backward. The gradients
are the padded forward's: a shared token's gradient is summed over the rows that read it.

Attention needs rows: each row's real tokens (its own, and a shared context's) are laid out from
column 0, rows sorted by length and split into up to ``ATTENTION_BUCKETS`` buckets of about equal row
counts, each bucket only as wide as its longest row; one causal SDPA call per bucket. The causal mask
is exact for every real query, since a row's real tokens fill columns 0 .. length-1; padding cells
repeat the row's first token, and only padding queries, whose outputs are dropped, see them (as are
a shared context's queries in the rows that read it). The outputs are gathered back into packed
order. Attention's cost grows with the square of the width: with 8 x 8 responses of 5 to 48 tokens
one bucket as wide as the longest row costs about twice what four do. The hidden states predicting
the segment are returned as ``[B, R, H]``, zero at positions no real token predicts (they are masked
everywhere).

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

from runners.models.sampler import first_of_equal_rows

# rows of a forward are split by real length into at most this many attention calls
ATTENTION_BUCKETS = 4


def dropout_free(model: nn.Module) -> bool:
    """True when training mode computes what eval mode does: no dropout module or config rate above 0."""
    if any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()):
        return False
    config = getattr(model, "config", None)
    rates = [v for k, v in (vars(config).items() if config is not None else []) if "dropout" in k]
    return all(not isinstance(v, (int, float)) or v == 0 for v in rates)


def supports_packed(model: nn.Module) -> bool:
    from runners.models.decoders import supports_fast_decode

    return supports_fast_decode(model) and dropout_free(model)


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """HF's ``apply_rotary_pos_emb`` for one tensor: x [N, heads, d], cos/sin [N, 1, d] (half-split rotation)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


@dataclass(frozen=True)
class _Bucket:
    """Rows attending together: ``gather`` [rows * width] packed index of each grid cell (padding: the
    row's first token), ``real`` the grid cells whose outputs are kept (one per packed token)."""

    rows: int
    width: int
    gather: Tensor
    real: Tensor


@dataclass(frozen=True)
class AttentionLayout:
    """How packed tokens are laid out for attention: the buckets, and ``inverse`` [N], the position of each
    packed token in the buckets' real cells concatenated."""

    buckets: list[_Bucket]
    inverse: Tensor

    @classmethod
    def of(cls, tokens: Tensor, lengths: Tensor, owned: Tensor, buckets: int) -> AttentionLayout:
        """Rows of packed tokens, grouped into at most ``buckets`` attention calls.

        tokens [B, L] long: the packed index of each row's k-th real token at column k (k < lengths[b]; the
        rest is ignored); a token may sit in several rows (a shared context). owned [B, L] bool: the one
        cell per packed token whose attention output is kept (a row's own tokens).
        """
        device = lengths.device
        total = int(owned.sum())
        order = torch.argsort(lengths, stable=True)
        out, cells = [], []
        for rows in torch.tensor_split(order, min(buckets, len(order))):
            if rows.numel() == 0:
                continue
            length = lengths[rows]
            width = max(int(length.max()), 1)
            inside = torch.arange(width, device=device)[None, :] < length[:, None]  # [rows, width]
            # padding cells repeat the row's first token: with a causal mask only padding queries, whose
            # outputs are dropped, see them, so no zero row has to be appended to q, k and v
            row_tokens = tokens[rows, :width]
            gather = torch.where(inside, row_tokens, row_tokens[:, :1]).reshape(-1)
            real = (inside & owned[rows, :width]).reshape(-1).nonzero().squeeze(-1)
            out.append(_Bucket(len(rows), width, gather, real))
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
        # [N, heads, d] -> [rows, heads, width, d]; each row's real tokens from column 0, so the causal
        # mask is exactly "earlier tokens of the same row" for every real query
        q_b, k_b, v_b = (t[b.gather].view(b.rows, b.width, t.shape[1], d).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(
            q_b, k_b, v_b, is_causal=True, scale=attn.scaling, enable_gqa=q.shape[1] != k.shape[1]
        )
        outs.append(out.transpose(1, 2).reshape(b.rows * b.width, -1)[b.real])
    return attn.o_proj(torch.cat(outs)[layout.inverse])


def packed_segment_hidden(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, context_length: int) -> Tensor:
    """Last hidden states [B, R, H] at the positions that predict the segment (``segment_hidden``'s contract).

    Rows whose contexts are equal (a GRPO group's prompt) run that context once: its tokens are packed
    for the first such row only, and the other rows' attention reads their keys and values from there.
    """
    base = model.model
    batch, width = input_ids.shape
    device = input_ids.device
    valid = attention_mask.bool()
    # the row that computes each row's context; cells a row takes from another row are not packed for it
    owner = first_of_equal_rows(input_ids[:, :context_length], valid[:, :context_length])
    packed = valid.clone()
    packed[:, :context_length] &= (owner == torch.arange(batch, device=device))[:, None]
    real = packed.reshape(-1).nonzero().squeeze(-1)  # flat grid cells of the N packed tokens
    # packed index of every grid cell (-1: padding); shared context cells point to the owner's tokens
    index = torch.full((batch * width,), -1, dtype=torch.long, device=device)
    index[real] = torch.arange(real.numel(), device=device)
    index = index.view(batch, width)
    index[:, :context_length] = index[owner, :context_length]
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0).reshape(-1)[real]
    hidden = base.embed_tokens(input_ids.reshape(-1)[real])  # [N, H]
    cos, sin = base.rotary_emb(hidden[None], positions[None])
    cos, sin = cos[0, :, None, :], sin[0, :, None, :]  # [N, 1, d]
    # each row's real cells in grid order, moved to columns 0 .. length-1 (a stable sort on the mask)
    order = torch.argsort((~valid).to(torch.uint8), dim=1, stable=True)
    layout = AttentionLayout.of(index.gather(1, order), valid.sum(-1), packed.gather(1, order), ATTENTION_BUCKETS)
    for layer in base.layers[: model.config.num_hidden_layers]:
        hidden = hidden + _attention(layer.self_attn, layer.input_layernorm(hidden), cos, sin, layout)
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    hidden = base.norm(hidden)
    # the cells C-1 .. L-2 that predict the segment
    segment = index[:, context_length - 1 : -1].reshape(-1)
    keep = (segment >= 0).nonzero().squeeze(-1)
    out = hidden.new_zeros(segment.numel(), hidden.shape[-1]).index_copy(0, keep, hidden[segment[keep]])
    return out.view(batch, width - context_length, -1)


__all__ = ["packed_segment_hidden", "supports_packed"]
