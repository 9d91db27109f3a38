"""CISPO (MiniMax-M1, arXiv 2506.13585, sec. 3.1) on what mutation testing showed the other tests leave open:
the defaults (clip_ratio_low = 1, clip_ratio_high = 0.28, the conf/objective/cispo.yaml preset), the float32
loss matrix for float64 inputs, the ``actor/ppo_kl`` metric and the refusal of invalid parameters.

Reference: ``ref_cispo`` of ``test_ref_objectives`` (a float64 loop over tokens written from the paper).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from runners import metric_names
from runners.algorithms import OBJECTIVES
from runners.algorithms.cispo import cispo_objective
from runners.algorithms.types import PolicyInputs

from .test_ref_objectives import RTOL, ref_cispo, token_batch


def _inputs(batch, dtype=torch.float64):
    logp, old_logp, adv, mask = batch.tensors()
    logp = logp.detach().to(dtype).requires_grad_(True)
    return logp, PolicyInputs(logp, old_logp.to(dtype), adv.to(dtype), mask)


def test_defaults_are_the_paper_bounds_and_the_loss_is_float32():
    """Called without parameters: weights clipped at 1.28 from above only (r down to 0.2 keeps its weight);
    float64 inputs still give a float32 loss matrix; the gradient is -w A on every token."""
    batch = token_batch(5)
    real = batch.mask > 0
    r = np.exp(batch.logp - batch.old_logp)
    assert (real & (r > 1.28)).any() and (real & (r < 0.5)).any()
    assert np.abs(r[real] - 1.28).min() > 1e-4
    logp, inp = _inputs(batch)
    out = cispo_objective(inp)
    assert out.loss_mat.dtype == torch.float32
    ref_loss, ref_dloss, clipped = ref_cispo(
        batch.logp, batch.old_logp, batch.adv, batch.mask, clip_ratio_low=1.0, clip_ratio_high=0.28
    )
    np.testing.assert_allclose(out.loss_mat.detach().double().numpy()[real], ref_loss[real], rtol=RTOL, atol=1e-6)
    (out.loss_mat * inp.response_mask).sum().backward()
    np.testing.assert_allclose(logp.grad.numpy()[real], ref_dloss[real], rtol=RTOL, atol=1e-6)
    assert out.metrics[metric_names.PG_CLIPFRAC] == pytest.approx(clipped[real].mean(), abs=1e-7)
    assert 0 < clipped[real].mean() < 1


def test_ppo_kl_is_the_masked_mean_of_old_minus_new_log_probs():
    """``actor/ppo_kl`` = mean over real tokens of log pi_old - log pi (verl's ppo_kl); padding, here with
    log-ratios of +5, is left out."""
    batch = token_batch(7)
    shift = np.where(batch.mask > 0, 0.25, 5.0)
    batch = replace(batch, logp=batch.logp + shift)
    _, inp = _inputs(batch)
    out = OBJECTIVES.get("cispo")(inp, clip_ratio_low=0.2, clip_ratio_high=0.28)
    real = batch.mask > 0
    expected = float(np.mean((batch.old_logp - batch.logp)[real]))
    assert expected < -0.2
    assert out.metrics[metric_names.PPO_KL] == pytest.approx(expected, rel=1e-5)


def test_float32_inputs_give_the_same_loss_as_float64():
    batch = token_batch(5)
    _, inp64 = _inputs(batch)
    _, inp32 = _inputs(batch, torch.float32)
    out64, out32 = cispo_objective(inp64), cispo_objective(inp32)
    assert out32.loss_mat.dtype == out64.loss_mat.dtype == torch.float32
    torch.testing.assert_close(out32.loss_mat, out64.loss_mat, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"clip_ratio_low": 1.5}, "clip_ratio_low"),
        ({"clip_ratio_low": 0.0}, "clip_ratio_low"),
        ({"clip_ratio_high": -0.1}, "clip_ratio_high"),
        ({"clip_ratio_high": 0.0}, "clip_ratio_high"),
    ],
)
def test_invalid_parameters_name_the_objective_and_the_key(params, field):
    _, inp = _inputs(token_batch(5))
    with pytest.raises(ValueError, match=rf"objective 'cispo'.*{field}|{field}.*objective 'cispo'"):
        cispo_objective(inp, **params)
