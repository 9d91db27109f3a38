"""Reused work buffers: ``Workspace``, ``logsumexp_rows`` and the sampler's decode temporaries.

A buffer reused must give the values a fresh tensor gives, bit for bit: ``logsumexp_rows`` against
``torch.logsumexp`` and ``sample_next`` with a workspace against ``sample_next`` without one, at
Qwen's vocabulary (151,936, where a [64, V] float32 block is 39 MB: glibc maps it anew, and its
pages fault, at every allocation), with ``-inf`` entries, an all ``-inf`` row and strided input.
"""

from __future__ import annotations

import math

import pytest
import torch

from runners.algorithms.numerics import logsumexp_rows, token_logprobs
from runners.algorithms.workspace import Workspace
from runners.models.sampler import draw, filter_top_p, sample_next


def test_a_request_that_fits_reuses_the_buffer_and_one_that_does_not_allocates():
    ws, like = Workspace(), torch.zeros(1)
    first = ws.get("a", (8, 5), like)
    assert first.shape == (8, 5) and first.is_contiguous()
    fewer = ws.get("a", (3, 5), like)  # rows dropped: a leading slice of the same memory
    assert fewer.shape == (3, 5) and fewer.is_contiguous() and fewer.data_ptr() == first.data_ptr()
    assert ws.get("b", (8, 5), like).data_ptr() != first.data_ptr()  # another name, another buffer
    more = ws.get("a", (9, 5), like)
    assert more.shape == (9, 5) and more.data_ptr() != first.data_ptr()
    assert ws.get("a", (9, 6), like).shape == (9, 6)
    ws.get("c", (2, 10), like)
    assert ws.get("c", (4, 10), like).shape == (4, 10)  # more rows than the buffer holds
    assert ws.get("a", (9, 6), like.double()).dtype == torch.float64


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit, NaN where the other is NaN (an all ``-inf`` row's log-prob)."""
    return a.dtype == b.dtype and a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


def _rows(vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(16, vocab, generator=g) * 3
    x[:, :5] += torch.tensor([12.0, 10.0, 9.0, 8.0, 7.0])  # peaked rows
    x[2, 7] = -math.inf
    x[5] = -math.inf  # a row with no finite entry
    return x


@pytest.mark.parametrize("vocab", [28, 151936])
def test_logsumexp_rows_is_torchs_bit_for_bit(vocab):
    x = _rows(vocab, seed=vocab)
    ws = Workspace()
    for rows in (x, x[3:11], x[:, : vocab // 2]):  # fewer rows reuse the buffer; a strided input
        want = torch.logsumexp(rows, dim=-1)
        assert _same(logsumexp_rows(rows, ws), want) and _same(logsumexp_rows(rows), want)
    assert want[5] == -math.inf
    tokens = torch.zeros(16, dtype=torch.long)
    assert _same(token_logprobs(x, tokens, workspace=ws), token_logprobs(x, tokens))


def test_logsumexp_rows_keeps_its_gradient_path():
    x = _rows(100, seed=1)[:4].clone().requires_grad_()
    logsumexp_rows(x, Workspace()).sum().backward()
    torch.testing.assert_close(x.grad, torch.softmax(x.detach(), -1))


@pytest.mark.parametrize("temperature,top_p", [(0.0, 1.0), (1.0, 1.0), (0.7, 1.0), (0.7, 0.9)])
def test_sample_next_with_a_workspace_draws_the_same_tokens_and_log_probs(temperature, top_p):
    """Three decode steps, the batch shrinking as rows finish: the workspace's buffers, reused, give
    the tokens and log-probs that torch's own softmax and logsumexp on fresh tensors give from the
    same generator state, bit for bit."""
    ws = Workspace()
    for step, rows in enumerate((64, 64, 40)):
        logits = torch.randn(rows, 151936, generator=torch.Generator().manual_seed(step)) * 2
        logits[:, :5] += torch.tensor([12.0, 10.0, 9.0, 8.0, 7.0])
        kwargs = {"temperature": temperature, "top_p": top_p}
        got = sample_next(logits, generator=torch.Generator().manual_seed(10 + step), workspace=ws, **kwargs)
        if temperature == 0.0:
            token, scores = logits.argmax(-1), logits
        else:
            scores = logits / temperature if temperature != 1.0 else logits
            scores = filter_top_p(scores, top_p) if top_p < 1.0 else scores
            token = draw(scores.softmax(dim=-1), torch.Generator().manual_seed(10 + step))
        logp = scores.gather(-1, token[:, None]).squeeze(-1) - torch.logsumexp(scores, dim=-1)
        assert torch.equal(got[0], token) and torch.equal(got[1], logp), step
        assert torch.equal(sample_next(logits, generator=torch.Generator().manual_seed(10 + step), **kwargs)[1], logp)


def test_logsumexp_rows_writes_into_one_reused_buffer(monkeypatch):
    """Call after call, the shifted exponentials go into the same memory (fewer rows: its leading rows);
    each ``out=`` storage is kept alive, so a freed tensor's address cannot come back and look reused."""
    outs = []
    real = torch.sub

    def sub(*args, **kwargs):
        if isinstance(kwargs.get("out"), torch.Tensor):
            outs.append(kwargs["out"].untyped_storage())
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "sub", sub)
    ws, x = Workspace(), _rows(3000, seed=3)
    for rows in (x, x[:9], x):
        logsumexp_rows(rows, ws)
    monkeypatch.undo()
    assert len(outs) == 3 and len({s.data_ptr() for s in outs}) == 1
