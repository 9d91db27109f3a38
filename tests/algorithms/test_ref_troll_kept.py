"""TROLL's sparse loss from the current log-probs at the old kept set (``PolicyInputs.topk_logp``, what
the chunked update passes instead of the logits) against the reference of ``test_ref_troll``: eq. 21's
V-dimensional sparse pair projected in numpy (brentq on the primal constraint), loss values and
finite-difference gradients, where the projection acts on a share of tokens.

``topk_logp`` is built here from a float64 logits leaf (``log_softmax`` over V, gathered at the kept
ids), so the gradient reaches the logits through the whole-vocabulary normalisation too: on the dropped
tokens it must cancel (eq. 21 puts p_d there whatever the logits).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from runners import metric_names
from runners.algorithms import OBJECTIVES
from runners.algorithms.types import PolicyInputs
from tests.algorithms.test_ref_troll import (
    ALPHA,
    EPS,
    P_D,
    _acting_reference,
    _case,
    _peaked_sparse_case,
    _sparse_store,
    check_sparse_gradient,
)


def _kept_objective(new, index, old_logp, responses, adv, mask, *, sequence: bool, p_d: float):
    logits = torch.tensor(new, dtype=torch.float64, requires_grad=True)
    inp = PolicyInputs(
        logp=torch.zeros(mask.shape, dtype=torch.float64),
        old_logp=torch.zeros(mask.shape, dtype=torch.float64),
        advantages=torch.from_numpy(adv),
        response_mask=torch.from_numpy(mask),
        old_topk_index=index,
        old_topk_logp=old_logp,
        responses=torch.from_numpy(responses),
        topk_logp=torch.log_softmax(logits, -1).gather(-1, index),
        vocab_size=new.shape[-1],
    )
    out = OBJECTIVES.get("troll")(inp, eps=EPS, alpha=ALPHA, sequence=sequence, polish_steps=4, p_default=p_d)
    return logits, out


@pytest.mark.parametrize(("sequence", "p_d"), [(False, P_D), (True, P_D), (False, 1e-4)])
def test_loss_and_gradient_from_kept_logprobs_match_the_reference(sequence, p_d):
    case = _peaked_sparse_case()
    old, new, responses, adv, mask, weights, kept, index, logp = case
    options = dict(alpha=ALPHA, sequence=sequence, kept=kept, p_d=p_d)
    ref, projected = _acting_reference(case, options)
    logits, out = _kept_objective(new, index, logp, responses, adv, mask, sequence=sequence, p_d=p_d)
    np.testing.assert_allclose(out.loss_mat.detach().numpy(), ref, rtol=1e-8, atol=1e-9)
    (out.loss_mat * torch.from_numpy(weights)).sum().backward()
    check_sparse_gradient(logits.grad.numpy(), case, options, zero_atol=1e-12)  # the normalisation over V cancels
    assert out.metrics[metric_names.TROLL_PROJECTED_FRAC] == pytest.approx(projected[mask > 0].mean())
    # the kept mass from the kept log-probs alone: sum over S of softmax(new) (TROLL's Definition A.1 set)
    lq = new - np.log(np.exp(new - new.max(-1, keepdims=True)).sum(-1, keepdims=True)) - new.max(-1, keepdims=True)
    masses = [np.exp(lq[b, t, kept[b][t][0]]).sum() for b in range(3) for t in range(4) if mask[b, t] > 0]
    assert out.metrics[metric_names.TROLL_KEPT_MASS] == pytest.approx(np.mean(masses), rel=1e-6)  # float32 logsumexp


def test_missing_vocab_size_or_topk_logp_is_named():
    old, new, responses, adv, mask, _ = _case(3, vocab=20)
    _, index, logp = _sparse_store(old, responses, 4, cover=1 - 1e-3)
    base = dict(
        logp=torch.zeros(mask.shape),
        old_logp=torch.zeros(mask.shape),
        advantages=torch.from_numpy(adv),
        response_mask=torch.from_numpy(mask),
        old_topk_index=index,
        old_topk_logp=logp,
    )
    with pytest.raises(ValueError, match="topk_logp .* and vocab_size"):
        OBJECTIVES.get("troll")(PolicyInputs(**base, topk_logp=logp.clone()), eps=EPS)
    with pytest.raises(ValueError, match="topk_logp .* and vocab_size"):  # vocab_size alone is not enough
        OBJECTIVES.get("troll")(PolicyInputs(**base, vocab_size=20), eps=EPS)
    dense_old = {**base, "old_topk_index": None, "old_topk_logp": torch.log_softmax(torch.zeros(3, 4, 20), -1)}
    with pytest.raises(ValueError, match="with a sparse old_topk_index"):  # no logits and a dense old distribution
        OBJECTIVES.get("troll")(PolicyInputs(**dense_old, topk_logp=logp.clone(), vocab_size=20), eps=EPS)
    with pytest.raises(ValueError, match=r"must all be \[B,T,K\+1\]"):
        OBJECTIVES.get("troll")(PolicyInputs(**base, topk_logp=logp[..., :2], vocab_size=20), eps=EPS)
