"""Why verl's fused kernels stay off in the generated overrides (docs/clusters.md): their numbers.

verl 0.9.1's ``FusedLinearForPPO`` (torch implementation; ``actor_rollout_ref.model.use_fused_kernels``)
computes the sampled tokens' log-probs and the entropy from the hidden states chunk by chunk, as
``runners.algorithms.chunked_head`` does. Both are held against float64 arithmetic on the same float32
logits at V = 151,936 on peaked rows: the log-probs agree with trustbench's, the entropy does not.
"""

from __future__ import annotations

import pytest
import torch

from runners.algorithms.chunked_head import chunked_head

fused = pytest.importorskip("verl.utils.experimental.torch_functional")


def test_fused_log_probs_agree_and_the_entropy_does_not():
    vocab, hidden, rows = 151936, 64, 64
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(vocab, hidden, generator=g) * 0.05
    heads = torch.randint(0, vocab, (rows,), generator=g)
    h = torch.randn(rows, hidden, generator=g) + 120 * weight[heads] / weight[heads].norm(dim=-1, keepdim=True)
    tokens = torch.where(torch.rand(rows, generator=g) < 0.5, heads, torch.randint(0, vocab, (rows,), generator=g))
    z = (h @ weight.T).double()  # the float32 logits both compute, then exact arithmetic
    lse = torch.logsumexp(z, -1)
    ref_logp = z.gather(-1, tokens[:, None]).squeeze(-1) - lse
    ref_entropy = lse - (torch.softmax(z, -1) * z).sum(-1)
    assert float(torch.softmax(z, -1).max(-1).values.median()) > 0.999  # peaked rows

    verl_logp, verl_entropy = fused.FusedLinearForPPO(chunk_size=512)(h[None], weight, tokens[None])
    ours = chunked_head(h, weight, tokens, chunk_size=512)  # verl's chunks: the same float32 logits
    assert float((verl_logp[0] - ours.logp).abs().max()) < 1e-6
    assert float((ours.logp.double() - ref_logp).abs().max()) < 1e-5  # the float32 logits' own rounding
    assert float((ours.entropy.double() - ref_entropy).abs().max()) < 1e-6
    assert float((verl_entropy[0].double() - ref_entropy).abs().max()) > 2e-6  # verl's float32 entropy
