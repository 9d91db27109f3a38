"""Incremental decoders for the sampler: a generic one (any HF causal LM) and a lean one (Llama family).

Design: the sampler (``runners.models.sampler``) needs three operations: ``prefill`` the
prompts, ``step`` one token per row, ``select`` the rows still generating. ``HFDecoder`` does them
through the model's own forward and a ``DynamicCache``; it works for every architecture.

``LlamaFamilyDecoder`` is the fast path for ``llama``, ``qwen2`` and ``qwen3`` models with SDPA
attention and only full-attention layers (Llama 3.x, SmolLM2, Qwen2.5, Qwen3, the embedded default
and the tiny test models). Profiling the embedded default showed ~65% of a decode step in Python
module overhead of the HF forward (module calls, output dataclasses, mask and cache bookkeeping),
not in arithmetic. The lean step calls the same parameters with ``torch.nn.functional`` directly,
writes keys and values into a preallocated ``[B, H_kv, P + R, D]`` cache (no concatenation per
step) and runs SDPA with grouped-query heads. The prompt is still processed by the model's own
forward (its keys and values are copied into the static cache), so only decode steps take the lean
path. Rotary embeddings come from the model's own ``rotary_emb`` module (every RoPE scaling type).
tests/models/test_sampler.py checks it against ``model.generate`` token for token.

Decode attention on CPU (``attention="bmm"``): one new query per row against at most a few hundred
keys is too small for SDPA's CPU flash kernel, whose per-call set-up dominates (~230 us for 64 rows x
4 heads x 80 keys on one thread). There the query heads sharing a key/value head form a [g, D] block,
scores are one ``baddbmm`` against a key cache stored transposed (``[B, H_kv, D, S]``, so each
block's keys are a plain strided matrix) with the padding mask as its additive input (kept from
the prefill in that layout), then a softmax and one ``bmm`` with the values: 0.6x the time of SDPA
on the same shapes. Elsewhere (CUDA) SDPA
runs on a ``[B, H_kv, S, D]`` cache (``attention="sdpa"``).

    decoder = make_decoder(model, batch=32, max_length=96)
    logits = decoder.prefill(input_ids, attention_mask, position_ids)   # [B,V]
    logits = decoder.step(tokens, positions, mask, length)              # [B,V]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from runners.algorithms.chunked_head import output_logits
from runners.algorithms.workspace import Workspace

FAST_MODEL_TYPES = ("llama", "qwen2", "qwen3")


class HFDecoder:
    """Prefill and decode through ``model(...)`` with a ``DynamicCache`` (any causal LM)."""

    def __init__(self, model) -> None:
        from transformers import DynamicCache

        self.model = model
        self.cache = DynamicCache(config=model.config)

    def prefill(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor) -> Tensor:
        """input_ids, attention_mask, position_ids [B,P] -> next-token logits [B,V] float32."""
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :].float()

    def step(self, tokens: Tensor, positions: Tensor, mask: Tensor | None, length: int) -> Tensor:
        """tokens [B], positions [B,1], mask None | [B,length] | [B,1,1,length] -> logits [B,V] float32."""
        out = self.model(
            input_ids=tokens[:, None],
            attention_mask=mask,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
        )
        return out.logits[:, -1, :].float()

    def select(self, rows: Tensor) -> None:
        """Keep only batch rows ``rows`` [B'] long of the cache."""
        self.cache.batch_select_indices(rows)


def supports_fast_decode(model) -> bool:
    """True for llama/qwen2/qwen3 models with SDPA attention and full attention in every layer."""
    config = model.config
    if config.model_type not in FAST_MODEL_TYPES or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    layer_types = getattr(config, "layer_types", None) or []
    if any(kind != "full_attention" for kind in layer_types):
        return False
    base = getattr(model, "model", None)
    return base is not None and hasattr(base, "rotary_emb") and hasattr(model, "lm_head")


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm as the HF Llama/Qwen modules compute it (float32 statistics, then the input dtype)."""
    if x.dtype == torch.float32:  # fused op, same arithmetic; a [heads, D] weight is applied after
        if weight.dim() == 1:
            return torch.rms_norm(x, (x.shape[-1],), weight, eps)  # the op itself, not F's Python wrapper
        return weight * torch.rms_norm(x, (x.shape[-1],), None, eps)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rotate(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    """RoPE of x [B,H,D] with cos [B,1,D] and ``signed_sin`` [B,1,D] = (-sin[:D/2], sin[D/2:]): HF's
    ``x * cos + rotate_half(x) * sin`` with the same products, since rotate_half(x) = (-x2, x1) is the
    halves swapped (a roll by D/2) with the first negated, and (-a) * b = a * (-b) exactly."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


# fuse q|k|v and gate|up weights only while the copies stay small (SmolLM2: 70M elements)
FUSE_MAX_ELEMENTS = 200_000_000


def _projection(linears, fuse: bool):
    """Several linear layers reading the same input: one fused (weight, bias) or a list of pairs."""
    if not fuse:
        return [(lin.weight, lin.bias) for lin in linears]
    weight = torch.cat([lin.weight for lin in linears], dim=0)
    biases = [lin.bias for lin in linears]
    if all(b is None for b in biases):
        return weight, None
    bias = torch.cat([b if b is not None else weight.new_zeros(lin.out_features) for b, lin in zip(biases, linears)])
    return weight, bias


def _project(x: Tensor, projection) -> Tensor:
    """x [...,H] through a ``_projection`` -> [..., sum of output sizes]."""
    if isinstance(projection, list):
        return torch.cat([F.linear(x, w, b) for w, b in projection], dim=-1)
    return F.linear(x, *projection)


class LlamaFamilyDecoder:
    """Static KV cache and a lean single-token forward for llama / qwen2 / qwen3 (see module doc).

    Per layer and step: one fused q|k|v matmul, q/k norms (qwen3) and RoPE applied to q and k
    together, the new key/value written into the static cache, grouped-query attention over the
    filled slots, one fused gate|up matmul. Fused weights are built once per decoder (a copy of the
    attention and MLP input projections, so only below ``FUSE_MAX_ELEMENTS``; larger models run the
    separate matmuls). ``attention``: "bmm" (batched matmuls over a transposed key cache; the default
    on CPU) or "sdpa" (the default elsewhere); see the module doc.
    """

    def __init__(self, model, *, batch: int, max_length: int, attention: str | None = None) -> None:
        self.model = model
        base = model.model
        config = model.config
        self.embed = base.embed_tokens
        self.final_norm = base.norm
        self.lm_head = model.lm_head
        layers = list(base.layers[: config.num_hidden_layers])
        first = layers[0].self_attn
        self.head_dim = first.head_dim
        self.n_heads = config.num_attention_heads
        self.n_kv = config.num_key_value_heads
        self.scaling = first.scaling
        self.max_length = max_length
        weight = self.embed.weight
        fused_elements = sum(
            sum(lin.weight.numel() for lin in (a.q_proj, a.k_proj, a.v_proj, m.gate_proj, m.up_proj))
            for a, m in ((layer.self_attn, layer.mlp) for layer in layers)
        )
        fuse = fused_elements <= FUSE_MAX_ELEMENTS
        self.layers = []
        for layer in layers:
            attn, mlp = layer.self_attn, layer.mlp
            qk_norm = None
            if hasattr(attn, "q_norm"):  # qwen3: per-head RMSNorm of q and k, one weight row per head
                qk_norm = torch.cat(
                    [attn.q_norm.weight.expand(self.n_heads, -1), attn.k_norm.weight.expand(self.n_kv, -1)]
                )
            self.layers.append(
                {
                    "norm1": (layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon),
                    "qkv": _projection((attn.q_proj, attn.k_proj, attn.v_proj), fuse),
                    "qk_norm": (qk_norm, attn.q_norm.variance_epsilon) if qk_norm is not None else None,
                    "o": (attn.o_proj.weight, attn.o_proj.bias),
                    "norm2": (layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon),
                    "gate_up": _projection((mlp.gate_proj, mlp.up_proj), fuse),
                    "down": (mlp.down_proj.weight, mlp.down_proj.bias),
                    "act": mlp.act_fn,
                }
            )
        # RoPE tables for every position a row can reach (positions never exceed the padded width)
        positions = torch.arange(max_length, device=weight.device)[None]
        cos, sin = base.rotary_emb(weight[None, :1], positions)  # [1, max_length, D]
        half = self.head_dim // 2
        self.cos, self.signed_sin = cos[0], torch.cat((-sin[0, :, :half], sin[0, :, half:]), dim=-1)
        # SiLU models call F.silu directly, not the HF activation module
        self.silu = getattr(config, "hidden_act", None) in ("silu", "swish")
        if attention is None:
            attention = "bmm" if weight.device.type == "cpu" else "sdpa"
        if attention not in ("bmm", "sdpa"):
            raise ValueError(f"attention must be 'bmm' or 'sdpa', got {attention!r}")
        self.attention = attention
        self.workspace = Workspace()  # what ``step`` returns is overwritten by the next step
        shape = (batch, self.n_kv, max_length, self.head_dim)
        key_shape = (batch, self.n_kv, self.head_dim, max_length) if attention == "bmm" else shape
        self.keys = [torch.zeros(key_shape, dtype=weight.dtype, device=weight.device) for _ in layers]
        self.values = [torch.zeros(shape, dtype=weight.dtype, device=weight.device) for _ in layers]
        # bmm: the additive attention mask of every slot, already in baddbmm's [B, H_kv, g, S] layout;
        # -inf on prompt padding, 0 elsewhere (a generated slot is attended by every later step)
        group = self.n_heads // self.n_kv
        self.bias = (
            torch.zeros((batch, self.n_kv, group, max_length), dtype=weight.dtype, device=weight.device)
            if attention == "bmm"
            else None
        )

    def prefill(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor) -> Tensor:
        """The model's own forward over the prompt; its keys/values seed the static cache."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        rows, prompt_len = input_ids.shape  # rows <= the cache's batch: ``select`` then spreads them
        if self.bias is not None:
            padding = ~attention_mask.bool()[:, None, None, :]
            self.bias[:rows, :, :, :prompt_len] = torch.zeros_like(padding, dtype=self.bias.dtype).masked_fill_(
                padding, float("-inf")
            )
        for i, layer in enumerate(cache.layers[: len(self.layers)]):
            if self.attention == "bmm":
                self.keys[i][:rows, :, :, :prompt_len] = layer.keys.transpose(-1, -2)
            else:
                self.keys[i][:rows, :, :prompt_len] = layer.keys
            self.values[i][:rows, :, :prompt_len] = layer.values
        return out.logits[:, -1, :].float()

    def step(self, tokens: Tensor, positions: Tensor, mask: Tensor | None, length: int) -> Tensor:
        """One token per row at cache slot ``length - 1``.

        tokens [B], positions [B,1] (RoPE positions), mask None or bool [B,1,1,length] -> [B,V] float32
        (in the decoder's workspace: the next step overwrites it).
        The mask must be the prefill's attention mask followed by ones (what the sampler passes); the
        bmm attention reads that from its own copy (``bias``), SDPA from ``mask``.
        Activations are [B, features] (no sequence axis), and each layer makes as few tensor calls as
        its arithmetic allows: at the embedded model's size their Python and dispatch overhead, not
        the arithmetic, is most of a step.
        """
        if mask is not None and mask.dim() != 4:
            raise ValueError("LlamaFamilyDecoder.step needs a [B,1,1,S] boolean mask or None")
        slot = length - 1
        batch, d = tokens.shape[0], self.head_dim
        n_q, n_qk = self.n_heads, self.n_heads + self.n_kv
        bmm = self.attention == "bmm"
        hidden = self.embed(tokens)  # [B,H]
        cos, signed_sin = self.cos[positions], self.signed_sin[positions]  # [B,1,D]
        bias = self.bias[..., :length].view(-1, n_q // self.n_kv, length) if bmm else None
        for i, layer in enumerate(self.layers):
            x = _rms_norm(hidden, *layer["norm1"])
            qkv = _project(x, layer["qkv"]).view(batch, n_qk + self.n_kv, d)
            qk = qkv[:, :n_qk]
            if layer["qk_norm"] is not None:
                qk = _rms_norm(qk, *layer["qk_norm"])
            qk = _rotate(qk, cos, signed_sin)
            self.values[i].select(2, slot).copy_(qkv[:, n_qk:])
            self.keys[i].select(3 if bmm else 2, slot).copy_(qk[:, n_q:])
            if bmm:
                out = self._bmm_attention(qk[:, :n_q], i, length, bias)  # [B, n_q * D]
            else:
                out = F.scaled_dot_product_attention(
                    qk[:, :n_q, None],
                    self.keys[i][:, :, :length],
                    self.values[i][:, :, :length],
                    attn_mask=mask,
                    scale=self.scaling,
                    enable_gqa=self.n_kv != self.n_heads,
                ).view(batch, -1)
            hidden = hidden + F.linear(out, *layer["o"])
            x = _rms_norm(hidden, *layer["norm2"])
            gate, up = _project(x, layer["gate_up"]).chunk(2, dim=-1)
            gate = F.silu(gate) if self.silu else layer["act"](gate)
            hidden = hidden + F.linear(gate * up, *layer["down"])
        hidden = _rms_norm(hidden, self.final_norm.weight, self.final_norm.variance_epsilon)
        # [B,V] float32 logits into the same buffer each step (39 MB at B = 64, V = 151,936)
        return output_logits(hidden, self.lm_head.weight, self.lm_head.bias, workspace=self.workspace).float()

    def _bmm_attention(self, q: Tensor, layer: int, length: int, bias: Tensor) -> Tensor:
        """q [B, n_q, D] (RoPE applied) against the first ``length`` cache slots -> [B, n_q * D]."""
        batch, group, d = q.shape[0], self.n_heads // self.n_kv, self.head_dim
        # query heads h = kv * group + j share key/value head kv: [B * H_kv, g, D]
        q = q.reshape(batch * self.n_kv, group, d)
        keys = self.keys[layer][..., :length].view(batch * self.n_kv, d, length)
        values = self.values[layer][:, :, :length].view(batch * self.n_kv, length, d)
        scores = torch.baddbmm(bias, q, keys, alpha=self.scaling)
        return torch.bmm(scores.softmax(dim=-1), values).view(batch, -1)

    def select(self, rows: Tensor) -> None:
        """Keep only batch rows ``rows`` [B'] long of the cache."""
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        if self.bias is not None:
            self.bias = self.bias.index_select(0, rows)


def make_decoder(model, *, batch: int, max_length: int, fast: bool = True, attention: str | None = None):
    """``LlamaFamilyDecoder`` (decode ``attention``: None picks by device) when ``fast`` and the model is
    supported, else ``HFDecoder``."""
    if fast and supports_fast_decode(model):
        return LlamaFamilyDecoder(model, batch=batch, max_length=max_length, attention=attention)
    return HFDecoder(model)
