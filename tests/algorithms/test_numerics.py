"""Log-probs and entropies from logits against float64 references (values, gradients via gradcheck,
chunking, temperature, -inf logits), against verl's helpers, and Entropy-preserving RL (arXiv 2603.11682) Theorem 3 (section 4.1,
App. A.8): ratios from bf16-rounded log-probs are biased upward, by Var(delta)/2, and fp32 is not.

Run: ``pytest tests/algorithms/test_numerics.py``.
"""

from __future__ import annotations

import math

import pytest
import scipy.stats
import torch

from runners.algorithms.numerics import entropy_from_logits, token_logprobs


def _logits(seed: int, shape=(3, 5, 40), scale: float = 3.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def _reference_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    full = torch.log_softmax(logits.double() / temperature, dim=-1)
    return full.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("chunk_size", [None, 4])
def test_token_logprobs_match_float64_log_softmax(temperature, chunk_size):
    logits = _logits(0)
    tokens = torch.randint(0, 40, (3, 5), generator=torch.Generator().manual_seed(1))
    ours = token_logprobs(logits, tokens, temperature=temperature, chunk_size=chunk_size)
    assert ours.dtype == torch.float32 and ours.shape == (3, 5)
    torch.testing.assert_close(ours.double(), _reference_logprobs(logits, tokens, temperature), rtol=1e-6, atol=1e-5)


def test_token_logprobs_bf16_logits_are_upcast_before_the_softmax():
    """bf16 logits: the log-softmax runs in fp32 on the bf16 values (no bf16 arithmetic)."""
    logits = _logits(2).bfloat16()
    tokens = torch.randint(0, 40, (3, 5), generator=torch.Generator().manual_seed(3))
    ours = token_logprobs(logits, tokens)
    torch.testing.assert_close(ours.double(), _reference_logprobs(logits.float(), tokens), rtol=1e-6, atol=1e-5)


def test_bf16_precision_rounds_the_fp32_result():
    logits = _logits(4)
    tokens = torch.randint(0, 40, (3, 5), generator=torch.Generator().manual_seed(5))
    fp32 = token_logprobs(logits, tokens)
    bf16 = token_logprobs(logits, tokens, precision="bf16")
    assert bf16.dtype == torch.float32
    assert torch.equal(bf16, fp32.bfloat16().float())
    assert not torch.equal(bf16, fp32)
    with pytest.raises(ValueError, match="precision"):
        token_logprobs(logits, tokens, precision="int8")
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(logits, tokens, temperature=0.0)


def test_token_logprobs_gradcheck_chunked():
    """Gradient of the chunked logsumexp + gather form (finite differences, float64)."""
    logits = _logits(6, shape=(2, 3, 7)).double().requires_grad_(True)
    tokens = torch.randint(0, 7, (2, 3), generator=torch.Generator().manual_seed(7))
    assert torch.autograd.gradcheck(lambda x: token_logprobs(x, tokens, chunk_size=4, temperature=0.7), (logits,))


def test_token_logprobs_gradcheck_with_masked_vocabulary():
    """The gradient against finite differences, unchunked, with -inf logits (masked tokens): their
    gradient is exactly 0, the rest matches float64 log_softmax's."""
    logits = _logits(12, shape=(2, 4, 9)).double()
    logits[..., 6:] = float("-inf")
    tokens = torch.randint(0, 6, (2, 4), generator=torch.Generator().manual_seed(13))
    leaf = logits.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: token_logprobs(x, tokens), (leaf,))
    weights = torch.randn(2, 4, generator=torch.Generator().manual_seed(14), dtype=torch.float64)
    (token_logprobs(leaf, tokens) * weights).sum().backward()
    ref = logits.clone().requires_grad_(True)
    (_reference_logprobs(ref, tokens) * weights).sum().backward()
    assert torch.all(leaf.grad[..., 6:] == 0)
    torch.testing.assert_close(leaf.grad, ref.grad, rtol=1e-12, atol=1e-12)


def _peaked_logits(vocab: int, rows: int = 64) -> torch.Tensor:
    """Rows like a language model's: five dominant tokens over a Gaussian background of V - 5."""
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(15)) * 2
    logits[:, :5] += torch.tensor([12.0, 10.0, 9.0, 8.0, 7.0])
    return logits


@pytest.mark.parametrize("vocab", [49152, 151936])
def test_float32_log_probs_and_entropy_stay_accurate_at_real_vocabularies(vocab):
    """float32 results within 1e-5 of float64 at SmolLM2's and Qwen's vocabularies on peaked rows.
    Guards the form: ATen's CPU ``log_softmax`` in float32 is off by 4e-5 (V = 49,152) and 1.4e-4
    (V = 151,936) on such rows, checked here too, so a switch to it would fail."""
    logits = _peaked_logits(vocab)
    tokens = torch.randint(0, vocab, (logits.shape[0],), generator=torch.Generator().manual_seed(16))
    tokens[::2] = torch.randint(0, 5, (tokens[::2].numel(),), generator=torch.Generator().manual_seed(17))
    exact = torch.log_softmax(logits.double(), -1)
    torch.testing.assert_close(
        token_logprobs(logits, tokens).double(), exact.gather(-1, tokens[:, None]).squeeze(-1), rtol=0, atol=1e-5
    )
    exact_entropy = -(exact.exp() * exact).sum(-1)
    torch.testing.assert_close(entropy_from_logits(logits).double(), exact_entropy, rtol=0, atol=1e-5)
    assert float((torch.log_softmax(logits, -1).double() - exact).abs().max()) > 2e-5  # the form avoided


def test_entropy_matches_scipy_and_handles_minus_inf():
    """H of softmax(logits) equals scipy.stats.entropy; -inf logits count as p = 0 (value and
    gradient equal those of the same distribution without them); an all -inf row gives 0."""
    logits = _logits(8, shape=(2, 3, 9))
    probs = torch.softmax(logits.double(), -1)
    expected = torch.tensor(scipy.stats.entropy(probs.numpy(), axis=-1))
    torch.testing.assert_close(entropy_from_logits(logits).double(), expected, rtol=1e-6, atol=1e-6)

    masked = logits.clone()
    masked[..., 5:] = float("-inf")
    masked[1, 2] = float("-inf")
    masked.requires_grad_(True)
    ent = entropy_from_logits(masked, chunk_size=4)
    ent.sum().backward()
    assert torch.isfinite(ent).all() and torch.isfinite(masked.grad).all()
    assert ent[1, 2].item() == 0.0
    kept = logits[..., :5].clone().requires_grad_(True)
    ref = entropy_from_logits(kept)
    ref[1, 2] = 0.0
    ref.sum().backward()
    torch.testing.assert_close(ent[0], ref[0])
    torch.testing.assert_close(masked.grad[..., :5][0], kept.grad[0])
    assert torch.all(masked.grad[..., 5:] == 0)


def test_entropy_gradcheck():
    logits = _logits(9, shape=(2, 2, 6)).double().requires_grad_(True)
    assert torch.autograd.gradcheck(entropy_from_logits, (logits,))


@pytest.mark.verl
def test_agree_with_verl_helpers():
    """Same numbers as verl's logprobs_from_logits and entropy_from_logits on CPU."""
    verl_f = pytest.importorskip("verl.utils.torch_functional")
    logits = _logits(10)
    tokens = torch.randint(0, 40, (3, 5), generator=torch.Generator().manual_seed(11))
    torch.testing.assert_close(token_logprobs(logits, tokens), verl_f.logprobs_from_logits(logits, tokens))
    torch.testing.assert_close(entropy_from_logits(logits), verl_f.entropy_from_logits(logits))


# -- Entropy-preserving RL (arXiv 2603.11682) Theorem 3 -----------------------------------------------------------------------
def _bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """Spacing of bfloat16 numbers (8 significant bits) around |x|."""
    return 2.0 ** (torch.floor(torch.log2(x.abs().clamp(min=1e-30))) - 7)


def _mean_and_se(x: torch.Tensor) -> tuple[float, float]:
    return x.mean().item(), x.std().item() / math.sqrt(x.numel())


@pytest.mark.slow
def test_theorem3_bf16_ratio_bias():
    """Entropy-preserving RL (arXiv 2603.11682) Theorem 3: E[r_obs | r_true] = r_true (1 + (ulp_new^2 + ulp_old^2) / 24) > r_true.

    1e5 random distributions over 16 tokens (logits ~ N(0, 6^2)), a perturbed new policy (+ N(0, 0.5^2)
    on the logits), and the least likely token of each, where one bf16 ulp of log p is largest
    (|log p| ~ 21, ulp 2^-3), so the bias (~1.3e-3) is measurable. r_true comes from float64.
    Checked: the relative bias is > 0 by > 5 standard errors overall and > 2.5 in each quartile of
    r_true (the bias is conditional on r_true), agrees with the theorem's Var(delta)/2 within 4 s.e.;
    with fp32 log-probs the bias is statistically zero and over ten thousand times smaller.
    """
    gen = torch.Generator().manual_seed(0)
    n, vocab = 100_000, 16
    old = torch.randn(n, 1, vocab, generator=gen) * 6.0
    new = old + torch.randn(n, 1, vocab, generator=gen) * 0.5
    tokens = old.argmin(-1)
    true_old = _reference_logprobs(old, tokens).flatten()
    true_new = _reference_logprobs(new, tokens).flatten()
    r_true = (true_new - true_old).exp()
    predicted = (_bf16_ulp(true_new) ** 2 + _bf16_ulp(true_old) ** 2) / 24

    def relative_error(precision: str) -> torch.Tensor:
        obs = token_logprobs(new, tokens, precision=precision).double() - token_logprobs(
            old, tokens, precision=precision
        )
        return obs.flatten().exp() / r_true - 1

    bf16 = relative_error("bf16")
    mean, se = _mean_and_se(bf16)
    assert mean > 5 * se
    assert abs(mean - predicted.mean().item()) < 4 * se
    quartile = torch.bucketize(r_true, torch.quantile(r_true, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64)))
    for q in range(4):
        q_mean, q_se = _mean_and_se(bf16[quartile == q])
        assert q_mean > 2.5 * q_se, (q, q_mean, q_se)
        assert abs(q_mean - predicted[quartile == q].mean().item()) < 4 * q_se

    fp32_mean, fp32_se = _mean_and_se(relative_error("fp32"))
    assert abs(fp32_mean) < 4 * fp32_se
    assert abs(fp32_mean) < 1e-4 * mean
