"""TROLL's sparse token distributions (runners/algorithms/troll_sparse.py) against references written
here in float64 numpy / scipy from the paper (TROLL, arXiv 2510.03817, section 3.2, appendix A.4
eq. 21 and Theorem A.2, appendix E.4), aimed at the branches the mutation testing (``make mutation``)
found unchecked:

- ``sparsify``: the store of every row (top tokens in decreasing order, cut after the token that
  brings the cumulative mass to 1 - delta, capped at K, the sampled token in slot K and removed from
  the top slots, unused slots index 0 / log-prob -inf, a zero-probability sampled token at p_d), its
  kept mass and eq. 21's gamma, with and without renormalisation, for [B,T,V] and [N,V] inputs, chunk
  sizes that do and do not divide N, N > V, the defaults (K = 64, delta = 1e-5, p_d = 1e-12), and
  float64 logits far from 0 (``renormalize=False`` keeps float64 normalisers);
- ``store_from_topk`` called directly: a cumulative mass exactly 1 - delta, zero-probability top slots;
- ``chunked_logsumexp``: selected rows in later blocks only, unsorted and repeated rows, rows whose
  plain sum overflows, underflows or is empty (all -inf), float64 results, and the documented bound
  on how many rows are upcast at once;
- ``reduce_on_kept_set`` against eq. 21 on the old kept set with the tail atom, including rows where
  the new logits are -inf on all of S, V = 1, the default p_d, and its gradient;
- ``check_sparse_params`` at each boundary, ``theorem_a2_bound`` and the storage figures exactly.

Run: ``pytest tests/algorithms/test_troll_sparse_mutants.py``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import logsumexp as scipy_logsumexp
from torch.utils._python_dispatch import TorchDispatchMode

from runners.algorithms.troll_sparse import (
    _device_logsumexp,
    check_sparse_params,
    chunked_logsumexp,
    dense_storage_bytes,
    large_topk,
    reduce_on_kept_set,
    sparse_storage_bytes,
    sparsify,
    store_from_topk,
    theorem_a2_bound,
)

NEG = -math.inf


# -- reference ---------------------------------------------------------------------------------------
def ref_store(logits: np.ndarray, y: int, k: int, delta: float, p_d: float, renormalize: bool):
    """One row's sparse store from float64 logits [V] (section 3.2, eq. 21), written as a loop.

    Returns (index [K+1], logp [K+1], kept mass). Slot j < K holds the j-th most probable token while
    the cumulative mass before it is below 1 - delta (the token that reaches it is kept), unless it
    has zero probability or is the sampled token y (then index 0, -inf); slot K holds y with log p(y),
    or log p_d where p(y) = 0. Renormalised: every kept log-prob + log gamma, gamma = (1 - (V - |S|) p_d)
    / sum_S p."""
    vocab = logits.shape[0]
    logp = logits - scipy_logsumexp(logits)
    order = np.argsort(-logp, kind="stable")[:k]
    index = [0] * (k + 1)
    values = [NEG] * (k + 1)
    cumulative = 0.0
    for j, token in enumerate(order):
        if cumulative >= 1 - delta:
            break
        cumulative += math.exp(logp[token])
        if logp[token] == NEG or token == y:
            continue
        index[j], values[j] = int(token), float(logp[token])
    index[k] = int(y)
    values[k] = float(logp[y]) if logp[y] > NEG else math.log(p_d)
    mass = sum(math.exp(v) for v in values if v > NEG)
    if renormalize:
        size = sum(v > NEG for v in values)
        log_gamma = math.log((1 - (vocab - size) * p_d) / mass)
        values = [v + log_gamma if v > NEG else NEG for v in values]
    return index, values, mass


def _assert_store(index, logp, logits, sampled, k, delta, p_d, renormalize, mass=None, atol=2e-6):
    """Every row of (index, logp[, mass]) equals ref_store of the float64 logits: log-probs to float32
    storage; the kept mass to float32 storage where the normaliser is float64 (``renormalize=False``),
    else to the float32 rounding of the normaliser (2^-24 |logsumexp|, which renormalisation cancels in
    the stored log-probs but not in the mass)."""
    flat = logits.double().reshape(-1, logits.shape[-1]).numpy()
    ids = sampled.reshape(-1).tolist()
    index, logp = index.reshape(len(ids), k + 1), logp.reshape(len(ids), k + 1)
    assert index.dtype == torch.int32 and logp.dtype == torch.float32
    for r, y in enumerate(ids):
        ref_index, ref_logp, ref_mass = ref_store(flat[r], y, k, delta, p_d, renormalize)
        assert index[r].tolist() == ref_index, r
        got = logp[r].double().numpy()
        np.testing.assert_array_equal(np.isfinite(got), np.isfinite(ref_logp))
        finite = np.isfinite(got)
        np.testing.assert_allclose(got[finite], np.asarray(ref_logp)[finite], rtol=1e-7, atol=atol)
        if mass is not None:
            assert mass.dtype == torch.float32
            lse = abs(float(scipy_logsumexp(flat[r])))
            rel_tol = 2e-7 + (2**-23 * lse if renormalize else 0.0)
            assert math.isclose(float(mass.reshape(-1)[r]), ref_mass, rel_tol=rel_tol), r


def _batch(shape, vocab, seed, scale=3.0):
    """float64 logits [*shape, V] with varied peakedness; sampled ids: some among the top tokens, some
    outside, one with zero probability, one row with only 3 finite entries (fewer than K)."""
    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    temps = torch.linspace(0.4, 2.5, n, dtype=torch.float64)[:, None]
    logits = torch.randn(n, vocab, generator=g, dtype=torch.float64) * scale / temps
    sampled = torch.randint(0, vocab, (n,), generator=g)
    sampled[::3] = logits[::3].argmax(-1)  # in the top slots
    sampled[1::3] = logits[1::3].argsort(-1)[:, -2]
    logits[2, :] = NEG
    logits[2, :3] = torch.tensor([1.0, 0.5, -0.2], dtype=torch.float64)  # 3 finite entries
    logits[4, sampled[4]] = NEG  # the sampled token has zero probability
    return logits.reshape(*shape, vocab), sampled.reshape(shape)


# -- sparsify ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("chunk_size", [4, 1024])
def test_sparsify_matches_the_reference_on_a_3d_batch(renormalize, chunk_size):
    """[2,5,V] float64 logits, K = 6, delta = 0.05: index, log-probs and mass of every row."""
    k, delta, p_d = 6, 0.05, 1e-4
    logits, sampled = _batch((2, 5), 50, seed=1)
    index, logp, mass = sparsify(
        logits,
        sampled,
        k=k,
        delta=delta,
        p_default=p_d,
        chunk_size=chunk_size,
        return_mass=True,
        renormalize=renormalize,
    )
    assert index.shape == logp.shape == (2, 5, k + 1) and mass.shape == (2, 5)
    _assert_store(index, logp, logits, sampled, k, delta, p_d, renormalize, mass)
    kept_top = (logp[..., :-1] > NEG).sum(-1).reshape(-1)
    assert int(kept_top.min()) < 3 and int(kept_top.max()) >= k - 1  # cut by delta and by K
    two_d = sparsify(
        logits.reshape(10, 50),
        sampled.reshape(10),
        k=k,
        delta=delta,
        p_default=p_d,
        chunk_size=chunk_size,
        renormalize=renormalize,
    )
    assert torch.equal(two_d[0], index.reshape(10, k + 1)) and torch.equal(two_d[1], logp.reshape(10, k + 1))


def test_sparsify_defaults_are_k64_delta_1e5_pd_1e12_renormalised():
    """Without options: K = 64, delta = 1e-5, p_d = 1e-12, renormalised, no mass returned."""
    logits, sampled = _batch((6,), 200, seed=2, scale=1.0)
    out = sparsify(logits, sampled)
    assert len(out) == 2 and out[0].shape == (6, 65)
    _assert_store(*out, logits, sampled, 64, 1e-5, 1e-12, True)
    index, logp, mass = sparsify(logits, sampled, return_mass=True)
    _assert_store(index, logp, logits, sampled, 64, 1e-5, 1e-12, True, mass)


def test_sparsify_with_more_rows_than_vocabulary_and_single_row_chunks():
    """N = 30 rows of V = 10 tokens, chunks of 7 and of 1 row, K = V, delta = 0 (every token kept)."""
    logits, sampled = _batch((30,), 10, seed=3)
    for chunk_size in (7, 1):
        index, logp, mass = sparsify(
            logits, sampled, k=10, delta=0.0, p_default=1e-3, chunk_size=chunk_size, return_mass=True
        )
        _assert_store(index, logp, logits, sampled, 10, 0.0, 1e-3, True, mass)
    index, logp = sparsify(logits, sampled, k=4, delta=0.0, p_default=1e-3, chunk_size=1, renormalize=False)
    _assert_store(index, logp, logits, sampled, 4, 0.0, 1e-3, False)
    assert int((logp[:, :-1] > NEG).sum(-1).max()) == 4  # delta = 0: K top slots where y is not among them


def test_true_log_probs_use_float64_normalisers_for_float64_logits():
    """``renormalize=False`` on float64 logits around 1000 (float32 spacing there: 6e-5): the stored
    log-probs and the kept mass are those of the float64 distribution, to float32 storage."""
    logits, sampled = _batch((8,), 300, seed=4, scale=2.0)
    logits = logits + 1000.0
    index, logp, mass = sparsify(logits, sampled, k=8, delta=1e-3, renormalize=False, return_mass=True)
    _assert_store(index, logp, logits, sampled, 8, 1e-3, 1e-12, False, mass, atol=1e-6)


def test_bf16_logits_keep_their_top_tokens_and_float32_normalisers():
    """bf16 logits: the store of their exact (float64) values."""
    logits, sampled = _batch((6,), 400, seed=5, scale=2.0)
    logits[2, 3:] = -1e4  # bf16 cannot hold this row's -inf pattern exactly; keep it finite
    bf16 = logits.bfloat16()
    for renormalize in (True, False):
        index, logp, mass = sparsify(bf16, sampled, k=5, delta=0.02, renormalize=renormalize, return_mass=True)
        _assert_store(index, logp, bf16.double(), sampled, 5, 0.02, 1e-12, renormalize, mass, atol=3e-6)


def test_sparsify_input_errors_name_the_argument():
    logits, sampled = _batch((2, 3), 20, seed=6)
    with pytest.raises(ValueError, match=r"sampled \(3, 2\) must match logits' leading shape \(2, 3\)"):
        sparsify(logits, sampled.T, k=3)
    with pytest.raises(ValueError, match=r"sampled token ids must be in \[0, 20\), got range \[-1, "):
        sparsify(logits, sampled.masked_fill(sampled == sampled[0, 0], -1), k=3)
    with pytest.raises(ValueError, match=r"got range \[\d+, 20\]"):
        sparsify(logits, sampled.masked_fill(sampled == sampled[0, 0], 20), k=3)
    for token in (0, 19):  # the smallest and the largest id are valid
        index, _ = sparsify(logits, torch.full_like(sampled, token), k=3)
        assert index[..., -1].eq(token).all()


# -- store_from_topk ---------------------------------------------------------------------------------
def test_store_cuts_after_the_token_that_reaches_exactly_one_minus_delta():
    """Top probabilities 1/2, 1/4, 1/8, 1/16 (exact in float64) and delta = 1/4: the cumulative mass
    reaches 1 - delta = 3/4 exactly at the second token, so two tokens are kept (not three)."""
    probs = torch.tensor([[0.5, 0.25, 0.125, 0.0625]] * 3, dtype=torch.float64)
    top_idx = torch.tensor([[7, 3, 9, 1], [2, 4, 6, 8], [5, 0, 1, 2]])
    ids = torch.tensor([11, 4, 12])
    idx, lp = store_from_topk(
        probs.log(),
        top_idx,
        torch.tensor([-3.0, math.log(0.25), NEG], dtype=torch.float64),
        torch.zeros(3, dtype=torch.float64),
        ids,
        0.25,
        1e-6,
    )
    assert idx.tolist() == [[7, 3, 0, 0, 11], [2, 0, 0, 0, 4], [5, 0, 0, 0, 12]]
    expected = [
        [math.log(0.5), math.log(0.25), NEG, NEG, -3.0],
        [math.log(0.5), NEG, NEG, NEG, math.log(0.25)],
        [math.log(0.5), math.log(0.25), NEG, NEG, math.log(1e-6)],
    ]
    torch.testing.assert_close(lp, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-15)


def test_store_gives_zero_probability_top_slots_index_zero():
    """A row with two finite logits and K = 4 (delta = 0): the two -inf top slots get index 0 and
    log-prob -inf, the sampled token (outside the top) the last slot."""
    top_val = torch.tensor([[0.0, -1.0, NEG, NEG], [1.0, 0.5, 0.2, NEG]], dtype=torch.float64)
    top_idx = torch.tensor([[4, 6, 2, 3], [1, 2, 3, 5]])
    lse = torch.logsumexp(top_val, -1)
    idx, lp = store_from_topk(
        top_val, top_idx, torch.tensor([NEG, 0.2], dtype=torch.float64), lse, torch.tensor([9, 3]), 0.0, 1e-9
    )
    assert idx.tolist() == [[4, 6, 0, 0, 9], [1, 2, 0, 0, 3]]
    ref = (top_val - lse[:, None]).tolist()
    assert lp[0].tolist() == [ref[0][0], ref[0][1], NEG, NEG, math.log(1e-9)]
    assert lp[1].tolist()[:4] == [ref[1][0], ref[1][1], NEG, NEG] and lp[1, 4] == ref[1][2]


# -- chunked_logsumexp -------------------------------------------------------------------------------
def _rows(n=9, vocab=300, seed=7):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, vocab, generator=g) * 4
    x[5] += 200.0  # the plain sum overflows
    x[6] -= 200.0  # the plain sum underflows
    x[7] = NEG  # no finite entry: -inf
    x[8, :-1] = NEG  # one finite entry
    return x


@pytest.mark.parametrize("chunk_size", [1, 2, 4, 1024])
def test_chunked_logsumexp_every_row_and_selected_rows(chunk_size):
    x = _rows()
    ref = scipy_logsumexp(x.double().numpy(), axis=-1)
    whole = chunked_logsumexp(x, chunk_size=chunk_size)
    assert whole.dtype == torch.float32 and whole.shape == (9,)
    np.testing.assert_allclose(whole.double().numpy(), ref, rtol=1e-6, atol=0)
    for rows in ([7, 3, 3], [8], [6, 5, 1], [0]):
        got = chunked_logsumexp(x, torch.tensor(rows), chunk_size=chunk_size)
        np.testing.assert_allclose(got.double().numpy(), ref[rows], rtol=1e-6, atol=0)


def test_chunked_logsumexp_in_float64():
    x = _rows().double() * 1.37
    ref = scipy_logsumexp(x.numpy(), axis=-1)
    for rows in (None, torch.tensor([6, 2])):
        got = chunked_logsumexp(x, rows, chunk_size=3, dtype=torch.float64)
        assert got.dtype == torch.float64
        np.testing.assert_allclose(got.numpy(), ref if rows is None else ref[rows.numpy()], rtol=1e-13, atol=0)
    from_float32 = chunked_logsumexp(_rows(), chunk_size=2, dtype=torch.float64)
    assert from_float32.dtype == torch.float64
    np.testing.assert_allclose(from_float32.numpy(), scipy_logsumexp(_rows().double().numpy(), axis=-1), rtol=1e-13)


class _MaxNumel(TorchDispatchMode):
    """Largest number of elements of any new tensor an aten op returns inside the mode (outputs that
    share storage with an argument, such as views and detach, are not new)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat_args = [*args, *(kwargs or {}).values()]
        flat_args += [t for a in flat_args if isinstance(a, (tuple, list)) for t in a]
        shared = {a.untyped_storage().data_ptr() for a in flat_args if isinstance(a, torch.Tensor)}
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in shared:
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("chunk_size", [1, 3])
def test_chunked_logsumexp_upcasts_at_most_chunk_size_rows_at_a_time(chunk_size):
    """bf16 input [10, V]: no temporary holds more than chunk_size rows of V values."""
    x = _rows(10, 500, seed=8)[:, :].bfloat16()
    with _MaxNumel() as mode:
        chunked_logsumexp(x, chunk_size=chunk_size)
    assert mode.largest <= chunk_size * 500


def test_cpu_blocks_are_cache_sized_and_default_to_1024_rows():
    """On CPU at most 2^25 bytes are upcast at once (2^23 float32 or 2^22 float64 values: 8 or 4 rows of
    V = 2^20), and at most 1024 rows by default (``chunk_size``), for ``chunked_logsumexp`` and for
    ``sparsify``'s chunks; values log V for uniform rows."""
    wide = torch.zeros(10, 1 << 20)
    for dtype, limit in ((torch.float32, 1 << 23), (torch.float64, 1 << 22)):
        with _MaxNumel() as mode:
            got = chunked_logsumexp(wide, dtype=dtype)
        assert mode.largest <= limit and got.dtype == dtype
        torch.testing.assert_close(got, torch.full((10,), 20 * math.log(2), dtype=dtype))
    narrow = torch.randn(1025, 8, generator=torch.Generator().manual_seed(11))
    with _MaxNumel() as mode:
        got = chunked_logsumexp(narrow)
    assert mode.largest <= 1024 * 8
    np.testing.assert_allclose(got.double().numpy(), scipy_logsumexp(narrow.double().numpy(), axis=-1), rtol=1e-6)
    sampled = torch.randint(0, 8, (1025,), generator=torch.Generator().manual_seed(12))
    with _MaxNumel() as mode:
        index, logp = sparsify(narrow, sampled, k=1, delta=0.5, p_default=1e-3)
    assert mode.largest <= 1024 * 8
    _assert_store(index[-3:], logp[-3:], narrow[-3:], sampled[-3:], 1, 0.5, 1e-3, True)


class _TopkRows(TorchDispatchMode):
    """Total number of rows that aten.topk searches inside the mode."""

    def __init__(self):
        super().__init__()
        self.rows = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.topk.default:
            self.rows += out[0].numel() // out[0].shape[-1]
        return out


class _ExpElements(TorchDispatchMode):
    """Total number of elements that aten.exp / exp_ produce inside the mode."""

    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (torch.ops.aten.exp.default, torch.ops.aten.exp_.default):
            self.total += out.numel()
        return out


@pytest.mark.parametrize("chunk_size", [1, 3])
def test_chunked_logsumexp_sums_each_row_once_and_skips_blocks_without_selected_rows(chunk_size):
    """Rows of V = 40 whose plain sums lie between 1e-30 and overflow (one near 3e-3: no shifted
    recomputation): every row is exponentiated once; with ``rows`` only the blocks holding one of them
    are (the rows' own block of ``chunk_size`` rows)."""
    x = torch.randn(9, 40, generator=torch.Generator().manual_seed(15))
    x[4] -= 10.0
    with _ExpElements() as mode:
        chunked_logsumexp(x, chunk_size=chunk_size)
    assert mode.total == 9 * 40
    with _ExpElements() as mode:
        got = chunked_logsumexp(x, torch.tensor([8]), chunk_size=chunk_size)
    assert mode.total == (9 - 8 // chunk_size * chunk_size) * 40
    np.testing.assert_allclose(got.double().numpy(), scipy_logsumexp(x[8:].double().numpy(), axis=-1), rtol=1e-6)


@pytest.mark.parametrize("chunk_size", [1, 4, 1024])
def test_sparsify_searches_each_row_once(chunk_size):
    """N = 10 rows (V = 50 < 16,384: one torch.topk per chunk): the chunks cover each row exactly once."""
    logits, sampled = _batch((10,), 50, seed=14)
    with _TopkRows() as mode:
        sparsify(logits, sampled, k=4, chunk_size=chunk_size)
    assert mode.rows == 10


def test_device_path_blocks_hold_chunk_size_rows():
    """``_device_logsumexp`` (the accelerator path, run on CPU tensors): blocks of ``chunk_size`` rows."""
    x = _rows(9, 300, seed=13)
    for chunk_size in (1, 3):
        with _MaxNumel() as mode:
            got = _device_logsumexp(x, None, chunk_size, torch.float32)
        assert mode.largest <= chunk_size * 300
        np.testing.assert_allclose(got.double().numpy(), scipy_logsumexp(x.double().numpy(), axis=-1), rtol=1e-6)
    ref = scipy_logsumexp(x.double().numpy()[[8, 0, 5]], axis=-1)
    for source in (x, x.double()):  # summed in float64 whatever the input dtype
        got = _device_logsumexp(source, torch.tensor([8, 0, 5]), 2, torch.float64)
        assert got.dtype == torch.float64
        np.testing.assert_allclose(got.numpy(), ref, rtol=1e-13)
    bf16 = x.bfloat16()  # summed in float32
    got = _device_logsumexp(bf16, None, 4, torch.float32)
    np.testing.assert_allclose(got.double().numpy(), scipy_logsumexp(bf16.double().numpy(), axis=-1), rtol=1e-6)


# -- reduce_on_kept_set ------------------------------------------------------------------------------
def _ref_reduced(new: np.ndarray, old: np.ndarray, vocab: int, p_d: float):
    """eq. 21 on S = {old > -inf}: both renormalised to 1 - m, m = (V - |S|) p_d, plus the tail atom
    log m; a row whose new logits are -inf on all of S puts all its new mass on the tail atom."""
    logq, logo = [], []
    for z, o in zip(new, old):
        valid = np.isfinite(o)
        m = (vocab - valid.sum()) * p_d
        log_m = math.log(m) if m > 0 else NEG
        lo = np.full(o.shape, NEG)
        lo[valid] = math.log1p(-m) + o[valid] - scipy_logsumexp(o[valid])
        logo.append([*lo, log_m])
        lq = np.full(o.shape, NEG)
        if np.isfinite(z[valid]).any():
            lq[valid] = math.log1p(-m) + z[valid] - scipy_logsumexp(z[valid])
            logq.append([*lq, log_m])
        else:
            logq.append([*lq, 0.0])
    return np.asarray(logq), np.asarray(logo)


def test_reduce_on_kept_set_matches_eq21_with_the_tail_atom():
    """Rows with every slot kept, unused slots, new logits -inf on part of S and on all of S (4 rows,
    K + 1 = 6 slots: no dimension is 4 or 6 twice); the default p_d = 1e-12 and a large one."""
    g = torch.Generator().manual_seed(9)
    old = torch.randn(4, 6, generator=g, dtype=torch.float64) - 2
    old[1, 2] = old[1, 4] = NEG
    old[2, :3] = NEG
    new = torch.randn(4, 6, generator=g, dtype=torch.float64)
    new[2, 4] = NEG
    new[3, :] = NEG
    new[1, 2] = 5.0  # an unused slot: ignored
    for vocab, p_d in ((50, None), (50, 1e-3), (7, 0.1)):
        kwargs = {} if p_d is None else {"p_default": p_d}
        logq, logo, kept = reduce_on_kept_set(new, old.float(), vocab, **kwargs)
        ref_q, ref_o = _ref_reduced(new.numpy(), old.float().double().numpy(), vocab, p_d or 1e-12)
        assert logq.dtype == logo.dtype == torch.float64 and logq.shape == logo.shape == (4, 7)
        assert kept.tolist() == [6, 4, 3, 6]
        np.testing.assert_array_equal(np.isfinite(logq.detach().numpy()), np.isfinite(ref_q))
        np.testing.assert_allclose(logq.detach().numpy(), ref_q, rtol=0, atol=1e-12)
        np.testing.assert_allclose(logo.numpy(), ref_o, rtol=0, atol=1e-12)


def test_reduce_on_kept_set_with_a_one_token_vocabulary():
    """V = 1: the single kept token holds all the mass and the tail atom is empty (-inf)."""
    logq, logo, kept = reduce_on_kept_set(torch.tensor([[0.3, 0.0]]), torch.tensor([[0.0, NEG]]), 1, p_default=0.5)
    assert logq.tolist() == [[0.0, NEG, NEG]] and logo.tolist() == [[0.0, NEG, NEG]] and kept.tolist() == [1]


def test_reduce_on_kept_set_gradient_is_that_of_the_renormalised_logits():
    """d logq_i / d z_j = delta_ij - softmax_S(z)_j on S, 0 at unused slots and on rows without new mass."""
    g = torch.Generator().manual_seed(10)
    old = torch.randn(3, 5, generator=g, dtype=torch.float64)
    old[0, 1] = NEG
    z = torch.randn(3, 5, generator=g, dtype=torch.float64)
    z[2] = NEG
    z.requires_grad_(True)
    weights = torch.randn(3, 6, generator=g, dtype=torch.float64)
    logq, _, _ = reduce_on_kept_set(z, old, 30, p_default=1e-3)
    (torch.where(logq > NEG, logq, 0.0) * weights).sum().backward()
    expected = np.zeros((3, 5))
    for r in range(2):
        valid = np.isfinite(old[r].numpy())
        soft = np.exp(z[r].detach().numpy()[valid] - scipy_logsumexp(z[r].detach().numpy()[valid]))
        w = weights[r, :5].numpy()[valid]
        expected[r, valid] = w - soft * w.sum()
    np.testing.assert_allclose(z.grad.numpy(), expected, rtol=0, atol=1e-12)


# -- check_sparse_params, Theorem A.2, storage ---------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((10, 0, 0.1, 1e-3), r"k must be in \[1, V=10\], got 0"),
        ((10, 11, 0.1, 1e-3), r"k must be in \[1, V=10\], got 11"),
        ((10, 3, -0.1, 1e-3), r"delta must be in \[0, 1\), got -0.1"),
        ((10, 3, 1.0, 1e-3), r"delta must be in \[0, 1\), got 1.0"),
        ((10, 3, 1.5, 1e-3), r"delta must be in \[0, 1\), got 1.5"),
        ((10, 3, 0.1, 0.0), r"p_default must be > 0 with V \* p_default < 1 \(V=10\), got 0.0"),
        ((10, 3, 0.1, -1e-3), r"p_default must be > 0"),
        ((4, 3, 0.1, 0.25), r"p_default must be > 0 with V \* p_default < 1 \(V=4\), got 0.25"),
        ((4, 3, 0.1, 0.375), r"p_default must be > 0"),
    ],
)
def test_check_sparse_params_rejects_each_boundary(args, message):
    with pytest.raises(ValueError, match=message):
        check_sparse_params(*args)


def test_check_sparse_params_accepts_each_boundary():
    for args in ((10, 1, 0.0, 1e-3), (10, 10, 0.999, 0.0999), (1, 1, 0.5, 0.5), (4, 2, 0.0, 0.2499)):
        check_sparse_params(*args)


def test_theorem_a2_bound_formula():
    """factor = (1 - delta) / (1 - (V - K) p_d), additive = delta log(delta / q_min), bound = factor eps
    + additive (appendix A.4), at numbers where every term matters."""
    b = theorem_a2_bound(V=100, K=10, delta=0.1, p_d=1e-3, q_min=1e-4, eps=0.2)
    factor = 0.9 / (1 - 90e-3)
    additive = 0.1 * math.log(0.1 / 1e-4)
    assert math.isclose(b.factor, factor, rel_tol=1e-14)
    assert math.isclose(b.additive, additive, rel_tol=1e-14)
    assert math.isclose(b.bound, factor * 0.2 + additive, rel_tol=1e-14)


def test_storage_bytes_exactly():
    """Appendix E.4 / eq. 23: tokens x responses x V x 4 bytes dense; x kept x (4 + 4) bytes sparse."""
    assert dense_storage_bytes(256, 8, 151936) == 256 * 8 * 151936 * 4
    assert dense_storage_bytes(3, 5, 7, bytes_per_value=2) == 210
    assert sparse_storage_bytes(256, 8, 10) == 256 * 8 * 10 * 8
    assert sparse_storage_bytes(3, 5, 6.5, index_bytes=2, value_bytes=3) == 3 * 5 * 6.5 * 5


# -- large_topk --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("vocab", "k"), [(16384, 128), (16384 + 5, 1), (20000, 3), (300, 7)])
def test_large_topk_equals_a_full_sort(vocab, k):
    """Both stages and the plain torch.topk (V below 16,384; K equal to the number of groups)."""
    g = torch.Generator().manual_seed(vocab + k)
    x = torch.randn(5, vocab, generator=g)
    x[1, -3:] = 50.0 + torch.arange(3.0)  # the best tokens in the last (partial) group
    x[3, :200] = 40.0 - torch.arange(200.0) / 7  # a run of large values inside a few groups
    values, index = large_topk(x, k)
    order = np.argsort(-x.double().numpy(), axis=-1, kind="stable")[:, :k]
    np.testing.assert_array_equal(values.numpy(), np.take_along_axis(x.numpy(), order, -1))
    np.testing.assert_array_equal(index.numpy(), order)
    assert index.dtype == torch.int64
