"""TRM's monitoring from the current log-probs at the stored ids (``PolicyInputs.topk_logp``, what the
chunked update and the verl plugins pass instead of the logits): with a stored sparse rollout
distribution every mask, the sample-based ones and ``none`` included, monitors the exact KL and TV
(``trm/max_kl``, ``trm/mean_kl``, ``trm/tv/pos_*``), and the values equal a dense float64 reference
written here: per token TV = (sum_kept |p - q| + |p_rest - q_rest|) / 2 and KL = sum_kept p log(p/q) +
p_rest log(p_rest/q_rest) over the kept ids plus one rest bin (TRM, arXiv 2512.23075, eq. 8 and 51).
"""

from __future__ import annotations

import pytest
import torch

from runners.algorithms import MASKS
from runners.algorithms.troll_sparse import sparsify
from runners.algorithms.types import PolicyInputs
from tests.algorithms.test_ref_trm import ref_kept_divergences

B, T, V, K = 3, 5, 50, 8


def _inputs(kept_only: bool) -> tuple[PolicyInputs, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    old = torch.randn(B, T, V, generator=g, dtype=torch.float64) * 2
    new = old + 0.4 * torch.randn(B, T, V, generator=g, dtype=torch.float64)
    responses = torch.multinomial(torch.softmax(old, -1).reshape(-1, V), 1, generator=g).reshape(B, T)
    index, logp = sparsify(old.reshape(-1, V).float(), responses.reshape(-1), k=K, delta=1e-3, renormalize=False)
    index, logp = index.reshape(B, T, -1).long(), logp.reshape(B, T, -1)
    lq = torch.log_softmax(new, -1)
    mask = torch.ones(B, T)
    mask[0, -2:] = 0
    fields = dict(topk_logp=lq.gather(-1, index), vocab_size=V) if kept_only else dict(logits=new.float())
    inp = PolicyInputs(
        logp=lq.gather(-1, responses[..., None])[..., 0].float(),
        old_logp=torch.log_softmax(old, -1).gather(-1, responses[..., None])[..., 0].float(),
        advantages=torch.ones(B, T),
        response_mask=mask,
        responses=responses,
        old_topk_index=index,
        old_topk_logp=logp,
        **fields,
    )
    return inp, lq, index, logp


def _reference(lq, index, logp, mask) -> tuple[list[float], list[float]]:
    """Per real token (KL, TV) of the coarse-grained pair (``ref_kept_divergences``, plain float64 loops)."""
    pairs = [
        ref_kept_divergences(lq[b, t, index[b, t]].tolist(), logp[b, t].double().tolist())
        for b in range(B)
        for t in range(T)
        if mask[b, t] > 0
    ]
    return [kl for kl, _ in pairs], [tv for _, tv in pairs]


@pytest.mark.parametrize("mask_name", ["none", "trm_max_k2", "trm_max"])
def test_monitoring_from_kept_logprobs_equals_the_dense_reference(mask_name):
    inp, lq, index, logp = _inputs(kept_only=True)
    out = MASKS.get(mask_name)(inp, **_threshold(mask_name))
    kls, tvs = _reference(lq, index, logp, inp.response_mask)
    assert max(kls) > 1e-3  # the policy moved: the check can fail
    tv_keys = [k for k in out.metrics if k.startswith("trm/tv/pos_")]
    assert tv_keys, f"{mask_name}: no trm/tv/pos_* metric from stored distributions"
    if mask_name != "trm_max_k2":  # the sample-based mask reports its own criterion's max
        assert out.metrics["trm/max_kl"] == pytest.approx(max(kls), rel=1e-6)
    dense, _, _, _ = _inputs(kept_only=False)
    dense_out = MASKS.get(mask_name)(dense, **_threshold(mask_name))
    assert tv_keys[0] == "trm/tv/pos_0_64"  # T = 5: every position is in the first bucket
    # the Adaptive bound's Dbar (eq. 13): per position the mean TV over the B sequences, averaged over
    # the bucket's 64 positions (those past the batch's width count 0)
    assert out.metrics[tv_keys[0]] == pytest.approx(sum(tvs) / B / 64, rel=1e-9)
    # the logits path (float32 logits: their rounding moves the TV by ~1e-7) gives the same figure
    assert out.metrics[tv_keys[0]] == pytest.approx(dense_out.metrics[tv_keys[0]], rel=1e-5)


def _threshold(name: str) -> dict:
    return {"trm_max_k2": {"delta": 0.05}, "trm_max": {"delta": 0.05}}.get(name, {})
