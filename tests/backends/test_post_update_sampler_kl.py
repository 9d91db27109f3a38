"""The post-update KL from the sampling policy, against a dense float64 KL written here.

With stale rollouts (or a lower-precision sampler) the sampling policy is a separate copy of the model,
and TROLL's projection is centred on it (TROLL, arXiv 2510.03817, section 3.1: the region around the
policy the tokens were drawn from), not on pi_old of the old-log-prob pass. The old pass then stores the
sampler's top-K for every method (``sampler_topk_*``), so Clip's runs can be measured against the same
centre, and ``post_update_metrics`` logs ``actor/post_update_kl_sampler*`` beside the pi_old statistics.
Here V = 16 is below the default K = 64, so the stored top-K covers the vocabulary up to the 1e-5 tail and
the coarse KL is the exact one within 1e-5.
"""

from __future__ import annotations

import pytest
import torch

from runners import metric_names as names
from runners.algorithms.method import Method
from runners.backends.local.actor import old_pass
from runners.backends.local.diagnostics import post_update_metrics

from ._batch import rollout_batch

B, T, V = 6, 5, 16


def _case():
    g = torch.Generator().manual_seed(3)
    sampler = torch.randn(B, T, V, generator=g) * 2.0
    old = sampler + 0.4 * torch.randn(B, T, V, generator=g)  # pi_old: the sampler's weights one update later
    new = old + 0.3 * torch.randn(B, T, V, generator=g)
    responses = torch.randint(0, V, (B, T), generator=g)
    mask = torch.ones(B, T)
    mask[0, 3:] = 0  # a short response: its padding is not counted
    data = rollout_batch(input_ids=torch.zeros(B, 1), responses=responses, response_mask=mask, group_index=None)
    return sampler, old, new, data


def _forward(logits: torch.Tensor):
    return lambda d, rows: logits[rows]


def _dense_kl(new: torch.Tensor, centre: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """KL(q || p) = sum_v q_v (log q_v - log p_v) per real token, float64."""
    logq, logp = torch.log_softmax(new.double(), -1), torch.log_softmax(centre.double(), -1)
    return (logq.exp() * (logq - logp)).sum(-1)[mask > 0]


def _metrics(objective: str, stale: bool):
    sampler, old_logits, new, data = _case()
    method = Method.from_params(objective=objective, objective_params={})
    old = old_pass(
        _forward(old_logits),
        data,
        method=method,
        micro_batch_size=4,
        precision="fp32",
        rollout_forward=_forward(sampler) if stale else None,
        diagnostics=True,
    )
    metrics = post_update_metrics(_forward(new), data, old, torch.zeros(B, T), chunk=4, precision="fp32")
    return old, metrics


@pytest.mark.parametrize("objective", ["clip", "troll"])
def test_the_kl_from_the_sampler_is_the_dense_kl_from_the_sampler(objective):
    sampler, old_logits, new, data = _case()
    old, metrics = _metrics(objective, stale=True)
    for centre, mean_name, max_name, sampler_names in (
        (sampler, names.POST_UPDATE_KL_SAMPLER, names.POST_UPDATE_KL_SAMPLER_MAX, True),
        (old_logits, names.POST_UPDATE_KL, names.POST_UPDATE_KL_MAX, False),
    ):
        kl = _dense_kl(new, centre, data.response_mask)
        assert metrics[mean_name] == pytest.approx(float(kl.mean()), abs=1e-5)
        assert metrics[max_name] == pytest.approx(float(kl.max()), abs=1e-5)
        shares = [
            metrics[names.post_update_kl_frac_above(e, sampler=sampler_names)] for e in names.POST_UPDATE_KL_THRESHOLDS
        ]
        assert shares == [float((kl > e).double().mean()) for e in names.POST_UPDATE_KL_THRESHOLDS]
        assert 0.0 < shares[0] and shares[-1] < 1.0  # the thresholds split the tokens: the shares can be wrong
    # the two centres are two policies: the statistics differ
    assert abs(metrics[names.POST_UPDATE_KL_SAMPLER] - metrics[names.POST_UPDATE_KL]) > 0.01
    if objective == "troll":  # TROLL's own store is the sampler's: the diagnostic reads the same one
        assert torch.equal(old.old_topk_index, old.sampler_topk_index)
        assert torch.equal(old.old_topk_logp, old.sampler_topk_logp)
    else:
        assert old.old_topk_index is None


@pytest.mark.parametrize("objective", ["clip", "troll"])
def test_on_policy_there_is_one_centre_and_no_sampler_statistic(objective):
    old, metrics = _metrics(objective, stale=False)
    assert old.sampler_topk_index is None
    assert names.POST_UPDATE_KL in metrics
    assert not any(k.startswith(names.POST_UPDATE_KL_SAMPLER) for k in metrics)


def test_without_diagnostics_clip_runs_no_sampler_forward():
    sampler, old_logits, _new, data = _case()
    calls = []

    def sampler_forward(d, rows):
        calls.append(rows)
        return sampler[rows]

    method = Method.from_params(objective="clip", objective_params={})
    old = old_pass(
        _forward(old_logits), data, method=method, micro_batch_size=4, precision="fp32", rollout_forward=sampler_forward
    )
    assert calls == [] and old.sampler_topk_index is None
