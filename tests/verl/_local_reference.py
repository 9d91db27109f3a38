"""The built-in trainer's actor update as the reference of the verl plugin tests.

``local_update`` runs the built-in trainer's real update (``runners.backends.local.actor.update_actor``)
on a "model" that returns given logits, with one mini-batch, one micro-batch, no gradient clipping
and a zero learning rate: it returns the loss the trainer logs and the gradient it leaves on the
logits (or on the parameters of a model the forward uses). ``problem`` builds a random batch: B
responses in prompt groups, right-padded, old and current logits over a small vocabulary, GRPO
advantages, the sparse old distribution as ``actor.old_pass`` stores it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor

from runners import metric_names
from runners.algorithms import ENTROPY_CONTROLLERS, ESTIMATORS
from runners.algorithms.numerics import token_logprobs
from runners.algorithms.troll_sparse import sparsify
from runners.algorithms.types import AdvantageInputs

TRAINER_KEYS = ("top_k", "tail_mass", "h_ini_prompts")


@dataclass
class Method:
    """One trustbench method configuration (what the built-in trainer reads from its config)."""

    objective: str = "clip"
    objective_params: dict = field(default_factory=dict)
    mask: str = "none"
    mask_params: dict = field(default_factory=dict)
    entropy_control: str = "none"
    entropy_control_params: dict = field(default_factory=dict)
    loss_agg: str = "token-mean"

    @property
    def objective_kw(self) -> dict:
        return {k: v for k, v in self.objective_params.items() if k not in TRAINER_KEYS}

    @property
    def mask_kw(self) -> dict:
        return {k: v for k, v in self.mask_params.items() if k not in TRAINER_KEYS}

    @property
    def sparse(self) -> dict:
        """``sparsify``'s arguments: the size of the stored distribution from the objective or the mask."""
        params = {**self.mask_params, **self.objective_params}
        return {
            "k": params.get("top_k", 64),
            "delta": params.get("tail_mass", 1e-5),
            "p_default": params.get("p_default", 1e-12),
            "chunk_size": params.get("chunk_size", 1024),
        }

    def controller(self, entropies=(1.0, 1.2, 0.9)):
        """The method's controller after a few iterations (so its coefficient left its start value)."""
        ctl = ENTROPY_CONTROLLERS.get(self.entropy_control)(**self.entropy_control_params)
        for value in entropies:
            ctl.update(value)
        return ctl


@dataclass
class Problem:
    logits: Tensor  # [B,T,V] current (float64)
    old_logits: Tensor  # [B,T,V]
    responses: Tensor  # [B,T] long
    mask: Tensor  # [B,T] float64
    groups: Tensor  # [B] long
    uids: np.ndarray  # [B] str
    advantages: Tensor  # [B,T]
    old_logp: Tensor = None
    old_topk_index: Tensor | None = None
    old_topk_logp: Tensor | None = None


def problem(seed: int, *, batch: int = 8, group: int = 4, length: int = 6, vocab: int = 12, sparse: dict | None = None):
    """A random float64 batch; rows drift from the old policy by different amounts (some tokens
    leave a 0.05 trust region, some stay) so masks and projections act on part of the batch."""
    gen = torch.Generator().manual_seed(seed)
    old = 2.0 * torch.randn(batch, length, vocab, generator=gen, dtype=torch.float64)
    drift = torch.linspace(0.05, 1.2, batch, dtype=torch.float64)[torch.randperm(batch, generator=gen)]
    logits = old + drift[:, None, None] * torch.randn(batch, length, vocab, generator=gen, dtype=torch.float64)
    probs = torch.softmax(old, -1).reshape(-1, vocab)
    responses = torch.multinomial(probs.float(), 1, generator=gen).reshape(batch, length)
    lengths = torch.randint(2, length + 1, (batch,), generator=gen)
    lengths[0] = length
    mask = (torch.arange(length)[None, :] < lengths[:, None]).double()
    groups = torch.arange(batch) // group
    scores = torch.randint(0, 2, (batch,), generator=gen).double()
    scores[0], scores[1] = 1.0, 0.0  # every group of the first has both signs (GTPO conflicts)
    rewards = torch.zeros(batch, length, dtype=torch.float64)
    rewards[torch.arange(batch), lengths - 1] = scores
    adv, _ = ESTIMATORS.get("grpo")(AdvantageInputs(rewards, mask, group_index=groups))
    out = Problem(
        logits=logits,
        old_logits=old,
        responses=responses,
        mask=mask,
        groups=groups,
        uids=np.array([f"prompt-{int(g)}" for g in groups], dtype=object),
        advantages=adv.double(),
    )
    out.old_logp = token_logprobs(old, responses)
    if sparse is not None:
        idx, lp = sparsify(
            old.reshape(-1, vocab),
            responses.reshape(-1),
            k=min(int(sparse["k"]), vocab),
            delta=sparse["delta"],
            p_default=sparse["p_default"],
            chunk_size=sparse["chunk_size"],
        )
        out.old_topk_index = idx.reshape(batch, length, -1).long()
        out.old_topk_logp = lp.reshape(batch, length, -1)
    return out


def local_update(
    method: Method,
    prob: Problem,
    controller,
    *,
    h_ini: float | None = None,
    norm_len: float | None = None,
    forward=None,
    model: torch.nn.Module | None = None,
) -> tuple[float, dict[str, Any], torch.nn.Module]:
    """Run the built-in trainer's ``update_actor`` once; returns (logged loss, metrics, the model).

    Without ``forward``/``model`` the model is a module holding ``prob.logits`` as a parameter and
    the gradient is ``model.logits.grad``; otherwise ``forward(rows) -> [rows,T,V]`` gives the
    logits and the gradient lands on ``model``'s parameters.
    """
    actor = pytest.importorskip("runners.backends.local.actor")
    from runners.algorithms.method import Method as LibraryMethod
    from runners.algorithms.policy_loss import PolicyLoss
    from runners.backends.local.step_metrics import acceptance_metrics

    if model is None:
        model = torch.nn.Module()
        model.logits = torch.nn.Parameter(prob.logits.detach().clone())

        def forward(rows):
            return model.logits[rows]

    library_method = LibraryMethod.from_params(
        objective=method.objective,
        objective_params=method.objective_params,
        mask=method.mask,
        mask_params=method.mask_params,
        entropy_control=method.entropy_control,
        entropy_control_params=method.entropy_control_params,
        loss_agg=method.loss_agg,
        norm_len=norm_len,
    )
    settings = actor.UpdateSettings(
        ppo_epochs=1, mini_batch_share=1.0, micro_batch_size=0, grad_clip=0.0, logprob_precision="fp32"
    )
    from tests.backends._batch import rollout_batch

    old = actor.OldPass(old_logp=prob.old_logp, old_topk_index=prob.old_topk_index, old_topk_logp=prob.old_topk_logp)
    # on-policy: the sampler's log-probs are the old policy's
    batch = rollout_batch(responses=prob.responses, group_index=prob.groups, rollout_logp=prob.old_logp)
    metrics, seq_masks = actor.update_actor(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        lambda _b, rows: forward(rows),
        PolicyLoss(library_method, controller),
        batch,
        old,
        prob.advantages,
        prob.mask,
        settings=settings,
        shuffle=torch.Generator().manual_seed(0),
        h_ini=h_ini,
    )
    metrics.update(acceptance_metrics(SimpleNamespace(response_mask=prob.mask), seq_masks, [0, 2, 4, 8, 16]))
    return metrics[metric_names.PG_LOSS], metrics, model
