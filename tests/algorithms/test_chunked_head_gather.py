"""``chunked_head(..., gather=ids)``: log-probs at given vocabulary ids per position (the update's
inputs for TROLL's kept set and TRM's exact-KL support), against a dense float64 reference written
here: ``log_softmax((h W^T + b) / T)`` gathered at the ids, and torch autograd of a weighted sum of the
gathered log-probs, the sampled token's log-prob and the entropy, for values and gradients in h, W, b.

Where the option acts: V = 151,936 on peaked rows with the five dominant tokens among the ids,
repeated ids in a row (their gradients add up), ``-inf`` bias entries among the ids, chunks that do
not divide N; finite differences in float64; the errors for a wrong shape or an id out of range.
"""

from __future__ import annotations

import math

import pytest
import torch

from runners.algorithms.chunked_head import chunked_head
from tests.algorithms.test_chunked_head import QWEN_V, _close, _gen, _problem


def _ids(n: int, k: int, vocab: int, seed: int) -> torch.Tensor:
    """[n,k] ids: the five peaked tokens first, random ids after, one repeated id per row."""
    ids = torch.randint(0, vocab, (n, k), generator=_gen(seed))
    ids[:, :5] = torch.arange(5)
    ids[:, -1] = ids[:, -2]
    return ids


def _reference(hidden, weight, bias, tokens, ids, w_pick, w_logp, w_ent, temperature):
    """float64: gathered log-probs [n,k] and the gradients of sum(w_pick * picked + w_logp logp + w_ent H)."""
    h = hidden.detach().double().requires_grad_(True)
    w = weight.detach().double().requires_grad_(True)
    b = bias.detach().double().requires_grad_(True) if bias is not None else None
    z = h @ w.T if b is None else h @ w.T + b
    logp_all = torch.log_softmax(z / temperature, dim=-1)
    picked = logp_all.gather(-1, ids)
    finite = logp_all > -math.inf
    safe = torch.where(finite, logp_all, 0.0)
    entropy = -(torch.where(finite, safe.exp(), 0.0) * safe).sum(-1)
    logp = logp_all.gather(-1, tokens[:, None]).squeeze(-1)
    finite_pick = torch.where(picked > -math.inf, picked, 0.0)
    loss = (finite_pick * w_pick.double()).sum() + (logp * w_logp.double()).sum() + (entropy * w_ent.double()).sum()
    loss.backward()
    return picked.detach(), [h.grad, w.grad, b.grad if b is not None else None]


def _ours(hidden, weight, bias, tokens, ids, w_pick, w_logp, w_ent, **kwargs):
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    b = bias.clone().requires_grad_(True) if bias is not None else None
    out = chunked_head(h, w, tokens, bias=b, gather=ids, **kwargs)
    finite_pick = torch.where(out.gather_logp > -math.inf, out.gather_logp, 0.0)
    loss = (finite_pick * w_pick).sum() + (out.logp * w_logp).sum() + (out.entropy * w_ent).sum()
    loss.backward()
    return out.gather_logp.detach(), [h.grad, w.grad, b.grad if b is not None else None]


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("outputs", ["gather", "gather+logp", "all"])
def test_gathered_logprobs_and_gradients_match_float64(with_bias, outputs):
    """N = 13 rows in chunks of 4, V = 300, 9 ids per row, temperature 0.7: values within 1e-5,
    gradients within 1e-5 of the largest, whichever outputs the loss reads besides the gathered ones."""
    hidden, weight, bias, tokens, w_logp, w_ent = _problem(13, 8, 300, seed=21)
    bias = bias if with_bias else None
    ids = _ids(13, 9, 300, seed=22)
    w_pick = torch.randn(13, 9, generator=_gen(23))
    w_logp = w_logp if outputs != "gather" else torch.zeros_like(w_logp)
    w_ent = w_ent if outputs == "all" else torch.zeros_like(w_ent)
    ref, ref_grads = _reference(hidden, weight, bias, tokens, ids, w_pick, w_logp, w_ent, 0.7)
    ours, grads = _ours(hidden, weight, bias, tokens, ids, w_pick, w_logp, w_ent, temperature=0.7, chunk_size=4)
    assert ours.shape == (13, 9) and ours.dtype == torch.float64
    torch.testing.assert_close(ours.double(), ref, rtol=0, atol=1e-5)
    for mine, exact in zip(grads, ref_grads):
        if exact is not None:
            _close(mine, exact, 1e-5)


def test_qwen_vocabulary_on_peaked_rows_within_1e5_of_float64():
    """V = 151,936, 16 peaked rows (the top token holds all but ~0.5%), 65 ids per row including the
    five dominant tokens: log-probs within 1e-5 of float64, gradients within 1e-5 of the largest."""
    hidden, weight, _, tokens, w_logp, w_ent = _problem(16, 16, QWEN_V, seed=8, peaked=1.6)
    ids = _ids(16, 65, QWEN_V, seed=9)
    w_pick = torch.randn(16, 65, generator=_gen(10))
    ref, ref_grads = _reference(hidden, weight, None, tokens, ids, w_pick, w_logp, w_ent, 1.0)
    ours, grads = _ours(hidden, weight, None, tokens, ids, w_pick, w_logp, w_ent, chunk_size=5)
    assert float(ref[:, 0].max()) > -0.01 and float(ref[:, 6:].min()) < -20  # dominant and tail ids both present
    torch.testing.assert_close(ours.double(), ref, rtol=0, atol=1e-5)
    for mine, exact in zip(grads[:2], ref_grads[:2]):
        _close(mine, exact, 1e-5)


def test_exact_sum_gives_the_rest_bin_to_float64_accuracy():
    """``exact_sum=True`` (the update's inputs where an exact-KL TRM mask reads the rest bin ``1 - sum q``):
    at V = 151,936 on peaked rows with the 8 largest tokens gathered, the rest bin (3.6e-5 to 5e-2 here)
    is within 5e-8 of the float64 log-softmax of the same float32 logits; the float32 row sums leave
    ~5e-7 (measured 4.5e-7 against 1.0e-8), within the documented ~1e-7 relative error of log s."""
    hidden, weight, _, tokens, _, _ = _problem(16, 16, QWEN_V, seed=8, peaked=1.6)
    ref_all = torch.log_softmax((hidden @ weight.T).double(), -1)
    ids = torch.topk(ref_all, 8, dim=-1).indices
    ref_rest = 1.0 - ref_all.gather(-1, ids).exp().sum(-1)
    errors = {}
    for exact in (False, True):
        out = chunked_head(hidden, weight, tokens, gather=ids, exact_sum=exact, chunk_size=5)
        errors[exact] = float((1.0 - out.gather_logp.exp().sum(-1) - ref_rest).abs().max())
    assert float(ref_rest.min()) > 1e-5  # a rest bin that float32 sums can get wrong by a few percent
    assert errors[True] < 5e-8 and errors[False] < 2e-6, errors


def test_minus_inf_bias_entries_among_the_ids():
    """A masked vocabulary entry among the ids: its log-prob is -inf, values and gradients finite elsewhere."""
    hidden, weight, bias, tokens, w_logp, w_ent = _problem(6, 4, 50, seed=31)
    bias[7] = -math.inf
    tokens[tokens == 7] = 8
    ids = _ids(6, 8, 50, seed=32)
    ids[:, 5] = 7
    w_pick = torch.randn(6, 8, generator=_gen(33))
    ref, ref_grads = _reference(hidden, weight, bias, tokens, ids, w_pick, w_logp, w_ent, 1.0)
    ours, grads = _ours(hidden, weight, bias, tokens, ids, w_pick, w_logp, w_ent, chunk_size=4)
    assert torch.isneginf(ours[:, 5]).all()
    torch.testing.assert_close(ours.double(), ref, rtol=0, atol=1e-5)
    for mine, exact in zip(grads, ref_grads):
        assert torch.isfinite(mine).all()
        _close(mine, exact, 1e-5)


def test_gradcheck_float64():
    """Finite differences of all three outputs w.r.t. h, W and b (temperature 0.6, chunks of 2)."""
    hidden, weight, bias, tokens, _, _ = _problem(5, 3, 7, seed=12)
    ids = _ids(5, 6, 7, seed=13)
    inputs = tuple(t.double().requires_grad_(True) for t in (hidden, weight, bias))

    def fn(h, w, b):
        out = chunked_head(h, w, tokens, bias=b, temperature=0.6, chunk_size=2, gather=ids)
        return out.logp, out.entropy, out.gather_logp

    assert torch.autograd.gradcheck(fn, inputs)


def test_leading_shape_is_kept_and_without_gather_nothing_is_returned():
    hidden, weight, _, tokens, _, _ = _problem(6, 4, 30, seed=41)
    ids = _ids(6, 7, 30, seed=42)
    out = chunked_head(hidden.reshape(2, 3, 4), weight, tokens.reshape(2, 3), gather=ids.reshape(2, 3, 7))
    flat = chunked_head(hidden, weight, tokens, gather=ids)
    assert out.gather_logp.shape == (2, 3, 7)
    torch.testing.assert_close(out.gather_logp.reshape(6, 7), flat.gather_logp, rtol=0, atol=0)
    assert chunked_head(hidden, weight, tokens).gather_logp is None


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        (torch.zeros(3, 2, dtype=torch.long), r"gather \(3, 2\) must be \[\.\.\., G\]"),
        (torch.full((2, 2), 20), r"token and gather ids must be in \[0, 20\)"),
        (torch.full((2,), 1), r"gather \(2,\) must be"),
    ],
)
def test_gather_errors_name_the_argument(ids, message):
    hidden, weight, _, tokens, _, _ = _problem(2, 4, 20, seed=13)
    with pytest.raises(ValueError, match=message):
        chunked_head(hidden, weight, tokens, gather=ids)
