"""Post-update diagnostics against a dense computation: the coarse KL(pi_new || pi_old) is exact when the
kept ids cover the vocabulary and a lower bound otherwise, and the logged shares of tokens above each eps
are the shares of the dense per-token KLs above it (numpy)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from runners import metric_names
from runners.algorithms.diagnostics import coarse_reverse_kl, kl_exceedance


def _dense_kl(new_logits: torch.Tensor, old_logits: torch.Tensor) -> np.ndarray:
    q = torch.softmax(new_logits.double(), -1).numpy()
    p = torch.softmax(old_logits.double(), -1).numpy()
    return (q * (np.log(q) - np.log(p))).sum(-1)


def test_coarse_kl_is_exact_on_the_full_vocabulary_and_a_lower_bound_on_top_k():
    g = torch.Generator().manual_seed(0)
    old = torch.randn(64, 12, generator=g, dtype=torch.float64) * 2
    new = old + torch.randn(64, 12, generator=g, dtype=torch.float64) * torch.linspace(0.01, 1.0, 64)[:, None]
    dense = _dense_kl(new, old)
    full = torch.arange(12).expand(64, 12)
    exact = coarse_reverse_kl(new, full, torch.log_softmax(old, -1))
    assert exact.numpy() == pytest.approx(dense, rel=1e-9, abs=1e-12)
    top = torch.topk(old, 4, dim=-1).indices
    coarse = coarse_reverse_kl(new, top, torch.log_softmax(old, -1).gather(-1, top))
    assert (coarse.numpy() <= dense + 1e-12).all() and (coarse.numpy() < dense).any()


def test_kl_exceedance_counts_the_tokens_above_each_eps():
    g = torch.Generator().manual_seed(1)
    old = torch.randn(500, 9, generator=g, dtype=torch.float64)
    new = old + torch.randn(500, 9, generator=g, dtype=torch.float64) * 0.4
    dense = _dense_kl(new, old)
    got = kl_exceedance(coarse_reverse_kl(new, torch.arange(9).expand(500, 9), torch.log_softmax(old, -1)))
    assert set(got) == {metric_names.post_update_kl_frac_above(e) for e in metric_names.POST_UPDATE_KL_THRESHOLDS}
    shares = [got[metric_names.post_update_kl_frac_above(e)] for e in metric_names.POST_UPDATE_KL_THRESHOLDS]
    for eps, share in zip(metric_names.POST_UPDATE_KL_THRESHOLDS, shares):
        assert share == pytest.approx(float((dense > eps).mean()), abs=1e-12)
    assert 0 < shares[-1] < shares[0] < 1 and shares == sorted(shares, reverse=True)
    assert metric_names.post_update_kl_frac_above(0.05) == "actor/post_update_kl_frac_above_0.05"
