"""The unpadded Llama-family forward against the model's own HF forward.

Reference: ``segment_hidden``'s HF path (the model's forward over the padded grid) in float64 on tiny
Llama, Qwen2 (q/k/v biases) and Qwen3 (q/k norms) models, on a batch with prompts of different
lengths (one of a single token), responses of different lengths (one empty, one filling the width):
the hidden states at every position that predicts a response token and the parameter gradients of a
loss on them must agree; positions that predict nothing are zero. Models the path does not cover
(eager attention, dropout) take the HF forward.
"""

from __future__ import annotations

import pytest
import torch

from runners.backends.local import policy
from runners.backends.local.packed import packed_segment_hidden, supports_packed
from runners.models.tiny import build_tiny_model

PROMPTS, RESPONSES, CONTEXT, WIDTH = [7, 3, 5, 1, 6], [9, 1, 4, 0, 6], 7, 9


def _batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 37, (len(PROMPTS), CONTEXT + WIDTH), generator=g)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES)):
        mask[i, CONTEXT - p : CONTEXT + r] = 1
    return ids.masked_fill(mask == 0, 0), mask


def _hf(model, ids, mask):
    position_ids = (mask.long().cumsum(-1) - 1).clamp(min=0)
    hidden = model.model(input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=False)
    return hidden.last_hidden_state[:, CONTEXT - 1 : -1]


@pytest.mark.parametrize("buckets", [1, 2, 4, 8])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_packed_forward_equals_the_hf_forward(arch, buckets, monkeypatch):
    """Any number of attention buckets (rows grouped by length; 8 > rows: one row each) gives the HF values."""
    from runners.backends.local import packed

    monkeypatch.setattr(packed, "ATTENTION_BUCKETS", buckets)
    model = build_tiny_model(arch, vocab_size=37, seed=1).double().train()
    assert supports_packed(model)
    ids, mask = _batch()
    predicting = torch.zeros(len(PROMPTS), WIDTH, dtype=torch.bool)  # positions C-1 .. C+R-2 that are real
    for i, r in enumerate(RESPONSES):
        predicting[i, : r + 1 if r < WIDTH else WIDTH] = True
    reference, packed = _hf(model, ids, mask), packed_segment_hidden(model, ids, mask, CONTEXT)
    assert packed.shape == reference.shape
    torch.testing.assert_close(packed[predicting], reference[predicting], rtol=1e-12, atol=1e-12)
    assert torch.equal(packed[~predicting], torch.zeros_like(packed[~predicting]))
    weights = torch.randn(reference.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    responses = mask[:, CONTEXT:].bool()  # the positions a loss reads
    params = list(model.parameters())
    expected = torch.autograd.grad((reference * weights)[responses].sum(), params)
    got = torch.autograd.grad((packed * weights)[responses].sum(), params)
    for name, a, b in zip([n for n, _ in model.named_parameters()], got, expected):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)
    assert policy.segment_hidden(model, ids, mask, CONTEXT).equal(packed)  # the trainer's passes take it


@pytest.mark.parametrize("change", ["eager", "dropout"])
def test_other_models_take_the_hf_forward(change):
    model = build_tiny_model("llama", vocab_size=37, seed=1).double()
    if change == "eager":
        model.config._attn_implementation = "eager"
    else:
        model.config.attention_dropout = 0.1
    assert not supports_packed(model)
    ids, mask = _batch()
    model.eval()
    got, expected = policy.segment_hidden(model, ids, mask, CONTEXT), _hf(model, ids, mask)
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)  # eager: NaN on padding rows


def test_attention_buckets_cover_every_token_once_and_are_as_wide_as_their_longest_row():
    """Rows sorted by length into 3 buckets: each bucket's width is its longest row, every packed token
    sits in exactly one real cell, padding cells repeat their row's first token, and ``inverse`` puts
    the buckets' outputs back in packed order."""
    from runners.backends.local.packed import AttentionLayout

    lengths = torch.tensor([5, 1, 9, 3, 7, 2, 8])
    layout = AttentionLayout.of(lengths, 3)
    assert [(b.rows, b.width) for b in layout.buckets] == [(3, 3), (2, 7), (2, 9)]  # lengths 1,2,3 | 5,7 | 8,9
    cells = torch.cat([b.gather[b.real] for b in layout.buckets])
    assert sorted(cells.tolist()) == list(range(int(lengths.sum())))
    assert torch.equal(cells[layout.inverse], torch.arange(int(lengths.sum())))
    for b in layout.buckets:  # a padding cell repeats its row's first token (column 0 is always real)
        grid = b.gather.view(b.rows, b.width)
        padding = torch.ones(b.rows * b.width, dtype=torch.bool)
        padding[b.real] = False
        padding = padding.view(b.rows, b.width)
        assert int(padding.sum()) == b.rows * b.width - b.real.numel() and not padding[:, 0].any()
        assert torch.equal(grid[padding], grid[:, :1].expand_as(grid)[padding])
