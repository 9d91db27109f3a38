"""The built-in trainer's actor update as the reference of the verl plugin tests.

``local_update`` runs the real ``LocalTrainer._update_actor`` (runners/backends/local/trainer.py) on
a stub trainer whose "model" returns given logits, with one mini-batch, one micro-batch, no
gradient clipping and a zero learning rate: it returns the loss the trainer logs and the gradient
it leaves on the logits (or on the parameters of a model the stub's forward uses). ``problem``
builds a random batch: B responses in prompt groups, right-padded, old and current logits over a
small vocabulary, GRPO advantages, the sparse old distribution as ``LocalTrainer._old_pass``
stores it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torch import Tensor

from runners import schema
from runners.algorithms import ENTROPY_CONTROLLERS, ESTIMATORS, LOSS_AGGS, MASKS, OBJECTIVES
from runners.algorithms.numerics import token_logprobs
from runners.algorithms.troll_sparse import sparsify
from runners.algorithms.types import AdvantageInputs

TRAINER_KEYS = ("k", "delta", "h_ini_prompts")
SPARSE_DEFAULTS = {"k": 64, "delta": 1e-5, "p_default": 1e-12, "chunk_size": 1024}


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
    def sparse(self) -> dict:
        return {k: self.objective_params.get(k, v) for k, v in SPARSE_DEFAULTS.items()}

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
    """Run ``LocalTrainer._update_actor`` once; returns (logged loss, metrics, the stub's model).

    Without ``forward``/``model`` the model is a module holding ``prob.logits`` as a parameter and
    the gradient is ``model.logits.grad``; otherwise ``forward(rows) -> [rows,T,V]`` is the stub's
    ``_forward_logits`` and the gradient lands on ``model``'s parameters.
    """
    trainer_mod = pytest.importorskip("runners.backends.local.trainer")
    trainer = object.__new__(trainer_mod.LocalTrainer)
    n_groups = int(prob.groups.max()) + 1
    trainer.cfg = OmegaConf.create(
        {
            "trainer": {
                "ppo_epochs": 1,
                "logprob_precision": "fp32",
                "grad_clip": 0.0,
                "length_buckets": [0, 2, 4, 8, 16],
                "mini_batch_prompts": n_groups,
                "prompts_per_step": n_groups,
                "micro_batch_size": 0,
            },
            "objective": {"name": method.objective},
            "entropy_control": {"name": method.entropy_control},
            "mask": {"name": method.mask},
        }
    )
    if model is None:
        model = torch.nn.Module()
        model.logits = torch.nn.Parameter(prob.logits.detach().clone())

        def forward(rows):
            return model.logits[rows]

    trainer.model = model
    trainer._forward_logits = lambda _model, _data, rows: forward(rows)
    trainer.controller = controller
    trainer.objective = OBJECTIVES.get(method.objective)
    trainer.objective_kw = method.objective_kw
    trainer.mask = MASKS.get(method.mask)
    trainer.mask_kw = dict(method.mask_params)
    trainer.agg = LOSS_AGGS.get(method.loss_agg)
    trainer.norm_len = norm_len
    trainer.h_ini = h_ini
    trainer.ref_model = None
    trainer.optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    trainer.shuffle_generator = torch.Generator().manual_seed(0)
    old = {"logp": prob.old_logp}
    if prob.old_topk_index is not None:
        old["old_topk_index"] = prob.old_topk_index
        old["old_topk_logp"] = prob.old_topk_logp
    data = {"responses": prob.responses, "group_index": prob.groups}
    metrics = trainer._update_actor(SimpleNamespace(response_mask=prob.mask), data, old, prob.advantages, prob.mask)
    return metrics[schema.PG_LOSS], metrics, model
