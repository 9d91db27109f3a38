"""verl's training-inference mismatch diagnostics and corrections, checked against verl 0.9.1's own
``rollout_corr_helper`` on random log-probs (B sequences of mixed lengths, drifts from tiny to large)."""

from __future__ import annotations

import pytest
import torch

from runners.algorithms import ROLLOUT_CORRECTIONS
from runners.algorithms.rollout_correction import offpolicy_metrics

helper = pytest.importorskip("verl.trainer.ppo.rollout_corr_helper")


def _batch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(8, 11, generator=gen, dtype=torch.float64) * 4
    drift = torch.linspace(0.01, 1.5, 8, dtype=torch.float64)[:, None]
    rollout = old + drift * torch.randn(8, 11, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([11, 9, 3, 7, 11, 5, 2, 8])
    mask = (torch.arange(11)[None] < lengths[:, None]).double()
    return old, rollout, mask


def test_offpolicy_metrics_equal_verls():
    old, rollout, mask = _batch()
    ours = offpolicy_metrics(old, rollout, mask)
    theirs = helper.compute_offpolicy_metrics(old, rollout, mask)
    assert set(ours) <= set(theirs)
    for key, value in ours.items():  # verl's masked means add 1e-8 to the denominator
        assert value == pytest.approx(theirs[key], rel=1e-7, abs=1e-12), key


def test_token_tis_equals_verls_weights_and_metrics():
    old, rollout, mask = _batch(1)
    out = ROLLOUT_CORRECTIONS.get("token_tis")(old, rollout, mask, cap=2.0)
    weights, metrics = helper.compute_rollout_correction_weights(old - rollout, mask, "token", 2.0)
    torch.testing.assert_close(out.is_weights, weights)
    assert torch.equal(out.response_mask, mask)  # weights only
    for key, value in out.metrics.items():
        assert value == pytest.approx(metrics[key], rel=1e-7, abs=1e-12), key
    assert 0 < out.metrics["rollout_is_ratio_fraction_high"] < 1  # the cap binds on part of the tokens


@pytest.mark.parametrize("name", ["seq_max_k2", "seq_max_k3"])
def test_sequence_rejection_equals_verls_mask(name):
    old, rollout, mask = _batch(2)
    out = ROLLOUT_CORRECTIONS.get(name)(old, rollout, mask, threshold=0.1)
    theirs_mask, metrics = helper.compute_rollout_rejection_mask(old - rollout, mask, name, "0.1")
    assert torch.equal(out.response_mask, theirs_mask.to(out.response_mask.dtype))
    assert out.is_weights is None
    for key, value in out.metrics.items():
        assert value == pytest.approx(metrics[key], rel=1e-7, abs=1e-12), key
    kept = out.response_mask.sum(-1) > 0
    assert 0 < float(kept.double().mean()) < 1  # rejects some sequences, keeps others


def test_no_correction_and_identical_policies():
    old, _, mask = _batch(3)
    out = ROLLOUT_CORRECTIONS.get("none")(old, old, mask)
    assert out.is_weights is None and torch.equal(out.response_mask, mask)
    metrics = offpolicy_metrics(old, old, mask)
    assert metrics["kl"] == 0 and metrics["k3_kl"] == 0 and metrics["chi2_token"] == pytest.approx(0, abs=1e-12)
    assert metrics["log_ppl_abs_diff"] == 0
    tis = ROLLOUT_CORRECTIONS.get("token_tis")(old, old, mask)
    torch.testing.assert_close(tis.is_weights, mask)
