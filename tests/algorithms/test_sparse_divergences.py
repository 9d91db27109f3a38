"""Exact-KL TRM where the stored support is a small part of a real vocabulary (V >> K).

The stored rollout distribution keeps the top-K tokens' true log-probs (``sparsify(renormalize=False)``,
what both backends store); TRM's token KL and TV add the missing mass as one rest bin. Checked
against the dense full-vocabulary KL(pi_roll || pi_theta) and TV computed here in float64:

- an unchanged policy gives KL = TV = 0 and every sequence is accepted, at any kept mass (the
  defect this fixes: with renormalised stored log-probs an unchanged policy read -log(kept mass),
  1.6 at V = 4096 / K = 64, and TRM-Max rejected everything);
- a changed policy: the estimate never exceeds the dense value (data processing inequality), and
  equals it when the stored support is the whole vocabulary;
- the same through the built-in backend's old-log-prob pass and policy loss, and on the distributions
  of the real SmolLM2-135M (V = 49,152), whose top-64 often keeps under 95% of the mass.
"""

from __future__ import annotations

import pytest
import torch

from runners.algorithms import MASKS
from runners.algorithms.trm import sparse_token_divergences
from runners.algorithms.troll_sparse import sparsify
from runners.algorithms.types import PolicyInputs

V, K = 4096, 64


def _dense_kl_tv(rollout_logits: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    p = torch.log_softmax(rollout_logits.double(), -1)
    q = torch.log_softmax(logits.double(), -1)
    kl = (p.exp() * (p - q)).sum(-1)
    tv = 0.5 * (p.exp() - q.exp()).abs().sum(-1)
    return kl, tv


def _heavy_tailed_logits(shape, seed: int) -> torch.Tensor:
    """Logits whose top-64 keeps roughly 20-60% of the mass (a real LLM's tail, exaggerated)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, V, generator=gen, dtype=torch.float64) * 1.5


def _stored(rollout_logits: torch.Tensor, sampled: torch.Tensor, k: int = K):
    return sparsify(rollout_logits, sampled, k=k, delta=1e-5, renormalize=False, return_mass=True)


def _sampled(logits: torch.Tensor, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    flat = torch.softmax(logits.reshape(-1, logits.shape[-1]).float(), -1)
    return torch.multinomial(flat, 1, generator=gen).reshape(logits.shape[:-1])


def test_unchanged_policy_has_zero_divergence_at_any_kept_mass():
    logits = _heavy_tailed_logits((4, 12), seed=0)
    sampled = _sampled(logits, seed=1)
    index, logp, mass = _stored(logits, sampled)
    assert float(mass.max()) < 0.95, "the stored support must miss real mass for this test to mean anything"
    kl, tv = sparse_token_divergences(logits, index, logp)
    torch.testing.assert_close(kl, torch.zeros_like(kl), atol=1e-6, rtol=0)
    torch.testing.assert_close(tv, torch.zeros_like(tv), atol=1e-6, rtol=0)
    mask = torch.ones(4, 12)
    logp_tok = torch.log_softmax(logits, -1).gather(-1, sampled[..., None])[..., 0]
    inp = PolicyInputs(
        logp_tok, logp_tok, torch.ones(4, 12), mask, logits=logits, old_topk_index=index.long(), old_topk_logp=logp
    )
    for name in ("trm_max", "trm_avg", "trm_max_avg"):
        out = MASKS.get(name)(inp)
        assert out.seq_mask.tolist() == [1.0] * 4, name
        assert out.metrics["trm/max_kl"] < 1e-6 and out.metrics["trm/accept_rate"] == 1.0, name


@pytest.mark.parametrize("k", [K, 512, V])
def test_changed_policy_estimate_is_a_lower_bound_and_exact_on_the_full_support(k):
    rollout = _heavy_tailed_logits((3, 10), seed=2)
    gen = torch.Generator().manual_seed(3)
    current = rollout + 0.4 * torch.randn(rollout.shape, generator=gen, dtype=torch.float64)
    sampled = _sampled(rollout, seed=4)
    index, logp, _ = _stored(rollout, sampled, k=k)
    kl, tv = sparse_token_divergences(current, index, logp)
    dense_kl, dense_tv = _dense_kl_tv(rollout, current)
    assert torch.all(kl <= dense_kl + 1e-6) and torch.all(tv <= dense_tv + 1e-6)
    assert float(kl.mean()) > 0.05 * float(dense_kl.mean())  # a bound that says something
    if k == V:  # sparsify stops once 1 - 1e-5 of the mass is kept: exact up to that missing mass
        torch.testing.assert_close(kl, dense_kl, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(tv, dense_tv, atol=1e-4, rtol=1e-4)


def test_stored_log_probs_are_exact_up_to_float32_storage():
    """``sparsify`` stores log pi(v) within the float32 rounding of the value itself (2^-24 relative):
    its normaliser must not add a shared offset. A float32 logsumexp of a 49,152-wide row is off by
    ~1e-7 to 1e-6, which the rest mass 1 - sum p inherits (a float64 normaliser fixes it)."""
    gen = torch.Generator().manual_seed(5)
    logits = (torch.randn(64, 49152, generator=gen) * 2.0).float()
    logits[:, :4] += 14.0  # a few dominant tokens: kept mass near 1, where the rest bin is small
    sampled = torch.randint(0, 49152, (64,), generator=gen)
    index, logp = sparsify(logits, sampled, k=K, delta=1e-5, renormalize=False)
    exact = torch.log_softmax(logits.double(), -1).gather(-1, index.long())
    valid = logp > float("-inf")
    error = (logp.double() - exact).abs()[valid]
    assert torch.all(error <= exact.abs()[valid] * 2.0**-24 + 1e-12)


def test_built_in_backend_stores_and_masks_an_unchanged_policy_without_rejections():
    """The built-in trainer's old pass and its PolicyLoss (TRM-Max) on a V = 4096 tiny model."""
    from runners.algorithms.method import Method
    from runners.algorithms.policy_loss import PolicyLoss
    from runners.backends.local.actor import micro_batch_loss, old_pass
    from runners.models.tiny import build_tiny_model
    from tests.backends._batch import rollout_batch

    model = build_tiny_model("qwen2", vocab_size=V, seed=0, num_hidden_layers=2)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (4, 14), generator=gen)
    batch = rollout_batch(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        responses=ids[:, 6:],
        group_index=torch.tensor([0, 0, 1, 1]),
        context_length=6,
    )

    def forward(b, rows):
        return model(input_ids=b.input_ids[rows], attention_mask=b.attention_mask[rows]).logits[:, 5:-1].float()

    method = Method.from_params(objective="clip", mask="trm_max", mask_params={"delta": 0.05, "top_k": K})
    old = old_pass(forward, batch, method=method, micro_batch_size=0, precision="fp32")
    mass = old.old_topk_logp.double().exp().sum(-1)
    assert float(mass.min()) < 0.9  # a random model with V = 4096: top-64 keeps little
    batch.rollout_logp = old.old_logp
    mask = torch.ones(4, 8)
    out = micro_batch_loss(
        PolicyLoss(method),
        forward(batch, slice(None)),
        batch,
        old,
        torch.randn(4, 8),
        mask,
        torch.arange(4),
        num_tokens=mask.sum(),
        num_seqs=torch.tensor(4),
    )
    assert out.seq_mask.tolist() == [1.0] * 4
    assert out.metrics["trm/max_kl"] < 1e-5 and out.metrics["trm/mean_kl"] < 1e-5


@pytest.mark.slow
def test_real_model_distributions():
    """SmolLM2-135M (V = 49,152): unchanged -> 0; a sharper or flatter current policy -> at most the dense
    values. Also from float32 logits, what the trainers pass: with float32 normalisers (in ``sparsify``
    and in the divergence) the estimate exceeded the dense KL by up to ~8e-5 where the rest mass is
    ~1e-5 (an offset of ~1e-6 in every log-prob moves 1 - sum p by as much). The 1e-6 allowed is the
    float32 rounding of the stored log-probs (2^-24 relative: TV moves by ~5e-8 here)."""
    from runners.models.loader import load_model

    model, tokenizer = load_model("smollm2")
    ids = torch.tensor([tokenizer.encode("Question: what is 17 + 25? Answer: the sum of 17 and 25 is 42.")])
    with torch.no_grad():
        logits32 = model(input_ids=ids).logits[0, :-1].float()  # [T, V]
    sampled = ids[0, 1:]
    for logits in (logits32.double(), logits32):
        index, logp, mass = _stored(logits, sampled)
        assert float((mass < 0.95).float().mean()) > 0.0  # the heavy tail the defect needed
        assert float(mass.max()) > 0.9999  # and near-complete supports, where the rest bin is tiny
        kl, tv = sparse_token_divergences(logits, index, logp)
        assert float(kl.abs().max()) < 1e-6 and float(tv.max()) < 1e-6, logits.dtype
        for temperature in (0.8, 1.25):  # a sharper and a flatter policy
            current = logits / temperature
            kl, tv = sparse_token_divergences(current, index, logp)
            dense_kl, dense_tv = _dense_kl_tv(logits, current)
            assert torch.all(kl <= dense_kl + 1e-6) and torch.all(tv <= dense_tv + 1e-6), (logits.dtype, temperature)
            assert float(kl.sum()) > 0.5 * float(dense_kl.sum())
