"""``chunked_head`` (runners/algorithms/chunked_head.py) against the dense float64 reference of test_chunked_head,
aimed at the branches the mutation testing (``make mutation``) found unchecked:

- float64 inputs give float64 values and gradients equal to the dense float64 reference to 1e-10
  (logits of size ~50, where any float32 intermediate shows), with a bias and temperatures 0.5 and 1;
- bf16 hidden states, weight and bias: upcast before the matmul, gradients back in bf16;
- the defaults (temperature 1, ``default_chunk_size``) and the documented memory bound: no
  temporary of more than chunk_size x V values (nor the weight's V x H), forward and backward;
- the sparse store (TROLL, arXiv 2510.03817, section 3.2, eq. 21) against the loop reference of
  ``test_troll_sparse_mutants.ref_store`` on the dense float64 logits, with a masked vocabulary
  (fewer finite tokens than K: unused slots index 0 and -inf; a masked sampled token at p_d),
  non-differentiable, for a [B,T,H] input;
- every input error names its argument with the offending values;
- the row sum s = sum exp(z - m): float32 by default and with ``exact_sum=False``, float64 with
  ``exact_sum=True`` (gathered log-probs against the test's own float32 logits, to 1e-12);
- ``sparse`` and ``gather`` in one call return both: the gathered log-probs as the float64
  log-softmax, the store as ``ref_store``;
- outputs that reach the loss only through an op returning no gradient: backward runs no matrix
  product and h, W, b keep grad None.

Run: ``pytest tests/algorithms/test_chunked_head_mutants.py``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from runners.algorithms.chunked_head import chunked_head, default_chunk_size
from tests.algorithms.test_chunked_head import _reference
from tests.algorithms.test_troll_sparse_mutants import _MaxNumel, ref_store

NEG = -math.inf


def _problem(n, hdim, vocab, seed, scale=1.0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, hdim, generator=g, dtype=torch.float64) * scale
    weight = torch.randn(vocab, hdim, generator=g, dtype=torch.float64)
    bias = torch.randn(vocab, generator=g, dtype=torch.float64) * 3
    tokens = torch.randint(0, vocab, (n,), generator=g)
    w_logp = torch.randn(n, generator=g, dtype=torch.float64)
    w_ent = torch.randn(n, generator=g, dtype=torch.float64)
    return hidden.to(dtype), weight.to(dtype), bias.to(dtype), tokens, w_logp, w_ent


def _chunked(hidden, weight, bias, tokens, w_logp, w_ent, **kwargs):
    h = hidden.detach().clone().requires_grad_(True)
    w = weight.detach().clone().requires_grad_(True)
    b = bias.detach().clone().requires_grad_(True) if bias is not None else None
    out = chunked_head(h, w, tokens, bias=b, **kwargs)
    ((out.logp * w_logp.to(out.logp.dtype)).sum() + (out.entropy * w_ent.to(out.logp.dtype)).sum()).backward()
    return out.logp.detach(), out.entropy.detach(), h.grad, w.grad, b.grad if b is not None else None


@pytest.mark.parametrize(
    ("temperature", "with_bias", "chunk_size"), [(0.5, True, 3), (1.0, True, 2), (1.0, False, None)]
)
def test_float64_inputs_match_the_dense_reference_to_1e10(temperature, with_bias, chunk_size):
    """Logits of size ~50 (float32 would be off by ~1e-6): values and gradients within 1e-10."""
    hidden, weight, bias, tokens, w_logp, w_ent = _problem(7, 5, 60, seed=1, scale=8.0)
    bias = bias if with_bias else None
    ref = _reference(hidden, weight, bias, tokens, w_logp, w_ent, temperature)
    ours = _chunked(hidden, weight, bias, tokens, w_logp, w_ent, temperature=temperature, chunk_size=chunk_size)
    assert float(ref[0].min()) < -30  # large logits
    for mine, exact in zip(ours, ref):
        if exact is None:
            assert mine is None
            continue
        assert mine.dtype == torch.float64
        torch.testing.assert_close(mine, exact, rtol=0, atol=1e-10 * max(1.0, float(exact.abs().max())))


def test_bf16_hidden_weight_and_bias_are_upcast():
    """bf16 h, W and b (temperature 0.8): values of the float32 product within 1e-5 of the float64
    reference of the same bf16 values; the three gradients come back in bf16."""
    hidden, weight, bias, tokens, w_logp, w_ent = _problem(9, 8, 120, seed=2, dtype=torch.bfloat16)
    ref = _reference(hidden, weight, bias, tokens, w_logp, w_ent, 0.8)
    ours = _chunked(hidden, weight, bias, tokens, w_logp.float(), w_ent.float(), temperature=0.8, chunk_size=4)
    assert ours[0].dtype == ours[1].dtype == torch.float32
    torch.testing.assert_close(ours[0].double(), ref[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(ours[1].double(), ref[1], rtol=0, atol=1e-5)
    for mine, exact in zip(ours[2:], ref[2:]):
        assert mine.dtype == torch.bfloat16
        torch.testing.assert_close(mine.double(), exact, rtol=2**-7, atol=2**-7 * float(exact.abs().max()))


def test_defaults_are_temperature_one_and_the_default_chunk_size():
    hidden, weight, bias, tokens, w_logp, w_ent = _problem(6, 4, 50, seed=3, dtype=torch.float32)
    ref = _reference(hidden, weight, bias, tokens, w_logp, w_ent, 1.0)
    out = chunked_head(hidden, weight, tokens, bias=bias)
    torch.testing.assert_close(out.logp.double(), ref[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(out.entropy.double(), ref[1], rtol=0, atol=1e-5)
    assert out.topk_index is None and out.topk_logp is None
    assert default_chunk_size(1) == default_chunk_size(0) == 1 << 23
    assert default_chunk_size(3) == (1 << 23) // 3 and default_chunk_size(3, "meta") == (1 << 26) // 3
    assert default_chunk_size((1 << 23) + 1) == 1 and default_chunk_size(1 << 30, "meta") == 1


def test_rows_far_apart_in_one_chunk_are_shifted_by_their_own_maximum():
    """float32, one chunk of 4 rows whose logits sit near +60 and near -60 (a last hidden feature of 0
    or -120 against a weight column of ones): each row's exp(z - m) must use its own maximum m (a
    shift shared by the chunk underflows the low rows to 0); values and gradients as the reference."""
    hidden, weight, bias, tokens, w_logp, w_ent = _problem(4, 3, 40, seed=9, dtype=torch.float32)
    hidden = torch.cat([hidden * 0.3, torch.tensor([[0.0], [-120.0], [0.0], [-120.0]])], -1)
    weight = torch.cat([weight, torch.ones(40, 1)], -1)
    bias = bias + 60.0
    ref = _reference(hidden, weight, bias, tokens, w_logp, w_ent)
    ours = _chunked(hidden, weight, bias, tokens, w_logp.float(), w_ent.float(), chunk_size=4)
    for mine, exact in zip(ours, ref):
        assert torch.isfinite(mine).all()
        torch.testing.assert_close(mine.double(), exact, rtol=0, atol=1e-5 * max(1.0, float(exact.abs().max())))


@pytest.mark.parametrize("sparse", [None, {"k": 3}])
def test_no_temporary_holds_more_than_a_chunk_of_logits(sparse):
    """N = 40, chunks of 4, V = 300, H = 2: forward and backward never make a tensor of more than
    4 x V values (the [N,V] logits have 30 times that)."""
    hidden, weight, bias, tokens, w_logp, w_ent = _problem(40, 2, 300, seed=4, dtype=torch.float32)
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    b = bias.clone().requires_grad_(True)
    with _MaxNumel() as mode:
        out = chunked_head(h, w, tokens, bias=b, temperature=0.7, chunk_size=4, sparse=sparse)
        ((out.logp * w_logp.float()).sum() + (out.entropy * w_ent.float()).sum()).backward()
    assert mode.largest <= 4 * 300
    ref = _reference(hidden, weight, bias, tokens, w_logp, w_ent, 0.7)
    torch.testing.assert_close(out.logp.detach().double(), ref[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(h.grad.double(), ref[2], rtol=0, atol=1e-5 * float(ref[2].abs().max()))


class _LogitElements(TorchDispatchMode):
    """Total number of elements of the matrix products (mm / addmm) run inside the mode."""

    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
            self.total += out.numel()
        return out


@pytest.mark.parametrize(("chunk_size", "with_bias"), [(4, True), (3, False), (1, True)])
def test_forward_computes_each_logit_once(chunk_size, with_bias):
    """N = 10 rows in chunks: the forward's matrix products make N x V logits in all (each row once)."""
    hidden, weight, bias, tokens, _, _ = _problem(10, 3, 50, seed=10, dtype=torch.float32)
    with _LogitElements() as mode:
        chunked_head(hidden, weight, tokens, bias=bias if with_bias else None, chunk_size=chunk_size)
    assert mode.total == 10 * 50


def _masked_vocabulary_problem():
    """[2,3] tokens, V = 30 with only tokens 0..3 unmasked (bias -inf elsewhere), two sampled tokens
    masked; float64."""
    hidden, weight, bias, tokens, _, _ = _problem(6, 4, 30, seed=5, scale=2.0)
    bias[4:] = NEG
    tokens[:4] = torch.tensor([0, 2, 3, 1])
    tokens[4:] = torch.tensor([17, 29])  # zero probability
    return hidden.reshape(2, 3, 4), weight, bias, tokens.reshape(2, 3)


@pytest.mark.parametrize(("k", "delta", "temperature"), [(6, 0.0, 1.0), (3, 0.1, 0.6), (2, 0.0, 1.0)])
def test_sparse_store_matches_the_reference_with_a_masked_vocabulary(k, delta, temperature):
    """Index and true log-probs of every row equal ref_store(z, y) of the dense float64 logits z:
    K above the 4 finite tokens leaves unused slots (index 0, -inf), a masked sampled token gets
    log p_d; the store is int32 / float32 and carries no gradient."""
    hidden, weight, bias, tokens = _masked_vocabulary_problem()
    h = hidden.clone().requires_grad_(True)
    out = chunked_head(
        h,
        weight,
        tokens,
        bias=bias,
        temperature=temperature,
        chunk_size=4,
        sparse={"k": k, "delta": delta, "p_default": 1e-6},
    )
    assert out.topk_index.shape == out.topk_logp.shape == (2, 3, k + 1)
    assert out.topk_index.dtype == torch.int32 and out.topk_logp.dtype == torch.float32
    assert out.logp.requires_grad and not out.topk_logp.requires_grad and not out.topk_index.requires_grad
    z = ((hidden.reshape(6, 4) @ weight.T + bias) / temperature).numpy()
    for r, y in enumerate(tokens.reshape(-1).tolist()):
        ref_index, ref_logp, _ = ref_store(z[r], y, k, delta, 1e-6, renormalize=False)
        assert out.topk_index.reshape(6, k + 1)[r].tolist() == ref_index, r
        got = out.topk_logp.reshape(6, k + 1)[r].double().numpy()
        np.testing.assert_array_equal(np.isfinite(got), np.isfinite(ref_logp))
        np.testing.assert_allclose(got[np.isfinite(got)], np.asarray(ref_logp)[np.isfinite(got)], rtol=1e-7, atol=1e-7)
    assert out.topk_logp[1, 1, -1] == pytest.approx(math.log(1e-6))
    lp = out.logp.detach()
    assert torch.isneginf(lp[1, 1:]).all() and torch.isfinite(lp.reshape(-1)[:4]).all()
    ref = _reference(
        hidden.reshape(6, 4), weight, bias, tokens.reshape(-1), torch.zeros(6), torch.zeros(6), temperature
    )
    torch.testing.assert_close(out.entropy.detach().reshape(-1), ref[1], rtol=0, atol=1e-12)  # p log p := 0


def test_sparse_defaults_are_k64_delta_1e5_pd_1e12():
    """``sparse={}``: K = 64, delta = 1e-5, p_d = 1e-12 (V = 200, one masked sampled token)."""
    hidden, weight, bias, tokens, _, _ = _problem(5, 6, 200, seed=6)
    bias[7] = NEG
    tokens[2] = 7
    out = chunked_head(hidden, weight, tokens, bias=bias, sparse={})
    z = (hidden @ weight.T + bias).numpy()
    assert out.topk_index.shape == (5, 65)
    for r, y in enumerate(tokens.tolist()):
        ref_index, ref_logp, _ = ref_store(z[r], y, 64, 1e-5, 1e-12, renormalize=False)
        assert out.topk_index[r].tolist() == ref_index
        got = out.topk_logp[r].double().numpy()
        np.testing.assert_allclose(got[np.isfinite(got)], np.asarray(ref_logp)[np.isfinite(got)], rtol=1e-7, atol=1e-7)
    assert float(out.topk_logp[2, -1]) == pytest.approx(math.log(1e-12))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"weight": torch.zeros(20, 9)}, r"hidden \(4, 8\) must be \[\.\.\., H\] with weight \[V, H\], got \(20, 9\)"),
        (
            {"weight": torch.zeros(20, 8, 1)},
            r"hidden \(4, 8\) must be \[\.\.\., H\] with weight \[V, H\], got \(20, 8, 1\)",
        ),
        ({"tokens": torch.zeros(3, dtype=torch.long)}, r"tokens \(3,\) must match hidden's leading shape \(4,\)"),
        (
            {"hidden": torch.zeros(2, 2, 8), "tokens": torch.zeros(4, dtype=torch.long)},
            r"tokens \(4,\) must match hidden's leading shape \(2, 2\)",
        ),
        ({"bias": torch.zeros(3)}, r"bias must be \[V=20\], got \(3,\)"),
        ({"temperature": -1.0}, r"temperature must be > 0, got -1.0"),
        ({"temperature": 0.0}, r"temperature must be > 0, got 0.0"),
        ({"chunk_size": 0}, r"chunk_size must be >= 1 or None, got 0"),
        ({"tokens": torch.tensor([0, -1, 3, 5])}, r"token ids must be in \[0, 20\), got range \[-1, 5\]"),
        ({"tokens": torch.tensor([2, 20, 3, 5])}, r"token ids must be in \[0, 20\), got range \[2, 20\]"),
        ({"sparse": {"kk": 3, "k": 2}}, r"unknown key\(s\) \['kk'\]; valid: k, delta, p_default"),
        ({"sparse": {"k": 2, "delta": 1.0}}, r"delta must be in \[0, 1\), got 1.0"),
        ({"sparse": {"k": 2, "p_default": 0.05}}, r"p_default must be > 0 with V \* p_default < 1 \(V=20\), got 0.05"),
        ({"sparse": {"k": 0}}, r"k must be in \[1, V=20\], got 0"),
    ],
)
def test_input_errors_name_the_argument_and_its_values(change, message):
    hidden, weight, _, _, _, _ = _problem(4, 8, 20, seed=7, dtype=torch.float32)
    args = {"hidden": hidden, "weight": weight, "tokens": torch.tensor([0, 19, 3, 5]), **change}
    with pytest.raises(ValueError, match=message):
        chunked_head(args.pop("hidden"), args.pop("weight"), args.pop("tokens"), **args)


def test_valid_edge_inputs_are_accepted():
    """chunk_size 1, the largest token id, K = V and delta = 0 are valid."""
    hidden, weight, _, _, w_logp, w_ent = _problem(3, 4, 20, seed=8, dtype=torch.float32)
    tokens = torch.tensor([19, 0, 19])
    out = chunked_head(hidden, weight, tokens, chunk_size=1, sparse={"k": 20, "delta": 0.0})
    ref = _reference(hidden, weight, None, tokens, w_logp, w_ent)
    torch.testing.assert_close(out.logp.double(), ref[0], rtol=0, atol=1e-5)
    assert (out.topk_logp[:, :-1] > NEG).sum(-1).tolist() == [19, 19, 19]


def test_the_row_sum_is_float32_unless_exact_sum():
    """The module docstring's arithmetic: s = sum exp(z - m) in float32 by default and with
    ``exact_sum=False``, in float64 with ``exact_sum=True``. One chunk, so the logits are the test's own
    float32 product bit for bit: the gathered float64 log-probs equal z_g - m - log s with s summed in
    that dtype to 1e-12, and the two sums' log-probs differ by more than 1e-8 (the check tells them apart)."""
    hidden, weight, _, tokens, _, _ = _problem(6, 8, 500, seed=11, dtype=torch.float32)
    ids = torch.randint(0, 500, (6, 5), generator=torch.Generator().manual_seed(12))
    z = hidden @ weight.T
    m = z.amax(-1, keepdim=True)
    e = torch.exp(z - m)
    base = z.gather(-1, ids).double() - m.double()
    float32_sum = base - e.sum(-1).double().log()[:, None]
    float64_sum = base - e.sum(-1, dtype=torch.float64).log()[:, None]
    assert float((float32_sum - float64_sum).abs().max()) > 1e-8
    for kwargs, ref in (({}, float32_sum), ({"exact_sum": False}, float32_sum), ({"exact_sum": True}, float64_sum)):
        out = chunked_head(hidden, weight, tokens, chunk_size=6, gather=ids, **kwargs)
        torch.testing.assert_close(out.gather_logp, ref, rtol=0, atol=1e-12, msg=str(kwargs))


def test_sparse_store_and_gathered_logprobs_together():
    """``sparse`` and ``gather`` in one call (float64, bias, temperature 0.8, chunks of 3): the gathered
    log-probs equal the dense float64 log-softmax at the ids to 1e-10 and the store equals ref_store."""
    hidden, weight, bias, tokens, _, _ = _problem(7, 5, 60, seed=13)
    ids = torch.randint(0, 60, (7, 4), generator=torch.Generator().manual_seed(14))
    out = chunked_head(
        hidden,
        weight,
        tokens,
        bias=bias,
        temperature=0.8,
        chunk_size=3,
        sparse={"k": 4, "delta": 0.0, "p_default": 1e-6},
        gather=ids,
    )
    z = (hidden @ weight.T + bias) / 0.8
    assert out.gather_logp is not None and out.gather_logp.shape == (7, 4)
    torch.testing.assert_close(out.gather_logp, torch.log_softmax(z, -1).gather(-1, ids), rtol=0, atol=1e-10)
    for r, y in enumerate(tokens.tolist()):
        ref_index, ref_logp, _ = ref_store(z[r].numpy(), y, 4, 0.0, 1e-6, renormalize=False)
        assert out.topk_index[r].tolist() == ref_index
        np.testing.assert_allclose(out.topk_logp[r].double().numpy(), ref_logp, rtol=1e-7, atol=1e-7)


class _NoGradient(torch.autograd.Function):
    """Identity whose backward returns no gradient (None), as a custom op or a cut branch of a loss can."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return None


def test_outputs_without_a_gradient_cost_nothing_and_leave_the_parameters_without_grad():
    """A loss that reaches chunked_head's outputs only through an op that returns no gradient: backward
    runs no matrix product over the chunks (the docstring: an output that no loss reads costs nothing)
    and h, W, b get no gradient (None, as autograd leaves any leaf that no gradient reaches; a zero
    tensor would still move them under weight decay or Adam's moments)."""
    hidden, weight, bias, tokens, _, _ = _problem(5, 4, 30, seed=15, dtype=torch.float32)
    bias[3] = NEG
    tokens[tokens == 3] = 4
    h, w, b = (t.clone().requires_grad_(True) for t in (hidden, weight, bias))
    other = torch.ones(2, requires_grad=True)
    out = chunked_head(h, w, tokens, bias=b, chunk_size=2, gather=torch.zeros(5, 2, dtype=torch.long))
    loss = sum(_NoGradient.apply(x).sum() for x in (out.logp, out.entropy, out.gather_logp)) + other.sum()
    with _LogitElements() as mode:
        loss.backward()
    assert mode.total == 0
    assert h.grad is None and w.grad is None and b.grad is None
    torch.testing.assert_close(other.grad, torch.ones(2))
