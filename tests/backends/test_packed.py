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


# contexts="groups": rows 2 and 4 take row 0's context, row 3 row 1's (GRPO groups sharing a prompt)
SHARED = {2: 0, 4: 0, 3: 1}


def _batch(contexts: str = "distinct"):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 37, (len(PROMPTS), CONTEXT + WIDTH), generator=g)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES)):
        mask[i, CONTEXT - p : CONTEXT + r] = 1
    if contexts == "groups":
        for row, source in SHARED.items():
            ids[row, :CONTEXT], mask[row, :CONTEXT] = ids[source, :CONTEXT], mask[source, :CONTEXT]
    return ids.masked_fill(mask == 0, 0), mask


def _hf(model, ids, mask):
    position_ids = (mask.long().cumsum(-1) - 1).clamp(min=0)
    hidden = model.model(input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=False)
    return hidden.last_hidden_state[:, CONTEXT - 1 : -1]


def _float64_norms(model) -> None:
    """HF's RMSNorm computes in float32 whatever the input dtype, so its backward rounds a gradient
    to float32: a shared context's gradient (summed over rows before the norm) then differs from the
    padded forward's (rounded per row, then summed) by ~1e-7 relative. With the norms in float64 the
    two orders of summation agree to float64 rounding."""
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = lambda x, m=module: (
                m.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + m.variance_epsilon))
            )


@pytest.mark.parametrize("contexts", ["distinct", "groups"])
@pytest.mark.parametrize("buckets", [1, 2, 4, 8])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_packed_forward_equals_the_hf_forward(arch, buckets, contexts, monkeypatch):
    """Any number of attention buckets (rows grouped by length; 8 > rows: one row each) gives the HF values,
    with every row's own context or with rows sharing one (computed once: fewer tokens embedded)."""
    from runners.backends.local import packed

    monkeypatch.setattr(packed, "ATTENTION_BUCKETS", buckets)
    model = build_tiny_model(arch, vocab_size=37, seed=1).double().train()
    assert supports_packed(model)
    if contexts == "groups":
        _float64_norms(model)
    ids, mask = _batch(contexts)
    embedded = []
    model.model.embed_tokens.register_forward_hook(lambda module, args, out: embedded.append(args[0].numel()))
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
    own_contexts = [p for i, p in enumerate(PROMPTS) if contexts == "distinct" or i not in SHARED]
    assert embedded[1] == sum(own_contexts) + sum(RESPONSES)  # [0] is the HF reference's forward


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
    starts = lengths.cumsum(0) - lengths
    col = torch.arange(int(lengths.max()))
    tokens = starts[:, None] + col[None, :]  # each row's tokens contiguous in packed order
    owned = col[None, :] < lengths[:, None]
    layout = AttentionLayout.of(tokens, lengths, owned, 3)
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


def test_a_shared_context_is_read_by_every_row_and_output_once():
    """Two rows share tokens 0-2 (a context), each followed by its own tokens: both rows' grids read the
    shared tokens, only the owner's cells are kept, and every packed token comes back exactly once."""
    from runners.backends.local.packed import AttentionLayout

    tokens = torch.tensor([[0, 1, 2, 3, 4], [0, 1, 2, 5, 0]])  # packed: 0-2 shared, 3-4 row 0, 5 row 1
    lengths = torch.tensor([5, 4])
    owned = torch.tensor([[True] * 5, [False, False, False, True, False]])
    layout = AttentionLayout.of(tokens, lengths, owned, 1)
    (bucket,) = layout.buckets
    # rows by length (row 1 first); its last cell is padding, its first token repeated
    assert bucket.gather.view(2, 5).tolist() == [[0, 1, 2, 5, 0], [0, 1, 2, 3, 4]]
    cells = bucket.gather[bucket.real]
    assert sorted(cells.tolist()) == list(range(6))
    assert torch.equal(cells[layout.inverse], torch.arange(6))


def test_first_of_equal_rows_compares_real_tokens_and_their_places():
    from runners.backends.local.packed import first_of_equal_rows

    ids = torch.tensor([[0, 5, 6], [9, 5, 6], [0, 5, 6], [5, 6, 0], [0, 4, 6]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 0], [0, 1, 1]])
    # row 1 equals row 0 under the mask (the padded id differs); row 2 has one more real token; row 3
    # has the same tokens at other places; row 4 another token
    assert first_of_equal_rows(ids, mask).tolist() == [0, 0, 2, 3, 4]
