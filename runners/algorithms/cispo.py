"""CISPO: clipped importance-sampling weights on a REINFORCE objective (MiniMax-M1, arXiv 2506.13585, eq. 4).

Where PPO clips the ratio inside a ``min`` (and tokens outside the range lose their gradient), CISPO
keeps every token's gradient and clips only the importance weight, detached:

    objective = sg(clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high)) * A * log pi_theta,   r = pi / pi_old

so a token whose ratio left the range still contributes ``A * grad log pi`` scaled by the clipped
weight. ``clip_ratio_low = 1`` leaves the weight unbounded below, as the paper tunes only the upper
bound. The per-token loss is ``-objective`` [B,T]; aggregate it like any objective. verl 0.9.1 has
the same loss (``loss_mode=cispo``); ``tests/algorithms/test_cispo.py`` checks the two agree.

The objective added to the library as ``README.md``'s "Adding a method" describes: this file, its
registry line, ``conf/objective/cispo.yaml`` and its tests.
"""

from __future__ import annotations

import torch

from runners import metric_names
from runners.algorithms.loss_agg import masked_mean
from runners.algorithms.objectives import check_objective_arguments, log_ratio
from runners.algorithms.types import ObjectiveOutput, PolicyInputs


def cispo_objective(
    inp: PolicyInputs, *, clip_ratio_low: float = 1.0, clip_ratio_high: float = 0.28
) -> ObjectiveOutput:
    """Per-token CISPO loss ``-sg(clip(r)) A log pi`` [B,T] and ``actor/pg_clipfrac`` (weights clipped)."""
    check_objective_arguments("cispo", clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high)
    lr = log_ratio(inp)
    ratio = lr.exp()
    weight = ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high).detach()
    loss = -weight * inp.advantages.to(torch.float32) * inp.logp.to(torch.float32)
    mask = inp.response_mask.to(torch.float32)
    metrics = {
        metric_names.PG_CLIPFRAC: float(masked_mean((ratio != weight).float(), mask)),
        metric_names.PPO_KL: float(masked_mean(-lr.detach(), mask)),
    }
    return ObjectiveOutput(loss_mat=loss, metrics=metrics)


__all__ = ["cispo_objective"]
