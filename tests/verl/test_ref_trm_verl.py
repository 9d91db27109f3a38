"""TRM sequence masks on the verl path against references written from the paper (TRM, arXiv 2512.23075).

The mask runs inside the ``trustbench_clip`` policy loss, looked up in verl's registry
(``core_algos.get_policy_loss_fn``) and called with verl's signature and an ``ActorConfig`` whose
``policy_loss`` node names the mask and its parameters, as verl's actor does. Expected values come
from the float64 loop references of tests/algorithms/test_ref_trm.py (exact KL over the stored
support plus a rest bin, k2 / k3, LN-TRM's W~, SER; inclusive thresholds; the masked PPO-clip loss
of eq. 50 and its gradient; acceptance and divergence metrics), on the same batches: some sequences
rejected and some kept, both signs of log-ratio and advantage, variable lengths, V = 300 against a
stored top-6 support. With verl's global-batch counts, micro-batches add up to the eq. 50 loss of
the whole batch (N counts the sequences rejected in the other micro-batch).

Run: ``pytest tests/verl/test_ref_trm_verl.py``.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from tests.algorithms.test_ref_trm import (
    CASES,
    CLIP,
    EXACT,
    GRAD_ATOL,
    LENGTH_EDGES,
    OBJ_ATOL,
    OBJ_RTOL,
    Case,
    case_for,
    check_metrics,
    ref_keep,
    ref_logits_grad,
    ref_masked_loss,
    ref_metrics,
)

pytestmark = pytest.mark.verl

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")

from runners.backends.verl.plugins import register  # noqa: E402, F401  (registers the plugins in verl's registry)
from runners.backends.verl.plugins.config import TrustbenchPolicyLossConfig  # noqa: E402
from runners.backends.verl.plugins.losses import TrustbenchInputs  # noqa: E402

LOSS_MODE = "trustbench_clip"


def _actor_config(mask_name: str, params: dict, agg: str, global_info: dict | None = None):
    from verl.workers.config.actor import ActorConfig

    policy_loss = TrustbenchPolicyLossConfig(
        loss_mode=LOSS_MODE,
        objective_params=dict(CLIP),
        mask=mask_name,
        mask_params={**params, "length_edges": list(LENGTH_EDGES), "position_edges": list(LENGTH_EDGES)},
    )
    config = ActorConfig(
        strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, loss_agg_mode=agg, policy_loss=policy_loss
    )
    config.global_batch_info.update(global_info or {})
    return config


def plugin_loss(mask_name: str, params: dict, case: Case, agg: str, global_info: dict | None = None):
    """The plugin through verl's registry: (loss, gradient w.r.t. the logits or log-probs, metrics)."""
    exact = case.logits is not None
    if exact:
        leaf = torch.from_numpy(case.logits.copy()).requires_grad_(True)
        responses = torch.from_numpy(case.responses)
        log_prob = torch.log_softmax(leaf, -1).gather(-1, responses[..., None])[..., 0]
    else:
        leaf = torch.from_numpy(case.logp.copy()).requires_grad_(True)
        log_prob = leaf
    inputs = TrustbenchInputs(
        logits=leaf if exact else None,
        old_topk_index=torch.from_numpy(case.topk_index) if exact else None,
        old_topk_logp=torch.from_numpy(case.topk_logp) if exact else None,
        rollout_logp=None if exact else torch.from_numpy(case.rollout_logp),
    )
    loss_fn = core_algos.get_policy_loss_fn(LOSS_MODE)
    loss, metrics = loss_fn(
        torch.from_numpy(case.old_logp),
        log_prob,
        torch.from_numpy(case.advantages),
        torch.from_numpy(case.mask),
        agg,
        _actor_config(mask_name, params, agg, global_info),
        None,
        inputs=inputs,
    )
    loss.backward()
    return float(loss.detach()), leaf.grad.numpy(), metrics


def _rows(case: Case, rows: slice) -> Case:
    """The sequences ``rows`` of a batch (a micro-batch)."""
    fields = (
        "old_logp",
        "rollout_logp",
        "advantages",
        "mask",
        "logp",
        "logits",
        "responses",
        "topk_index",
        "topk_logp",
    )
    return replace(case, **{f: None if getattr(case, f) is None else getattr(case, f)[rows] for f in fields})


def _reference(mask_name: str, params: dict, case: Case, agg: str) -> tuple[list[float], float, np.ndarray]:
    keep = ref_keep(mask_name, params, case)
    loss, grad = ref_masked_loss(case, keep, "clip", agg)
    if case.logits is not None:
        grad = ref_logits_grad(case, grad)
    return keep, loss, grad


@pytest.mark.parametrize("case_id", list(CASES))
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum"])
def test_plugin_mask_matches_reference(case_id, agg):
    """verl's ``trustbench_clip`` with the mask: eq. 50 loss, gradient and TRM metrics as the reference."""
    mask_name, params = CASES[case_id]
    case = case_for(mask_name)
    keep, ref_loss, ref_grad = _reference(mask_name, params, case, agg)
    assert 0 < sum(keep) < len(keep)
    loss, grad, metrics = plugin_loss(mask_name, params, case, agg)
    assert loss == pytest.approx(ref_loss, rel=OBJ_RTOL, abs=OBJ_ATOL)
    np.testing.assert_allclose(grad, ref_grad, rtol=OBJ_RTOL, atol=GRAD_ATOL * np.abs(ref_grad).max())
    for i, k in enumerate(keep):
        assert (np.abs(grad[i]).sum() == 0) == (k == 0), i
    check_metrics(metrics, ref_metrics(mask_name, keep, case), exact=mask_name in EXACT)


@pytest.mark.parametrize("case_id", ["trm_max_avg", "trm_max_avg_sample", "ser"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum"])
def test_micro_batches_add_up_to_the_batch_loss(case_id, agg):
    """With verl's global-batch counts (one rank: the whole batch's tokens and sequences), the losses
    and gradients of two micro-batches add up to the reference eq. 50 loss of the whole batch: N is
    the whole batch, rejected sequences of either micro-batch included."""
    mask_name, params = CASES[case_id]
    case = case_for(mask_name)
    keep, ref_loss, ref_grad = _reference(mask_name, params, case, agg)
    half = len(keep) // 2
    assert 0 < sum(keep[:half]) < half and 0 < sum(keep[half:]) < len(keep) - half
    info = {"dp_size": 1, "batch_num_tokens": float(case.mask.sum()), "global_batch_size": len(keep)}
    total, grads = 0.0, []
    for rows in (slice(0, half), slice(half, None)):
        loss, grad, _ = plugin_loss(mask_name, params, _rows(case, rows), agg, global_info=info)
        total += loss
        grads.append(grad)
    grad = np.concatenate(grads)
    assert total == pytest.approx(ref_loss, rel=OBJ_RTOL, abs=OBJ_ATOL)
    np.testing.assert_allclose(grad, ref_grad, rtol=OBJ_RTOL, atol=GRAD_ATOL * np.abs(ref_grad).max())
