"""The actor's loss function on verl workers: verl's ``ppo_loss`` plus the trustbench loss inputs.

Design: verl 0.9.1's ``ppo_loss(config, model_output, data)`` (``verl.workers.utils.losses``)
converts the engine's outputs to padded [B,T] tensors and calls the registered policy loss with a
fixed signature, then adds verl's entropy and KL terms and metric bookkeeping. ``trustbench_ppo_loss``
keeps all of that (it calls verl's ``ppo_loss``) and only, for a ``trustbench_*`` loss mode, first
collects the extra inputs from the micro-batch and the model outputs into ``TrustbenchInputs`` and
makes them current (``plugins_losses.using_inputs``) for the duration of the call:

- ``responses`` [B,T] and the prompt groups (``uid``) from the batch;
- ``entropy`` [B,T] from the model outputs when the engine computed it (``calculate_entropy``);
- ``old_topk_index/logp`` [B,T,K+1] stored by the old-log-prob pass and ``topk_logp`` [B,T,K+1], the
  current log-probs at those ids, from the engine's logits (``sparse_old.LOGITS_OUTPUT``, set in the
  update pass by the trustbench trainer; ``sparse_old.response_topk_logp``); without a stored
  distribution, the [B,T,V] ``logits`` themselves;
- ``rollout_logp`` [B,T], the rollout engine's log-probs (``rollout_log_probs``): required by the
  methods that declare ``rollout_logp`` (the sample-based TRM masks), an error when missing;
- the per-iteration ``runtime`` values (controller state, H_ini) the trainer put on the batch.

Any other loss mode goes to verl's ``ppo_loss`` untouched. ``plugins_workers`` installs this
function as the actor's loss.

Memory: TROLL and the exact-KL masks read the current policy at the stored ids only, so the update
pass gathers [B,T,K+1] entries of the engine's logits (plus a no-grad float64 logsumexp in row
slices) and holds no [B,T,V] copy beyond the engine's own logits; their gradient goes into the
engine's logits gradient, which verl's own log-prob backward writes anyway.

Tests: ``pytest tests/verl/test_plugins_engine.py``.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from tensordict import TensorDict
from torch import Tensor
from verl.utils import tensordict_utils as tu
from verl.workers.utils.losses import ppo_loss
from verl.workers.utils.padding import no_padding_2_padding

from runners.backends.verl.plugins.batch_dump import DUMP_ENV, dump_micro_batch
from runners.backends.verl.plugins.config import is_trustbench_loss, loss_settings
from runners.backends.verl.plugins.losses import RUNTIME_KEY, TrustbenchInputs, using_inputs
from runners.backends.verl.plugins.sparse_old import (
    LOGIT_STARTS_OUTPUT,
    LOGITS_OUTPUT,
    OLD_TOPK_INDEX,
    OLD_TOPK_LOGP,
    padded_from_nested,
    prompt_response_lengths,
    response_logits,
    response_topk_logp,
)

# verl's batch fields: the rollout engine's log-probs of the sampled tokens, the reference policy's
ROLLOUT_LOGP_FIELD = "rollout_log_probs"
REF_LOGP_FIELD = "ref_log_prob"


def response_width(data: TensorDict) -> int:
    """T of verl's padded [B,T] loss tensors (the rule of ``no_padding_2_padding``)."""
    if not data["prompts"].is_nested:
        return int(data["responses"].shape[1])
    width = tu.get_non_tensor_data(data=data, key="max_response_len", default=-1)
    if width is not None and width >= 0:
        return int(width)
    return int(prompt_response_lengths(data)[1].max())


def _uids(data: TensorDict) -> Any:
    if "uid" not in data.keys():
        return None
    value = tu.get(data, "uid")
    return value if isinstance(value, Tensor) else list(value)


def build_inputs(config: Any, model_output: dict, data: TensorDict) -> TrustbenchInputs:
    """``TrustbenchInputs`` of one verl micro-batch (``data``) and the engine's ``model_output``."""
    settings = loss_settings(config.policy_loss)
    width = response_width(data)
    _, lengths = prompt_response_lengths(data)
    inputs = TrustbenchInputs(
        responses=padded_from_nested(data["responses"], width, 0).long(),
        group_index=_uids(data),
        runtime=dict(tu.get_non_tensor_data(data=data, key=RUNTIME_KEY, default=None) or {}),
    )
    if model_output.get("entropy") is not None:
        inputs.entropy = no_padding_2_padding(model_output["entropy"], data)
    if OLD_TOPK_INDEX in data.keys():
        inputs.old_topk_index = padded_from_nested(data[OLD_TOPK_INDEX], width, 0).long()
        inputs.old_topk_logp = padded_from_nested(data[OLD_TOPK_LOGP], width, float("-inf"))
    if LOGITS_OUTPUT in model_output:
        logits, starts = model_output[LOGITS_OUTPUT], model_output[LOGIT_STARTS_OUTPUT]
        if inputs.old_topk_index is not None:  # the logits at the stored ids only: no [B,T,V] copy
            inputs.topk_logp = response_topk_logp(logits, starts, lengths, width, inputs.old_topk_index)
            inputs.vocab_size = int(logits.shape[-1])
        else:
            inputs.logits = response_logits(logits, starts, lengths, width)
    elif settings.needs_sparse_old:
        raise ValueError(
            f"policy loss {settings.loss_mode!r} with mask {settings.mask!r} needs the logits in the update pass: "
            "run verl with trainer.v1.trainer_mode=trustbench_sync (runners.backends.verl.plugins.trainer)"
        )
    if inputs.old_topk_index is None and settings.needs_sparse_old:
        raise ValueError(
            f"policy loss {settings.loss_mode!r} with mask {settings.mask!r} needs the sparse old distribution "
            f"({OLD_TOPK_INDEX}/{OLD_TOPK_LOGP}) from the old-log-prob pass: run verl with "
            "trainer.v1.trainer_mode=trustbench_sync and without rollout_correction.bypass_mode"
        )
    # the sampler's log-probs (the translation sets rollout.calculate_log_probs): the sample-based masks
    # compare with them (the rollout policy, as in the built-in trainer) and may not silently use pi_old;
    # only the PPL-gap monitor falls back to the old log-probs without them (PolicyInputs)
    if ROLLOUT_LOGP_FIELD in data.keys():
        inputs.rollout_logp = padded_from_nested(data[ROLLOUT_LOGP_FIELD], width, 0.0).to(torch.float32)
    elif settings.method.requires("rollout_logp"):
        raise ValueError(
            f"policy loss {settings.loss_mode!r} ({', '.join(settings.method.needing('rollout_logp'))}) compares "
            f"with the rollout engine's log-probs ({ROLLOUT_LOGP_FIELD}), which this batch lacks: run verl with "
            "actor_rollout_ref.rollout.calculate_log_probs=true"
        )
    if settings.method.kl_coef and REF_LOGP_FIELD in data.keys():
        inputs.ref_logp = padded_from_nested(data[REF_LOGP_FIELD], width, 0.0).to(torch.float32)
    elif settings.method.kl_coef:
        raise ValueError(
            f"policy_loss.kl_coef={settings.method.kl_coef} needs the reference log-probs ({REF_LOGP_FIELD}): run "
            "verl with actor_rollout_ref.actor.use_kl_loss=true (and kl_loss_coef=0: the trustbench loss adds the term)"
        )
    return inputs


def trustbench_ppo_loss(config: Any, model_output: dict, data: TensorDict, dp_group=None):
    """verl's ``ppo_loss`` with ``TrustbenchInputs`` current for ``trustbench_*`` loss modes (and the
    micro-batch saved when ``TRUSTBENCH_VERL_DUMP_DIR`` is set: ``batch_dump``)."""
    if not is_trustbench_loss(config.policy_loss):
        out = ppo_loss(config, model_output, data, dp_group)
    else:
        with using_inputs(build_inputs(config, model_output, data)):
            out = ppo_loss(config, model_output, data, dp_group)
    if os.environ.get(DUMP_ENV):
        dump_micro_batch(data, model_output, *out)
    return out


__all__ = ["build_inputs", "response_width", "trustbench_ppo_loss"]
