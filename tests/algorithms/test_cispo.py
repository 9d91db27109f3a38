"""CISPO (MiniMax-M1, arXiv 2506.13585, eq. 4): the gradient is the clipped, detached weight times the
advantage on every token (no token loses its gradient), and the loss equals verl 0.9.1's own ``cispo``."""

from __future__ import annotations

import pytest
import torch

from runners.algorithms import LOSS_AGGS, OBJECTIVES
from runners.algorithms.types import PolicyInputs


def _batch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    old_logp = -torch.rand(5, 7, generator=gen, dtype=torch.float64) * 3
    logp = (old_logp + torch.randn(5, 7, generator=gen, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    mask = (torch.arange(7) < torch.tensor([7, 5, 3, 6, 2]).unsqueeze(1)).double()
    return logp, old_logp, adv, mask


def test_gradient_is_the_clipped_weight_times_the_advantage_on_every_token():
    logp, old_logp, adv, mask = _batch()
    out = OBJECTIVES.get("cispo")(PolicyInputs(logp, old_logp, adv, mask), clip_ratio_low=0.2, clip_ratio_high=0.28)
    out.loss_mat.sum().backward()
    ratio = (logp.detach() - old_logp).exp()
    weight = ratio.clamp(0.8, 1.28)
    torch.testing.assert_close(logp.grad, (-weight * adv).float().double(), rtol=1e-6, atol=1e-7)
    clipped = (ratio != weight).double()
    assert 0 < float((clipped * mask).sum() / mask.sum()) < 1  # some weights clipped, some not
    assert out.metrics["actor/pg_clipfrac"] == pytest.approx(float((clipped * mask).sum() / mask.sum()))


def test_equals_verls_cispo_loss():
    pytest.importorskip("verl")
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.workers.config.actor import ActorConfig

    logp, old_logp, adv, mask = _batch(seed=1)
    config = ActorConfig(
        strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio_low=0.3, clip_ratio_high=0.2
    )
    theirs_logp = logp.detach().clone().requires_grad_(True)
    theirs, metrics = get_policy_loss_fn("cispo")(old_logp, theirs_logp, adv, mask, "token-mean", config)
    theirs.backward()
    out = OBJECTIVES.get("cispo")(PolicyInputs(logp, old_logp, adv, mask), clip_ratio_low=0.3, clip_ratio_high=0.2)
    ours = LOSS_AGGS.get("token-mean")(out.loss_mat, mask)
    ours.backward()
    assert float(ours.detach()) == pytest.approx(float(theirs.detach()), rel=1e-6)
    torch.testing.assert_close(logp.grad, theirs_logp.grad, rtol=1e-6, atol=1e-9)
    assert out.metrics["actor/pg_clipfrac"] == pytest.approx(metrics["actor/pg_clipfrac"])
