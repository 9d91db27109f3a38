"""``chunked_head`` (log-probs, entropies and TROLL's sparse store from hidden states, chunk by chunk)
against a dense float64 reference written here: ``z = (h W^T + b) / T`` in float64, ``log_softmax``,
``H = -sum p log p`` and torch autograd of that, for values and gradients w.r.t. h, W and b.

- chunk sizes 1, one not dividing N, one dividing it, >= N and the default; temperature 1 and 0.7;
  with and without bias; float32 and bf16 inputs; upstream gradients through the log-probs, the
  entropy or both;
- padded rows (a pad id, zero loss weight) change nothing else; ``-inf`` bias entries (masked
  vocabulary) give finite values and gradients equal to the reference's;
- Qwen's vocabulary (V = 151,936) on peaked rows: log-probs and entropies within 1e-5 of float64
  (the accuracy ``numerics.token_logprobs`` has today), gradients within 1e-5 of the largest
  reference gradient (see ``test_accuracy_at_qwen_vocabulary_on_peaked_rows`` for why relative);
- the sparse store equals ``troll_sparse.sparsify(z, y, renormalize=False)`` of the dense logits;
- memory: nothing the autograd graph saves has N x V elements (``saved_tensors_hooks``), while the
  dense path does (the check can fail);
- finite differences (``gradcheck``, float64) and the input errors.

Run: ``pytest tests/algorithms/test_chunked_head.py``.
"""

from __future__ import annotations

import math

import pytest
import torch

from runners.algorithms.chunked_head import VOCAB_BLOCK, chunked_head, default_chunk_size, output_logits
from runners.algorithms.numerics import entropy_from_logits, token_logprobs
from runners.algorithms.troll_sparse import sparsify

QWEN_V = 151936


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _problem(n: int, hdim: int, vocab: int, seed: int, peaked: float = 0.0):
    """h [n,H], W [V,H], b [V], tokens [n], loss weights for log-probs and entropies [n] each.

    ``peaked`` > 0: a constant feature h[:, 0] = 1 with W[:5, 0] = (12, 10, 9, 8, 7) * peaked gives
    every row five dominant tokens over a Gaussian background of std ~2 (``peaked=1``: the rows of
    test_numerics' peaked logits; at V = 151,936 the background still holds most of the mass;
    ``peaked=1.6``: the top token holds all but ~0.5%); half the sampled tokens are among the five."""
    g = _gen(seed)
    weight = torch.randn(vocab, hdim, generator=g) * (0.5 if peaked else 1.0)
    hidden = torch.randn(n, hdim, generator=g)
    if peaked:
        hidden[:, 0] = 1.0
        weight[:, 0] = 0.0
        weight[:5, 0] = torch.tensor([12.0, 10.0, 9.0, 8.0, 7.0]) * peaked
    bias = torch.randn(vocab, generator=g)
    tokens = torch.randint(0, vocab, (n,), generator=g)
    if peaked:
        tokens[::2] = torch.randint(0, 5, (tokens[::2].numel(),), generator=g)
    return hidden, weight, bias, tokens, torch.randn(n, generator=g), torch.randn(n, generator=g)


def _reference(hidden, weight, bias, tokens, w_logp, w_ent, temperature=1.0):
    """float64 dense values (logp, entropy) and gradients (h, W, b) of sum(w_logp logp + w_ent H)."""
    h = hidden.detach().double().requires_grad_(True)
    w = weight.detach().double().requires_grad_(True)
    b = bias.detach().double().requires_grad_(True) if bias is not None else None
    z = h @ w.T if b is None else h @ w.T + b
    logp_all = torch.log_softmax(z / temperature, dim=-1)
    logp = logp_all.gather(-1, tokens[:, None]).squeeze(-1)
    finite = logp_all > -math.inf
    safe = torch.where(finite, logp_all, 0.0)
    entropy = -(torch.where(finite, safe.exp(), 0.0) * safe).sum(-1)
    loss = (logp * w_logp.double()).sum() + (entropy * w_ent.double()).sum()
    loss.backward()
    return logp.detach(), entropy.detach(), h.grad, w.grad, (b.grad if b is not None else None)


def _ours(hidden, weight, bias, tokens, w_logp, w_ent, dtype=torch.float32, **kwargs):
    """chunked_head's values and gradients for inputs cast to ``dtype`` (fresh leaves)."""
    h = hidden.detach().to(dtype).clone().requires_grad_(True)
    w = weight.detach().to(dtype).clone().requires_grad_(True)
    b = bias.detach().to(dtype).clone().requires_grad_(True) if bias is not None else None
    out = chunked_head(h, w, tokens, bias=b, **kwargs)
    loss = (out.logp * w_logp).sum() + (out.entropy * w_ent).sum()
    loss.backward()
    return out.logp.detach(), out.entropy.detach(), h.grad, w.grad, (b.grad if b is not None else None)


def _close(ours, ref, scale_tol: float) -> None:
    """|ours - ref| <= scale_tol * max|ref| elementwise (float32 matmul error scales with the largest term)."""
    torch.testing.assert_close(ours.double(), ref, rtol=0, atol=scale_tol * float(ref.abs().max()))


@pytest.mark.parametrize("chunk_size", [1, 4, 13, 64, None])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_bias", [False, True])
def test_values_and_gradients_match_float64_reference(chunk_size, temperature, with_bias):
    """float32: values within 1e-5, gradients within 1e-5 of the largest (N = 13, V = 300)."""
    hidden, weight, bias, tokens, w_logp, w_ent = _problem(13, 8, 300, seed=chunk_size or 0)
    bias = bias if with_bias else None
    ref = _reference(hidden, weight, bias, tokens, w_logp, w_ent, temperature)
    ours = _ours(hidden, weight, bias, tokens, w_logp, w_ent, temperature=temperature, chunk_size=chunk_size)
    assert ours[0].dtype == torch.float32 and ours[2].dtype == torch.float32
    torch.testing.assert_close(ours[0].double(), ref[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(ours[1].double(), ref[1], rtol=0, atol=1e-5)
    for mine, exact in zip(ours[2:], ref[2:]):
        if exact is not None:
            _close(mine, exact, 1e-5)


@pytest.mark.parametrize("which", ["logp", "entropy", "both"])
def test_gradient_through_each_output(which):
    """Only the log-probs, only the entropies, or both in the loss: each matches the reference
    (an unused output adds nothing); with temperature and bias, chunks not dividing N."""
    hidden, weight, bias, tokens, w_logp, w_ent = _problem(11, 6, 97, seed=3)
    if which == "logp":
        w_ent = torch.zeros_like(w_ent)
    if which == "entropy":
        w_logp = torch.zeros_like(w_logp)
    ref = _reference(hidden, weight, bias, tokens, w_logp, w_ent, 1.3)
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    b = bias.clone().requires_grad_(True)
    out = chunked_head(h, w, tokens, bias=b, temperature=1.3, chunk_size=4)
    loss = {"logp": (out.logp * w_logp).sum(), "entropy": (out.entropy * w_ent).sum()}
    (sum(loss.values()) if which == "both" else loss[which]).backward()
    for mine, exact in zip((h.grad, w.grad, b.grad), ref[2:]):
        _close(mine, exact, 1e-5)


def test_only_the_weight_requires_grad():
    """Frozen hidden states (no grad) and a trainable W: W's gradient equals the reference's."""
    hidden, weight, _, tokens, w_logp, w_ent = _problem(10, 6, 80, seed=14)
    ref = _reference(hidden, weight, None, tokens, w_logp, w_ent, 0.5)
    w = weight.clone().requires_grad_(True)
    out = chunked_head(hidden, w, tokens, temperature=0.5, chunk_size=3)
    ((out.logp * w_logp).sum() + (out.entropy * w_ent).sum()).backward()
    _close(w.grad, ref[3], 1e-5)


@pytest.mark.parametrize("chunk_size", [5, 64])
def test_bf16_inputs_are_upcast_before_the_matmul(chunk_size):
    """bf16 h and W: the logits are the float32 product of the bf16 values, so values match the
    float64 reference of those values within 1e-5; gradients come back in bf16 (rounded: 2^-8
    relative), checked against the reference at 2^-7 of their scale."""
    hidden, weight, _, tokens, w_logp, w_ent = _problem(12, 8, 256, seed=4)
    hidden, weight = hidden.bfloat16(), weight.bfloat16()
    ref = _reference(hidden, weight, None, tokens, w_logp, w_ent, 0.8)
    ours = _ours(hidden, weight, None, tokens, w_logp, w_ent, torch.bfloat16, temperature=0.8, chunk_size=chunk_size)
    assert ours[0].dtype == torch.float32 and ours[2].dtype == torch.bfloat16 and ours[3].dtype == torch.bfloat16
    torch.testing.assert_close(ours[0].double(), ref[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(ours[1].double(), ref[1], rtol=0, atol=1e-5)
    for mine, exact in zip(ours[2:4], ref[2:4]):
        torch.testing.assert_close(mine.double(), exact, rtol=2**-7, atol=2**-7 * float(exact.abs().max()))


def test_padded_rows_change_nothing_else_and_leading_shape_is_kept():
    """[B,T,H] input with padded positions (pad id 0, zero loss weight, arbitrary hidden states):
    outputs keep [B,T]; the other rows' values and the gradients equal those of the batch without
    the padded rows, and the padded rows' hidden-state gradients are 0."""
    hidden, weight, bias, tokens, w_logp, w_ent = _problem(12, 8, 200, seed=5)
    pad = torch.tensor([False, False, True, False, True, True, False, False, False, True, True, True])
    tokens = torch.where(pad, 0, tokens)
    w_logp, w_ent = w_logp.masked_fill(pad, 0.0), w_ent.masked_fill(pad, 0.0)
    hidden = torch.where(pad[:, None], 1e3 * torch.randn(12, 8, generator=_gen(6)), hidden)
    h = hidden.reshape(3, 4, 8).clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    out = chunked_head(h, w, tokens.reshape(3, 4), bias=bias, chunk_size=5)
    assert out.logp.shape == out.entropy.shape == (3, 4)
    ((out.logp.reshape(-1) * w_logp).sum() + (out.entropy.reshape(-1) * w_ent).sum()).backward()
    keep = ~pad
    ref = _reference(hidden[keep], weight, bias, tokens[keep], w_logp[keep], w_ent[keep])
    torch.testing.assert_close(out.logp.reshape(-1)[keep].double(), ref[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(out.entropy.reshape(-1)[keep].double(), ref[1], rtol=0, atol=1e-5)
    _close(h.grad.reshape(12, 8)[keep], ref[2], 1e-5)
    assert h.grad.reshape(12, 8)[pad].abs().max() == 0
    _close(w.grad, ref[3], 1e-5)


def test_minus_inf_bias_masks_vocabulary_entries_without_nan():
    """A bias of -inf on some tokens: they get probability 0; values and gradients are finite and
    equal the reference's (p log p := 0 there), with an entropy weight so that term is exercised."""
    hidden, weight, bias, tokens, w_logp, w_ent = _problem(9, 6, 50, seed=7)
    bias[10:30] = -math.inf
    tokens = torch.where((tokens >= 10) & (tokens < 30), 3, tokens)
    ref = _reference(hidden, weight, bias, tokens, w_logp, w_ent, 0.9)
    ours = _ours(hidden, weight, bias, tokens, w_logp, w_ent, temperature=0.9, chunk_size=4)
    for mine in ours:
        assert torch.isfinite(mine).all()
    torch.testing.assert_close(ours[0].double(), ref[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(ours[1].double(), ref[1], rtol=0, atol=1e-5)
    for mine, exact in zip(ours[2:4], ref[2:4]):
        _close(mine, exact, 1e-5)
    assert ours[4][10:30].abs().max() == 0 and torch.isfinite(ref[4][30:]).all()
    _close(ours[4][30:], ref[4][30:], 1e-5)


@pytest.mark.parametrize("peaked", [1.0, 1.6])
def test_accuracy_at_qwen_vocabulary_on_peaked_rows(peaked):
    """V = 151,936, peaked rows, chunks of 5 over 16 rows: log-probs and entropies within 1e-5 of
    float64. Gradients within 1e-5 of the largest reference gradient: an absolute 1e-5 is below
    float32's resolution for entries of ~40 (ulp 3.8e-6), and dh = dz W sums 151,936 float32
    products whose partial sums carry the five large terms (MKL's float32 GEMM loses ~4e-6 of the
    scale there, the dense float32 path ~5e-7); the dense float32 path is held to the same bound."""
    hidden, weight, _, tokens, w_logp, w_ent = _problem(16, 16, QWEN_V, seed=8, peaked=peaked)
    tokens[:4] = 0  # the top token too
    ref = _reference(hidden, weight, None, tokens, w_logp, w_ent)
    ours = _ours(hidden, weight, None, tokens, w_logp, w_ent, chunk_size=5)
    torch.testing.assert_close(ours[0].double(), ref[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(ours[1].double(), ref[1], rtol=0, atol=1e-5)
    assert float(ref[0].min()) < -10 and float(ref[0].max()) > (-0.2 if peaked > 1 else -3)  # both kinds of tokens
    for mine, exact in zip(ours[2:4], ref[2:4]):
        _close(mine, exact, 1e-5)
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    z = (h @ w.T)[None]
    ((token_logprobs(z, tokens[None])[0] * w_logp).sum() + (entropy_from_logits(z)[0] * w_ent).sum()).backward()
    for dense, exact in zip((h.grad, w.grad), ref[2:4]):
        _close(dense, exact, 1e-5)


def _assert_same_store(ours_index, ours_logp, index, logp, atol):
    assert torch.equal(ours_index, index)
    finite = logp > -math.inf
    assert torch.equal(ours_logp > -math.inf, finite)
    torch.testing.assert_close(ours_logp[finite].double(), logp[finite].double(), rtol=0, atol=atol)


@pytest.mark.parametrize(
    ("vocab", "sparse", "temperature", "cut_by_delta"),
    [(QWEN_V, {}, 1.0, False), (500, {"k": 8, "delta": 0.05}, 0.7, True)],
)
def test_sparse_store_equals_dense_sparsify(vocab, sparse, temperature, cut_by_delta):
    """index equal, log-probs within 1e-5 of ``sparsify(z, y, renormalize=False)`` on the dense
    float32 logits (they differ from the chunk's by the GEMM's blocking, ~3e-6) and within 1e-5 of
    it on the float64 logits; the cut at K (Qwen's V: the background never leaves mass < delta), the
    cut at 1 - delta and the sampled-token slot are exercised."""
    hidden, weight, _, tokens, _, _ = _problem(14, 16, vocab, seed=9, peaked=1.6)
    out = chunked_head(hidden, weight, tokens, temperature=temperature, chunk_size=4, sparse=sparse)
    k1 = sparse.get("k", 64) + 1
    assert out.topk_index.shape == out.topk_logp.shape == (14, k1) and out.topk_index.dtype == torch.int32
    dense = (hidden @ weight.T) / temperature
    _assert_same_store(out.topk_index, out.topk_logp, *sparsify(dense, tokens, renormalize=False, **sparse), 1e-5)
    exact = (hidden.double() @ weight.double().T) / temperature
    _assert_same_store(out.topk_index, out.topk_logp, *sparsify(exact, tokens, renormalize=False, **sparse), 1e-5)
    kept = (out.topk_logp[:, :-1] > -math.inf).sum(-1)
    if cut_by_delta:
        assert 1 < int(kept.max()) < k1 - 1
    else:
        assert int(kept.max()) == k1 - 1 and int(kept.min()) == k1 - 2  # K slots, one less where y is in them
    assert torch.equal(out.topk_index[:, -1], tokens.int())


def test_store_is_none_without_sparse():
    hidden, weight, _, tokens, _, _ = _problem(3, 4, 20, seed=10)
    out = chunked_head(hidden, weight, tokens)
    assert out.topk_index is None and out.topk_logp is None


def _saved_numels(fn) -> list[int]:
    sizes: list[int] = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sizes


def test_autograd_graph_saves_no_n_by_v_tensor():
    """Everything saved for backward (through the hooks) is at most max(N x H, V x H); the dense
    path saves N x V logits, so the check detects them."""
    n, hdim, vocab = 64, 8, 4096
    hidden, weight, bias, tokens, _, _ = _problem(n, hdim, vocab, seed=11)
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)

    def chunked():
        out = chunked_head(h, w, tokens, bias=bias, chunk_size=16, sparse={"k": 4})
        return out.logp.sum() + out.entropy.sum()

    def dense():
        z = (h @ w.T)[None]
        return token_logprobs(z, tokens[None]).sum() + entropy_from_logits(z).sum()

    sizes = _saved_numels(chunked)
    assert sizes and max(sizes) <= max(n, vocab) * hdim
    assert max(_saved_numels(dense)) >= n * vocab
    chunked().backward()  # the graph built under the hooks still runs
    assert torch.isfinite(h.grad).all()


def test_gradcheck_float64():
    """Finite differences (float64) of both outputs w.r.t. h, W and b, temperature 0.6, chunks of 2."""
    hidden, weight, bias, tokens, w_logp, w_ent = _problem(5, 3, 7, seed=12)
    inputs = tuple(t.double().requires_grad_(True) for t in (hidden, weight, bias))

    def fn(h, w, b):
        out = chunked_head(h, w, tokens, bias=b, temperature=0.6, chunk_size=2)
        return out.logp, out.entropy

    assert torch.autograd.gradcheck(fn, inputs)


def test_default_chunk_size_bounds_the_buffer():
    assert default_chunk_size(QWEN_V) == 55 and default_chunk_size(10) == 838860 and default_chunk_size(1 << 30) == 1
    assert default_chunk_size(QWEN_V, "cuda") == default_chunk_size(QWEN_V, torch.device("cuda:0")) == 441


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": 0.0}, "temperature must be > 0"),
        ({"chunk_size": 0}, "chunk_size must be >= 1"),
        ({"tokens": torch.tensor([0, 20])}, r"token ids must be in \[0, 20\)"),
        ({"tokens": torch.tensor([0])}, "tokens"),
        ({"bias": torch.zeros(3)}, "bias must be"),
        ({"sparse": {"kk": 3}}, "unknown key"),
        ({"sparse": {"k": 21}}, "k must be in"),
    ],
)
def test_input_errors_name_the_argument(kwargs, message):
    hidden, weight, _, tokens, _, _ = _problem(2, 4, 20, seed=13)
    args = {"tokens": tokens, **kwargs}
    with pytest.raises(ValueError, match=message):
        chunked_head(hidden, weight, args.pop("tokens"), **args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize(("rows", "vocab"), [(1, 3000), (7, VOCAB_BLOCK * 5 + 17), (64, 49152), (85, 8 * VOCAB_BLOCK)])
def test_output_logits_are_f_linear_bit_for_bit(rows, vocab, with_bias, dtype):
    """The blocked output-layer matmul gives F.linear's values exactly (each entry is the same dot
    product), for a vocabulary that is not a multiple of the block and with a bias."""
    g = torch.Generator().manual_seed(rows + vocab)
    x = torch.randn(rows, 96, generator=g).to(dtype)
    weight = (torch.randn(vocab, 96, generator=g) * 0.1).to(dtype)
    bias = torch.randn(vocab, generator=g).to(dtype) if with_bias else None
    got = output_logits(x, weight, bias)
    assert got.dtype == dtype and got.shape == (rows, vocab)
    assert torch.equal(got, torch.nn.functional.linear(x, weight, bias))
    # a strided input (a slice of rows of a wider activation) too
    wide = torch.randn(rows, 2, 96, generator=g).to(dtype)[:, 1]
    assert torch.equal(output_logits(wide, weight, bias), torch.nn.functional.linear(wide, weight, bias))


class _CallCounter(torch.overrides.TorchFunctionMode):
    """Counts the torch functions called inside the mode, by name."""

    def __init__(self):
        super().__init__()
        self.calls: dict[str, int] = {}
        self.out_widths: list[int] = []  # columns of each ``out=`` tensor

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        self.calls[name] = self.calls.get(name, 0) + 1
        if kwargs and isinstance(kwargs.get("out"), torch.Tensor):
            self.out_widths.append(kwargs["out"].shape[-1])
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    ("rows_shape", "vocab", "dtype", "blocks"),
    [
        ((5, 64), VOCAB_BLOCK * 3 + 1, torch.float32, 4),  # a short last block
        ((5, 64), VOCAB_BLOCK * 2, torch.float32, 2),
        ((5, 64), VOCAB_BLOCK, torch.float32, 0),  # one block: F.linear
        ((5, 64), VOCAB_BLOCK * 2, torch.float64, 0),  # not bitwise in blocks: F.linear
        ((5, 64), VOCAB_BLOCK * 2, torch.bfloat16, 0),
        ((2, 5, 64), VOCAB_BLOCK * 2, torch.float32, 0),  # not [M,H]: F.linear
    ],
)
def test_output_logits_runs_one_matmul_per_block_only_where_that_is_exact(rows_shape, vocab, dtype, blocks):
    """Where the blocks give F.linear's values bit for bit (float32 [M,H] on CPU) one matmul per
    VOCAB_BLOCK columns writes into the output; everywhere else one F.linear call."""
    x = torch.randn(*rows_shape).to(dtype)
    weight, bias = torch.randn(vocab, 64).to(dtype), torch.randn(vocab).to(dtype)
    for b in (None, bias):
        with _CallCounter() as counter:
            output_logits(x, weight, b)
        matmuls = counter.calls.get("mm", 0) + counter.calls.get("addmm", 0)
        assert matmuls == blocks and counter.calls.get("linear", 0) == (0 if blocks else 1), counter.calls
        if blocks:
            assert counter.calls.get("addmm" if b is not None else "mm", 0) == blocks
            # each call computes its own block only: the widths add up to V
            assert max(counter.out_widths) <= VOCAB_BLOCK and sum(counter.out_widths) == vocab


def _spy_out_storages(monkeypatch) -> dict[str, list]:
    """The storages that ``out=`` tensors of ``torch.mm``/``torch.addmm`` and ``torch.exp`` write into,
    forward and backward (autograd runs a Function's backward outside a TorchFunctionMode), each kept
    alive: a freed buffer's address could be handed out again and look reused."""
    storages: dict[str, list] = {"matmul": [], "exp": []}
    for name, kind in (("mm", "matmul"), ("addmm", "matmul"), ("exp", "exp")):
        real = getattr(torch, name)

        def spy(*args, _real=real, _kind=kind, **kwargs):
            if isinstance(kwargs.get("out"), torch.Tensor):
                storages[_kind].append(kwargs["out"].untyped_storage())
            return _real(*args, **kwargs)

        monkeypatch.setattr(torch, name, spy)
    return storages


@pytest.mark.parametrize("with_bias", [False, True])
def test_chunks_reuse_two_buffers_per_pass(monkeypatch, with_bias):
    """Forward and backward each write every chunk's logits and exponentials into the same two
    [rows, V] buffers (a chunk-sized tensor made anew per chunk is fresh pages to fault in on CPU),
    the short last chunk included; values and gradients are those of one chunk."""
    hidden, weight, bias, tokens, w_logp, w_ent = _problem(10, 32, VOCAB_BLOCK * 3 + 5, seed=17)
    hidden, weight = hidden.requires_grad_(), weight.requires_grad_()
    b = bias.requires_grad_() if with_bias else None
    reference = chunked_head(hidden, weight, tokens, bias=b, chunk_size=10)
    ref_grads = torch.autograd.grad(
        (reference.logp * w_logp).sum() + (reference.entropy * w_ent).sum(), (hidden, weight)
    )
    spied = _spy_out_storages(monkeypatch)
    out = chunked_head(hidden, weight, tokens, bias=b, chunk_size=4)  # chunks of 4, 4, 2 rows
    grads = torch.autograd.grad((out.logp * w_logp).sum() + (out.entropy * w_ent).sum(), (hidden, weight))
    monkeypatch.undo()
    assert len(spied["exp"]) == 6 and len(spied["matmul"]) == 6 * 4  # 3 chunks x 2 passes; 4 blocks each
    for kind, calls in spied.items():  # the forward's three chunks, then the backward's three
        ptrs = [s.data_ptr() for s in calls]
        half = len(ptrs) // 2
        assert len(set(ptrs[:half])) == 1 and len(set(ptrs[half:])) == 1, (kind, ptrs)
    # one chunk of 10 rows against three: the BLAS may round a 10-row product differently
    torch.testing.assert_close(out.logp, reference.logp, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out.entropy, reference.entropy, rtol=1e-6, atol=1e-6)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("exact_sum", [False, True])
def test_gather_store_equals_gathering_at_the_returned_store(with_bias, exact_sum):
    """One pass that gathers at its own top-K store's ids gives what a second pass with ``gather=`` that
    store's index gives, values and gradients bit for bit: on peaked rows where the mass cut drops
    slots (their id 0), with the sampled token inside and outside the top K, over three chunks."""
    hidden, weight, bias, tokens, w_logp, w_ent = _problem(10, 32, VOCAB_BLOCK * 3 + 5, seed=19, peaked=1.6)
    tokens[::3] = 4000 % weight.shape[0]  # outside the five dominant tokens
    sparse = {"k": 8, "delta": 1e-3}
    w_pick = torch.randn(10, 9, generator=_gen(20), dtype=torch.float64)
    results = []
    for own in (True, False):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        b = bias.clone().requires_grad_() if with_bias else None
        kwargs = {"bias": b, "chunk_size": 4, "sparse": sparse, "exact_sum": exact_sum}
        if own:
            out = chunked_head(h, w, tokens, gather_store=True, **kwargs)
        else:
            store = chunked_head(h.detach(), w.detach(), tokens, **{**kwargs, "bias": bias if with_bias else None})
            out = chunked_head(h, w, tokens, gather=store.topk_index.long(), **kwargs)
        loss = (out.logp * w_logp).sum() + (out.entropy * w_ent).sum() + (out.gather_logp * w_pick).sum().float()
        grads = torch.autograd.grad(loss, [h, w] + ([b] if with_bias else []))
        results.append((out, grads))
    (own, own_grads), (two, two_grads) = results
    dropped = (own.topk_logp[:, :-1] == -math.inf).sum()
    assert dropped > 0 and (own.topk_index[:, :-1] == 0).sum() >= dropped  # the cut acted
    assert torch.equal(own.topk_index, two.topk_index) and torch.equal(own.topk_logp, two.topk_logp)
    assert torch.equal(own.gather_logp, two.gather_logp)
    assert torch.equal(own.logp, two.logp) and torch.equal(own.entropy, two.entropy)
    for a, b in zip(own_grads, two_grads):
        assert torch.equal(a, b)
    # and against float64 log_softmax of the same logits at the store's ids (an independent value)
    z = hidden.double() @ weight.double().t() + (bias.double() if with_bias else 0.0)
    dense = torch.log_softmax(z, -1).gather(-1, own.topk_index.long())
    torch.testing.assert_close(own.gather_logp, dense, rtol=0, atol=1e-5)


def test_gather_store_needs_a_store_and_no_gather():
    hidden, weight, _, tokens, _, _ = _problem(2, 4, 20, seed=13)
    with pytest.raises(ValueError, match="gather_store needs sparse"):
        chunked_head(hidden, weight, tokens, gather_store=True)
    with pytest.raises(ValueError, match="gather_store needs sparse"):
        chunked_head(hidden, weight, tokens, gather_store=True, sparse={"k": 4}, gather=tokens[:, None])
