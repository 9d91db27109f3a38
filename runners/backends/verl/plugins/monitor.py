"""Per-iteration diagnostics the built-in trainer logs for every method, computed inside verl's trainer.

Design: the built-in trainer logs, whatever the method, the entropy-mechanism covariance
(``entropy/cov``, Entropy-preserving RL, arXiv 2603.11682, section 3, Corollary 1: old log-probs
against advantages) and the TRM monitor of the rollout/training mismatch (``trm/accept_rate``,
``trm/max_kl``, ``trm/mean_kl``, ``trm/ppl_gap``, acceptance by response length; with ``mask=none``
every sequence is kept). In verl
the trustbench policy losses already log the TRM set (``PolicyLoss`` calls the mask, ``none``
included); verl's built-in losses do not. ``iteration_metrics`` computes, once per iteration after
the advantages, ``entropy/cov`` always and the TRM monitor when the loss is one of verl's own, with
the same ``runners.algorithms`` functions, so a verl run carries the built-in backend's metric names.

The TRM monitor compares the old-log-prob pass (the policy before this iteration's update) with the
rollout engine's log-probs: the built-in trainer measures the current policy in its update pass,
which is the same policy on its first mini-batch, so the two agree whenever an iteration is one
mini-batch and one epoch (the default) and differ by the update in between otherwise.

    metrics.update(iteration_metrics(old_logp, advantages, mask, rollout_logp, builtin_loss=True,
                                     length_edges=[0, 8, 16, 32]))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from runners import metric_names

if TYPE_CHECKING:  # the translation imports MONITOR_KEY without torch
    from torch import Tensor

    from runners.algorithms.method import Method

# key under trainer.v1 with the monitor's settings (the cell's trainer.length_buckets)
MONITOR_KEY = "trustbench_monitor"


def monitor_settings(cfg: Any, method: Method) -> dict[str, Any]:
    """The trainer's diagnostics settings of a cell (``trainer.v1.trustbench_monitor``): the TRM monitor's
    length buckets; whether to run the post-update pass, and the sparse settings of pi_old's top-K."""
    return {
        "length_edges": [int(e) for e in cfg.trainer.length_buckets],
        "post_update": bool(cfg.trainer.get("post_update_diagnostics", False)),
        "sparse": dict(method.sparse),
    }


def iteration_metrics(
    old_logp: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    rollout_logp: Tensor | None,
    *,
    builtin_loss: bool,
    length_edges: Sequence[int],
) -> dict[str, float]:
    """``entropy/cov`` and, for verl's built-in losses, the TRM monitor; tensors [B,T] of real rows."""
    import torch

    from runners.algorithms.entropy import entropy_covariance

    mask = response_mask.to(old_logp.dtype)
    out = {metric_names.ENTROPY_COV: float(entropy_covariance(old_logp, advantages, mask))}
    if builtin_loss:
        from runners.algorithms.trm import compute_trm_metrics
        from runners.algorithms.types import PolicyInputs

        inp = PolicyInputs(
            logp=old_logp,
            old_logp=old_logp,
            advantages=advantages,
            response_mask=mask,
            rollout_logp=rollout_logp,
        )
        keep = torch.ones(old_logp.shape[0], dtype=torch.bool, device=old_logp.device)
        out.update(compute_trm_metrics(inp, keep, length_edges=list(length_edges)))
    return out


__all__ = ["MONITOR_KEY", "iteration_metrics", "monitor_settings"]
