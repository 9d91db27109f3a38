"""TROLL's verl plugins (``trustbench_troll``, ``trustbench_troll_seq``), called through verl's
``get_policy_loss_fn`` with verl's signature, against the numpy reference written from the paper
(tests/algorithms/test_ref_troll.py: TROLL, arXiv 2510.03817, eq. 4, 5 and 21), where the
projection acts, with V >> K: the token-mean loss and its gradient w.r.t. the logits.

Run: ``pytest tests/verl/test_ref_troll_verl.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from runners.algorithms.numerics import token_logprobs
from tests.algorithms.test_ref_troll import EPS, _assert_acts, _case, _sparse_store, ref_gradient, ref_loss

pytestmark = pytest.mark.verl

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")

ALPHA = 0.6
P_D = 1e-12


def _config(sequence: bool):
    from verl.workers.config.actor import ActorConfig

    from runners.backends.verl.plugins.config import TrustbenchPolicyLossConfig

    params = {"eps": EPS, "alpha": ALPHA, "p_default": P_D, "polish_steps": 4}
    policy_loss = TrustbenchPolicyLossConfig(loss_mode=_mode(sequence), objective_params=params)
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        loss_agg_mode="token-mean",
        policy_loss=policy_loss,
    )


def _mode(sequence: bool) -> str:
    return "trustbench_troll_seq" if sequence else "trustbench_troll"


@pytest.mark.parametrize("sequence", [False, True], ids=["token", "gspo"])
def test_troll_plugin_matches_the_paper_reference(sequence):
    from runners.backends.verl.plugins import register  # noqa: F401  (registers the plugins)
    from runners.backends.verl.plugins.losses import TrustbenchInputs

    vocab, k = 300, 6
    old, new, responses, adv, mask, _ = _case(31, vocab=vocab, shift=1.2)
    peak = np.array([1.0, 6.0, 1.0, 6.0])[None, :, None]  # some rows need fewer than k tokens
    new, old = old * peak + (new - old), old * peak
    kept, index, logp = _sparse_store(old, responses, k, cover=1 - 1e-3)
    options = dict(alpha=ALPHA, sequence=sequence, kept=kept, p_d=P_D)
    ref, projected = ref_loss(new, old, responses, adv, mask, eps=EPS, **options)
    unprojected, _ = ref_loss(new, old, responses, adv, mask, eps=1e9, **options)
    _assert_acts(projected, mask, ref, unprojected)

    logits = torch.tensor(new, requires_grad=True)
    resp, mask_t = torch.from_numpy(responses), torch.from_numpy(mask)
    inputs = TrustbenchInputs(
        responses=resp, logits=logits, old_topk_index=index, old_topk_logp=logp, runtime={}, group_index=None
    )
    loss_fn = core_algos.get_policy_loss_fn(_mode(sequence))
    old_logp = token_logprobs(torch.from_numpy(old), resp)  # not read by TROLL (it reads the sparse store)
    loss, metrics = loss_fn(
        old_logp,
        token_logprobs(logits, resp),
        torch.from_numpy(adv),
        mask_t,
        "token-mean",
        _config(sequence),
        None,
        inputs=inputs,
    )
    loss.backward()
    weights = mask / mask.sum()  # token-mean over the micro-batch
    assert float(loss.detach()) == pytest.approx(float((ref * weights).sum()), rel=1e-8, abs=1e-10)
    columns = {(b, t): kept[b][t][0].tolist() for b in range(mask.shape[0]) for t in range(mask.shape[1])}
    grad = ref_gradient(new, old, responses, adv, mask, weights, eps=EPS, columns=columns, **options)
    for (b, t), cols in columns.items():
        np.testing.assert_allclose(logits.grad[b, t, cols].numpy(), grad[b, t, cols], rtol=1e-6, atol=1e-9)
    assert metrics["troll/projected_frac"] == pytest.approx(projected[mask > 0].mean())
