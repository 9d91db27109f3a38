"""Forward passes of the built-in trainer: segment logits, log-probs, entropy, values.

The segment of a ``RolloutBatch`` starts at column ``C`` (the context length) of ``input_ids``; the
logits that predict it sit at columns ``C-1 .. C+R-2``. Only those columns go through the LM head
(``logits_to_keep``-style slicing of the last hidden state), which keeps memory proportional to
the segment, not the context. Llama-family models skip the padding altogether (``packed``).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn


def segment_hidden(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, context_length: int) -> Tensor:
    """Last hidden states [B, R, H] at the positions that predict the segment tokens.

    Llama-family models run on the real tokens only (``packed``); others through their HF forward.
    """
    from runners.backends.local.packed import packed_segment_hidden, supports_packed

    if supports_packed(model):
        return packed_segment_hidden(model, input_ids, attention_mask, context_length)
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    base = model.base_model if hasattr(model, "base_model") else model
    out = base(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    return hidden[:, context_length - 1 : -1]


def segment_logits(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor, context_length: int, temperature: float = 1.0
) -> Tensor:
    """Logits [B, R, V] (float32) predicting the segment tokens, divided by the sampling temperature."""
    hidden = segment_hidden(model, input_ids, attention_mask, context_length)
    logits = model.get_output_embeddings()(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    return logits


@dataclass
class Head:
    """A forward's last hidden states [rows,T,H] and the output layer that maps them to logits: the old
    pass then goes through ``chunked_head`` and never holds the [rows,T,V] logits (large vocabularies)."""

    hidden: Tensor
    weight: Tensor  # [V,H]
    bias: Tensor | None
    temperature: float


def segment_head(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor, context_length: int, temperature: float = 1.0
) -> Head:
    """``segment_logits`` before the output layer: the hidden states and the layer (``chunked_head``'s inputs)."""
    out = model.get_output_embeddings()
    return Head(segment_hidden(model, input_ids, attention_mask, context_length), out.weight, out.bias, temperature)


def chunkable(model: nn.Module) -> bool:
    """Whether ``model``'s forwards can go through ``chunked_head``: from ``chunked_head.MIN_VOCAB`` tokens
    on, with a linear output layer (every forward of the trainer then does: old, reference, update,
    post-update)."""
    from runners.algorithms.chunked_head import MIN_VOCAB

    out = model.get_output_embeddings()
    return isinstance(out, nn.Linear) and out.weight.shape[0] >= MIN_VOCAB


def chunked_old_pass(model: nn.Module, sampler: nn.Module) -> tuple[bool, bool]:
    """Whether the old pass of pi_old (``model``), and the sampling copy's store (``sampler``), go through
    ``chunked_head`` (``chunkable``); a sampling copy in another dtype (bfloat16) keeps its own rounded
    logits, which are what it sampled from."""
    own = chunkable(model)
    same_dtype = sampler.get_output_embeddings().weight.dtype == model.get_output_embeddings().weight.dtype
    return own, own and same_dtype


def chunked_passes(model: nn.Module, method) -> tuple[bool, bool]:
    """Whether (the old, reference and post-update passes, the update) go through ``chunked_head``: the
    passes where ``chunkable``; the update too where the loss reads the logits at the old top-K ids only
    (TROLL's sparse form, the exact-KL TRM masks) or not at all."""
    passes = chunkable(model)
    return passes, passes and (not method.requires("logits") or method.requires("sparse_old"))


class ValueModel(nn.Module):
    """Critic: the policy's backbone (a copy) with a scalar head, V(s_t) per segment position."""

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        import copy

        self.backbone = copy.deepcopy(policy.base_model)
        hidden = policy.config.hidden_size
        self.head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, context_length: int) -> Tensor:
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        out = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        )
        # V(s_t) for the state before each segment token: use the hidden state that predicts it
        hidden = out.last_hidden_state[:, context_length - 1 : -1]
        return self.head(hidden).squeeze(-1).float()
