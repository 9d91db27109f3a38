"""GTPO and the entropy controllers on the verl path, against the references written from the papers in
``tests/algorithms/test_ref_gtpo.py`` (GTPO, arXiv 2508.03772) and ``tests/algorithms/test_ref_entropy_control.py``
(Entropy-preserving RL, arXiv 2603.11682), not against the built-in trainer.

- ``trustbench_gtpo`` looked up in verl's registry (``get_policy_loss_fn``) and called with verl's signature
  and an ``ActorConfig``: loss and gradient w.r.t. the logits against eq. 7 (both weight combinations) and
  the authors' advantage-shift form, with the entropy filter on and off; with verl's global sequence count;
  and with H_ini measured by the driver's ``IterationControl`` on a first batch (GTPO section 5.2: the
  initial model's entropy on the first training prompts) and carried to the loss in the batch's runtime.
- ``trustbench_clip`` with ``entropy_control`` REPO-R / REPO-D / ADAPO / bonus: the driver's
  ``IterationControl`` observes each iteration's entropies (token mean over the response mask), its
  coefficient follows the paper's rule, and the loss verl calls with that iteration's runtime state equals
  the reference loss at the reference coefficient, gradient included, at every iteration.

Run: ``pytest tests/verl/test_ref_gtpo_entropy_verl.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.algorithms.test_ref_entropy_control import (
    LENGTHS,
    METRIC,
    PARAMS,
    SIGNS,
    TARGET,
    assert_trajectory_acts,
    make_control_case,
    objective_params_for,
    ref_coefficients,
    reference_loss,
)
from tests.algorithms.test_ref_entropy_control import TOL as CONTROL_TOL
from tests.algorithms.test_ref_gtpo import (
    FORMS,
    GAMMA,
    LN2,
    make_gtpo_case,
    ref_gtpo_on_logits,
    ref_mean_entropies,
    ref_token_entropy,
    ref_token_logp,
)
from tests.algorithms.test_ref_gtpo import TOL as GTPO_TOL

pytestmark = pytest.mark.verl

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")


def _policy_loss(loss_mode, objective_params, entropy_control="none", entropy_control_params=None):
    return {
        "loss_mode": loss_mode,
        "objective_params": dict(objective_params),
        "entropy_control": entropy_control,
        "entropy_control_params": dict(entropy_control_params or {}),
    }


def _actor_config(policy_loss, loss_agg, global_info=None):
    from verl.workers.config.actor import ActorConfig

    from runners.backends.verl.plugins.config import TrustbenchPolicyLossConfig

    config = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        loss_agg_mode=loss_agg,
        policy_loss=TrustbenchPolicyLossConfig(**policy_loss),
    )
    config.global_batch_info.update(global_info or {})
    return config


def _verl_loss(
    policy_loss, loss_agg, logits, responses, old_logp, advantages, mask, *, uids=None, runtime=None, info=None
):
    """The registered verl loss of ``policy_loss`` called as verl's ppo_loss does; (loss, d loss / d logits)."""
    from runners.backends.verl.plugins import register  # noqa: F401  (registers the trustbench losses)
    from runners.backends.verl.plugins.losses import TrustbenchInputs

    logits = logits.detach().clone().requires_grad_(True)
    inputs = TrustbenchInputs(
        responses=responses,
        group_index=None if uids is None else np.array(uids, dtype=object),
        entropy=ref_token_entropy(logits),
        runtime=dict(runtime or {}),
    )
    loss, _ = core_algos.get_policy_loss_fn(policy_loss["loss_mode"])(
        old_logp,
        ref_token_logp(logits, responses),
        advantages,
        mask,
        loss_agg,
        _actor_config(policy_loss, loss_agg, info),
        None,
        inputs=inputs,
    )
    (grad,) = torch.autograd.grad(loss, logits)
    return loss.detach(), grad


def _gtpo_policy_loss(entropy_term="penalty", combine="or", h_ini_prompts=100):
    params = {"gamma": GAMMA, "combine": combine, "entropy_term": entropy_term, "h_ini_prompts": h_ini_prompts}
    return _policy_loss("trustbench_gtpo", params)


def _gtpo_verl(case, policy_loss, runtime, info=None):
    return _verl_loss(
        policy_loss,
        "seq-mean-token-mean",
        case.logits,
        case.responses,
        case.old_logp,
        case.advantages,
        case.mask,
        uids=case.uids,
        runtime=runtime,
        info=info,
    )


# -- GTPO -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("h_ini", [0.5, 1.0])
@pytest.mark.parametrize(("entropy_term", "combine"), FORMS)
def test_trustbench_gtpo_matches_reference(entropy_term, combine, h_ini):
    case = make_gtpo_case()
    loss, grad = _gtpo_verl(case, _gtpo_policy_loss(entropy_term, combine), {"h_ini": h_ini})
    ref_loss, ref_grad = ref_gtpo_on_logits(case, h_ini, entropy_term=entropy_term, combine=combine)
    torch.testing.assert_close(loss, ref_loss, **GTPO_TOL)
    torch.testing.assert_close(grad, ref_grad, **GTPO_TOL)


def test_trustbench_gtpo_with_verl_global_sequence_count():
    """With verl's global batch info the per-completion losses are summed and divided by the global number
    of sequences per data-parallel rank (here twice this micro-batch's): half the reference."""
    case = make_gtpo_case()
    n = len(case.rows)
    info = {"dp_size": 2, "global_batch_size": 4 * n}
    loss, grad = _gtpo_verl(case, _gtpo_policy_loss(), {"h_ini": 0.5}, info)
    ref_loss, ref_grad = ref_gtpo_on_logits(case, 0.5)
    torch.testing.assert_close(loss, ref_loss / 2, **GTPO_TOL)
    torch.testing.assert_close(grad, ref_grad / 2, **GTPO_TOL)


def ref_initial_entropy(entropy, lengths, uids, prompts):
    """H_ini (GTPO, arXiv 2508.03772, section 5.2 and section 6: the initial model's entropy on the first
    training prompts): the mean over the completions of the first ``prompts`` prompt groups (in batch order)
    of their mean token entropy <H>_i, the statistic eq. 6 compares with ln 2."""
    first = []
    for uid in uids:
        if uid not in first:
            first.append(uid)
    chosen = set(first[:prompts])
    means = [
        sum(float(entropy[i, t]) for t in range(n)) / n
        for i, (n, uid) in enumerate(zip(lengths, uids))
        if uid in chosen
    ]
    return sum(means) / len(means)


def test_h_ini_measured_by_the_driver_reaches_the_loss():
    """IterationControl measures H_ini on the first batch's first two prompt groups (rows shuffled, so the
    first groups in batch order are not the first ids), H_ini < ln 2 switches the filter on, and the loss
    verl computes with the runtime the driver attaches equals the reference at the reference H_ini."""
    from runners.backends.verl.plugins.config import loss_settings
    from runners.backends.verl.plugins.controllers import IterationControl

    case = make_gtpo_case()
    policy_loss = _gtpo_policy_loss(h_ini_prompts=2)
    control = IterationControl(loss_settings(policy_loss))
    order = torch.randperm(len(case.rows), generator=torch.Generator().manual_seed(1))
    first_entropy = 0.5 * ref_token_entropy(case.logits)[order]  # the initial model: lower entropies
    first_uids = [case.uids[i] for i in order.tolist()]
    first_lengths = [len(case.rows[i]) for i in order.tolist()]
    control.observe(first_entropy, case.mask[order], first_uids)
    want = ref_initial_entropy(first_entropy, first_lengths, first_uids, 2)
    assert control.h_ini == pytest.approx(want, rel=1e-12)
    assert want < LN2 and first_uids[0] != case.uids[0]
    assert want != pytest.approx(ref_initial_entropy(first_entropy, first_lengths, first_uids, 4), rel=1e-3)

    loss, grad = _gtpo_verl(case, policy_loss, control.runtime())
    ref_loss, ref_grad = ref_gtpo_on_logits(case, want)
    torch.testing.assert_close(loss, ref_loss, **GTPO_TOL)
    torch.testing.assert_close(grad, ref_grad, **GTPO_TOL)
    means = ref_mean_entropies(ref_token_entropy(case.logits), case.rows)
    assert 0 < sum(m > LN2 for m in means) < len(means)  # the filter drops some completions, keeps others


# -- entropy controllers ---------------------------------------------------------------------------------
def _iteration_entropies(control, mask, seed=0):
    """Per iteration an entropy tensor [B,T] whose token mean lies above / below / at the first one's as
    SIGNS says (the 'at' iterations reuse the first tensor, so their mean equals the target exactly)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for k, sign in enumerate(SIGNS[control]):
        if sign == 0 and out:
            out.append(out[0])
            continue
        level = TARGET + sign * (0.05 + 0.01 * k)
        out.append(level * (1 + 0.4 * (torch.rand(mask.shape, generator=gen, dtype=torch.float64) - 0.5)))
    return out


def _token_mean(entropy, lengths):
    values = [float(entropy[i, t]) for i, n in enumerate(lengths) for t in range(n)]
    return sum(values) / len(values)


@pytest.mark.parametrize("control", sorted(SIGNS))
def test_trustbench_clip_with_entropy_control_follows_reference(control):
    from runners.backends.verl.plugins.config import loss_settings
    from runners.backends.verl.plugins.controllers import IterationControl

    case = make_control_case()
    policy_loss = _policy_loss("trustbench_clip", objective_params_for(control), control, PARAMS[control])
    driver = IterationControl(loss_settings(policy_loss))
    observed = _iteration_entropies(control, case.mask)
    means = [_token_mean(e, LENGTHS) for e in observed]
    signs = [(m > means[0]) - (m < means[0]) for m in means]
    assert signs == SIGNS[control]
    coefs = ref_coefficients(control, means)
    assert_trajectory_acts(control, coefs)
    for step, (entropy, coef) in enumerate(zip(observed, coefs)):
        metrics = driver.observe(entropy, case.mask)
        assert metrics[METRIC[control]] == pytest.approx(coef, rel=1e-12, abs=0), step
        loss, grad = _verl_loss(
            policy_loss,
            "token-mean",
            case.logits,
            case.responses,
            case.old_logp,
            case.advantages,
            case.mask,
            runtime=driver.runtime(),
        )
        ref_loss, ref_grad = reference_loss(case, control, coef)
        torch.testing.assert_close(loss, ref_loss.detach(), **CONTROL_TOL, msg=lambda m, s=step: f"step {s}: {m}")
        torch.testing.assert_close(grad, ref_grad, **CONTROL_TOL, msg=lambda m, s=step: f"step {s}: {m}")
