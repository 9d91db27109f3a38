"""Log-probs and entropies from logits (runners/algorithms/numerics.py): chunk boundaries, input errors,
dtypes, token id types, rounding precisions and -inf logits, found by mutation testing.

References are independent of the module: log-softmax and entropies evaluated in float64 loops with
``math`` (and ``scipy.special.entr``), bfloat16 / float16 rounding by torch's casts of those values, and
error messages written out.

Run: ``pytest tests/algorithms/test_numerics_mutants.py``.
"""

from __future__ import annotations

import math

import pytest
import scipy.special
import torch

from runners.algorithms.numerics import PRECISIONS, entropy_from_logits, round_logprobs, token_logprobs

NEG_INF = float("-inf")


def _ref_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature)[token], per position, in float64 loops."""
    flat = logits.double().reshape(-1, logits.shape[-1]).tolist()
    out = []
    for row, tok in zip(flat, tokens.reshape(-1).tolist()):
        row = [x / temperature for x in row]
        top = max(row)
        z = top + math.log(math.fsum(math.exp(x - top) for x in row if x != NEG_INF))
        out.append(row[tok] - z)
    return torch.tensor(out, dtype=torch.float64).reshape(tokens.shape)


def _ref_entropy(logits: torch.Tensor) -> torch.Tensor:
    """-sum p log p per position (0 for a row without a finite logit), float64."""
    out = []
    for row in logits.double().reshape(-1, logits.shape[-1]).tolist():
        finite = [x for x in row if x != NEG_INF]
        if not finite:
            out.append(0.0)
            continue
        top = max(finite)
        z = math.fsum(math.exp(x - top) for x in finite)
        out.append(math.fsum(float(scipy.special.entr(math.exp(x - top) / z)) for x in finite))
    return torch.tensor(out, dtype=torch.float64).reshape(logits.shape[:-1])


def _batch(seed: int, shape=(2, 3, 11)):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(*shape, generator=g) * 2.5
    tokens = torch.randint(0, shape[-1], shape[:-1], generator=g)
    return logits, tokens


@pytest.mark.parametrize("chunk_size", [1, 2, 5, 6, 7, 100])
def test_every_chunk_size_gives_the_same_log_probs_and_entropies(chunk_size):
    # 6 positions: chunk 1 (six parts), 2 (three), 5 (two, the last of one row), 6 and more (one)
    logits, tokens = _batch(0)
    ours = token_logprobs(logits, tokens, chunk_size=chunk_size, temperature=0.8)
    assert ours.shape == (2, 3) and ours.dtype == torch.float32
    torch.testing.assert_close(ours.double(), _ref_logprobs(logits, tokens, 0.8), rtol=1e-6, atol=1e-6)
    ent = entropy_from_logits(logits, chunk_size=chunk_size)
    assert ent.shape == (2, 3) and ent.dtype == torch.float32
    torch.testing.assert_close(ent.double(), _ref_entropy(logits), rtol=1e-6, atol=1e-6)


def test_one_row_per_chunk_keeps_gradients():
    logits, tokens = _batch(1, shape=(1, 2, 5))
    leaf = logits.double().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: token_logprobs(x, tokens, chunk_size=1), (leaf,))
    assert torch.autograd.gradcheck(lambda x: entropy_from_logits(x, chunk_size=1), (leaf,))


@pytest.mark.parametrize("chunk_size", [0, -1, -7])
def test_chunk_size_below_one_is_an_error(chunk_size):
    logits, tokens = _batch(2)
    with pytest.raises(ValueError, match=rf"chunk_size must be >= 1 or None, got {chunk_size}"):
        token_logprobs(logits, tokens, chunk_size=chunk_size)
    with pytest.raises(ValueError, match=rf"chunk_size must be >= 1 or None, got {chunk_size}"):
        entropy_from_logits(logits, chunk_size=chunk_size)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8, torch.int64])
def test_token_ids_of_any_integer_type(dtype):
    logits, tokens = _batch(3)
    ours = token_logprobs(logits, tokens.to(dtype))
    torch.testing.assert_close(ours.double(), _ref_logprobs(logits, tokens), rtol=1e-6, atol=1e-6)


def test_float64_logits_stay_float64():
    logits, tokens = _batch(4)
    logits = logits.double() * 1.7
    ours = token_logprobs(logits, tokens, temperature=1.3, chunk_size=4)
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours, _ref_logprobs(logits, tokens, 1.3), rtol=1e-13, atol=1e-13)
    ent = entropy_from_logits(logits, chunk_size=4)
    assert ent.dtype == torch.float64
    torch.testing.assert_close(ent, _ref_entropy(logits), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits_give_float32_from_their_values(dtype):
    logits, tokens = _batch(5)
    low = logits.to(dtype)
    ours = token_logprobs(low, tokens, temperature=0.7)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours.double(), _ref_logprobs(low.double(), tokens, 0.7), rtol=1e-6, atol=1e-6)
    ent = entropy_from_logits(low)
    assert ent.dtype == torch.float32
    torch.testing.assert_close(ent.double(), _ref_entropy(low.double()), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("precision", "dtype"), [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_precision_rounds_to_its_type_and_back(precision, dtype):
    logits, tokens = _batch(6, shape=(4, 8, 13))
    ours = token_logprobs(logits, tokens, precision=precision, chunk_size=5)
    ref = _ref_logprobs(logits, tokens)
    assert ours.dtype == torch.float32
    # within half an ulp of the low-precision type around the exact value (plus float32 rounding)
    ulp = 2.0 ** (torch.floor(torch.log2(ref.abs())) - (7 if dtype is torch.bfloat16 else 10))
    assert ((ours.double() - ref).abs() <= ulp / 2 + 1e-5).all()
    assert torch.equal(ours, ours.to(dtype).float())  # representable in that type
    assert PRECISIONS == {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def test_round_logprobs_defaults_to_fp32_and_keeps_the_dtype():
    x = torch.tensor([-0.1234567, -3.3333333, -17.0001], dtype=torch.float64)
    assert torch.equal(round_logprobs(x), x)
    assert torch.equal(round_logprobs(x, "fp32"), x)
    bf = round_logprobs(x, "bf16")
    assert bf.dtype == torch.float64
    assert bf.tolist() == [-0.12353515625, -3.328125, -17.0]  # nearest bfloat16 values (8 significant bits)
    half = round_logprobs(x.float(), "fp16")
    assert half.dtype == torch.float32
    assert half.tolist() == [-0.12347412109375, -3.333984375, -17.0]  # nearest float16 values (11 bits)


def test_token_logprobs_errors_name_the_argument():
    logits, tokens = _batch(7)
    with pytest.raises(ValueError, match=r"precision='int8'; valid values: fp32, bf16, fp16"):
        token_logprobs(logits, tokens, precision="int8")
    for bad in (0.0, -0.5):
        with pytest.raises(ValueError, match=rf"temperature must be > 0, got {bad}"):
            token_logprobs(logits, tokens, temperature=bad)
    with pytest.raises(ValueError, match=r"logits \(2, 3, 11\) must be tokens \(2, 4\) \+ \[V\]"):
        token_logprobs(logits, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"logits \(2, 3, 11\) must be tokens \(3, 2\) \+ \[V\]"):
        token_logprobs(logits, tokens.reshape(3, 2))


def test_default_temperature_is_one_and_a_small_one_is_applied():
    logits, tokens = _batch(8)
    torch.testing.assert_close(
        token_logprobs(logits, tokens).double(), _ref_logprobs(logits, tokens), rtol=1e-6, atol=1e-6
    )
    # a temperature just below 1 still divides
    ours = token_logprobs(logits.double(), tokens, temperature=0.999)
    torch.testing.assert_close(ours, _ref_logprobs(logits, tokens, 0.999), rtol=1e-13, atol=1e-13)
    assert not torch.allclose(ours, _ref_logprobs(logits, tokens), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("chunk_size", [None, 1, 2, 4])
def test_entropy_with_minus_inf_logits_and_all_minus_inf_rows(chunk_size):
    logits, _ = _batch(9, shape=(2, 3, 6))
    logits = logits.double()
    logits[0, 0, 2:] = NEG_INF  # two finite logits
    logits[0, 1] = NEG_INF  # no distribution: entropy 0
    logits[1, 0, 1:] = NEG_INF  # one finite logit: p = 1, entropy 0
    logits[1, 2, ::2] = NEG_INF
    leaf = logits.clone().requires_grad_(True)
    ent = entropy_from_logits(leaf, chunk_size=chunk_size)
    torch.testing.assert_close(ent, _ref_entropy(logits), rtol=1e-12, atol=1e-12)
    assert ent[0, 1].item() == 0.0 and ent[1, 0].item() == 0.0
    ent.sum().backward()
    grad = leaf.grad
    assert torch.isfinite(grad).all()
    assert torch.all(grad[logits == NEG_INF] == 0) and torch.all(grad[0, 1] == 0) and torch.all(grad[1, 0] == 0)
    # the gradient of a row with -inf logits is that of the same distribution over its finite logits
    kept = logits[0, 0, :2].clone().requires_grad_(True)
    p = torch.softmax(kept, -1)
    (-(p * p.log()).sum()).backward()
    torch.testing.assert_close(grad[0, 0, :2], kept.grad, rtol=1e-12, atol=1e-12)


def test_entropy_of_a_single_position_and_a_square_batch():
    # [1,1,V] and [V,1,V]: shapes where a wrong reduction dimension would still broadcast
    logits = torch.randn(5, 1, 5, generator=torch.Generator().manual_seed(10), dtype=torch.float64)
    logits[1, 0, 3:] = NEG_INF
    logits[2, 0] = NEG_INF
    torch.testing.assert_close(entropy_from_logits(logits), _ref_entropy(logits), rtol=1e-12, atol=1e-12)
    one = logits[:1]
    torch.testing.assert_close(entropy_from_logits(one), _ref_entropy(one), rtol=1e-12, atol=1e-12)
    tokens = torch.tensor([[4], [0], [1], [2], [3]])
    logits[2, 0, 1] = 0.0  # a position must score its own token
    torch.testing.assert_close(token_logprobs(logits, tokens), _ref_logprobs(logits, tokens), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("temperature", [2.0, 0.5, 3.0])
def test_round_temperatures_divide_the_logits(temperature):
    logits, tokens = _batch(11)
    ours = token_logprobs(logits.double(), tokens, temperature=temperature, chunk_size=4)
    torch.testing.assert_close(ours, _ref_logprobs(logits, tokens, temperature), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("chunk_size", [None, 5, 24, 30])
def test_more_positions_than_vocabulary_entries(chunk_size):
    # B*T = 24 positions over V = 3: every position is scored, not only the first V
    logits, tokens = _batch(12, shape=(4, 6, 3))
    ours = token_logprobs(logits, tokens, chunk_size=chunk_size)
    torch.testing.assert_close(ours.double(), _ref_logprobs(logits, tokens), rtol=1e-6, atol=1e-6)
    ent = entropy_from_logits(logits, chunk_size=chunk_size)
    torch.testing.assert_close(ent.double(), _ref_entropy(logits), rtol=1e-6, atol=1e-6)
