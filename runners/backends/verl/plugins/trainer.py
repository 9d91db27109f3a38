"""verl's synchronous v1 trainer with the trustbench hooks, registered as ``trustbench_sync``.

Design: verl 0.9.1 picks the trainer class by ``trainer.v1.trainer_mode`` from its registry
(``register_trainer``); ``TrustbenchPPOTrainer`` is ``PPOTrainerSync`` (it behaves as mode "sync"
everywhere verl tests the mode) plus a few overrides, each a thin wrapper around verl's method:

- ``_init_resource_pool_mgr``: the actor role runs ``plugins_workers.TrustbenchActorRolloutRefWorker``;
- ``_compute_old_log_prob``: flags the batch so the engine stores the sparse old distribution
  (``sparse_old.SPARSIFY_KEY``) when the loss needs it (TROLL, exact-KL TRM), then feeds the
  pass's entropy to the per-iteration controllers (``controllers.IterationControl``);
- ``_compute_advantage``: critic values (and ``finished``) for ``trustbench_gae`` / ``trustbench_egae``,
  after verl's rollout correction as verl's own advantage step applies it;
  then the built-in trainer's per-iteration diagnostics (``monitor``: ``entropy/cov``, the TRM monitor
  for verl's own losses);
- ``_step_once``: after verl's iteration the post-update pass (``trainer_diagnostics``:
  ``actor/post_update_kl``, ``gtpo/conflict_prob_delta``; pi_old's top-K stored by the old pass for
  every method while on);
- ``_compute_metrics``: ``timing_cpu_s/*``, the machine load and the Roofline points (``roofline``:
  ``perf/<phase>_tflops`` / ``_arithmetic_intensity``, ``perf/peak_*``) beside verl's step metrics;
- ``_update_actor``: attaches the controller state (``plugins_losses.RUNTIME_KEY``) and, when
  needed, asks the engine for the logits (``sparse_old.KEEP_LOGITS_KEY``); moves the method
  metrics verl prefixed with ``actor/`` back to their schema names (``troll/...``, ``trm/...``);
- ``_save_checkpoint`` / ``_load_checkpoint``: the controller state as JSON in verl's
  ``global_step_<n>`` folder; no checkpoint once an iteration's metrics held a NaN or infinity
  (verl checkpoints a step before it logs it: without this the trustbench backend, which fails the run
  on the logged NaN, would find that step's checkpoint already written and resume from it);
- ``on_step_end``: after verl's weight sync, ``backend.check_stop_request`` (the trustbench
  backend's stop file: checkpoint this step and make it the last).

Flags are removed from the batch after each call, so the reference pass never sparsifies.

    python -m verl.trainer.main_ppo trainer.v1.trainer_mode=trustbench_sync ...   # with
    VERL_USE_EXTERNAL_MODULES=runners.backends.verl.plugins.register

Tests (verl's methods replaced by fakes; the Ray / TransferQueue loop needs GPUs):
``pytest tests/verl/test_plugins_controllers.py``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import ray
import transfer_queue as tq
import verl.trainer.ppo.v1.trainer_base as trainer_base
from tensordict import TensorDict
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.workers.utils.padding import response_to_nested

from runners.algorithms.trm import DEFAULT_EDGES
from runners.backends.verl import METHOD_METRIC_PREFIXES, TRAINER_MODE
from runners.backends.verl.cpu.mode import POLL_INTERVAL_KEY
from runners.backends.verl.metrics import map_metrics
from runners.backends.verl.plugins.advantages import VALUE_ESTIMATORS
from runners.backends.verl.plugins.config import is_trustbench_loss, loss_settings
from runners.backends.verl.plugins.controllers import IterationControl
from runners.backends.verl.plugins.losses import RUNTIME_KEY
from runners.backends.verl.plugins.monitor import MONITOR_KEY, iteration_metrics
from runners.backends.verl.plugins.roofline import StepRoofline
from runners.backends.verl.plugins.sparse_old import KEEP_LOGITS_KEY, SPARSIFY_KEY, padded_from_nested
from runners.backends.verl.plugins.trainer_diagnostics import (
    POST_UPDATE_PHASE,
    install_cpu_timing,
    post_update_pass,
    step_cpu_metrics,
)
from runners.backends.verl.plugins.workers import TrustbenchActorRolloutRefWorker
from runners.perf.hardware import load_metrics

logger = logging.getLogger(__name__)
ACTOR_ROLES = (Role.ActorRollout, Role.ActorRolloutRef, Role.Actor)


def strip_actor_prefix(metrics: dict[str, Any]) -> dict[str, Any]:
    """Rename ``actor/<method>/...`` (verl's prefix on actor metrics) to ``<method>/...`` in place."""
    for key in list(metrics):
        if key.startswith("actor/") and key[len("actor/") :].startswith(METHOD_METRIC_PREFIXES):
            metrics[key[len("actor/") :]] = metrics.pop(key)
    return metrics


def non_finite(metrics: dict[str, Any], step: int) -> str | None:
    """Why a step must not be checkpointed: its first NaN or infinite metric, among those the trustbench
    backend logs (``metrics.map_metrics``: not verl's diagnostics that read NaN when unused); else None."""
    mapped = map_metrics(metrics)
    bad = sorted(k for k, v in mapped.items() if not np.isfinite(v))
    return f"metric {bad[0]!r} is {mapped[bad[0]]} at step {step}" if bad else None


def _uids(data: TensorDict) -> list:
    value = data["uid"]
    return value.tolist() if hasattr(value, "tolist") else list(value)


install_cpu_timing()  # timing_cpu_s/<phase> beside verl's timing_s/<phase>


@register_trainer(TRAINER_MODE)
class TrustbenchPPOTrainer(PPOTrainerSync):
    """``PPOTrainerSync`` with the trustbench hooks (module docstring)."""

    # verl's __init__ assigns config.trainer.v1.trainer_mode; everywhere verl tests it, act as "sync"
    @property
    def trainer_mode(self) -> str:
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:
        pass

    def __init__(self, config) -> None:
        policy_loss = config.actor_rollout_ref.actor.policy_loss
        self.trustbench = loss_settings(policy_loss) if is_trustbench_loss(policy_loss) else None
        self.control = IterationControl(self.trustbench) if self.trustbench is not None else None
        super().__init__(config)
        self._check_trustbench_config()

    def _check_trustbench_config(self) -> None:
        cfg = self.config
        bypass = bool((cfg.algorithm.get("rollout_correction", None) or {}).get("bypass_mode", False))
        if self.trustbench is not None:
            if bypass and (self.trustbench.needs_sparse_old or self.control.active):
                raise ValueError(
                    "algorithm.rollout_correction.bypass_mode=true skips the old-log-prob pass that trustbench "
                    f"needs for {self.trustbench.loss_mode} / mask {self.trustbench.mask} / entropy_control "
                    f"{self.trustbench.entropy_control}; set it to false"
                )
            if self.trustbench.needs_grad_entropy and not cfg.actor_rollout_ref.actor.calculate_entropy:
                raise ValueError(
                    f"{self.trustbench.loss_mode} with entropy_control={self.trustbench.entropy_control} needs the "
                    "current entropy: set actor_rollout_ref.actor.calculate_entropy=true"
                )
        if cfg.algorithm.adv_estimator in VALUE_ESTIMATORS:
            if not self.use_critic:
                raise ValueError(f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} needs critic.enable=true")
            if cfg.algorithm.use_kl_in_reward:
                raise ValueError(
                    f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} does not support use_kl_in_reward"
                )

    def _build_replay_buffer(self):
        """verl's replay buffer, polling every ``trainer.v1.trustbench_poll_interval_s`` when set (CPU mode:
        verl's 2 s poll would be most of a tiny model's step)."""
        buffer = super()._build_replay_buffer()
        interval = self.config.trainer.v1.get(POLL_INTERVAL_KEY, None)
        if interval is not None and hasattr(buffer, "poll_interval"):
            buffer.poll_interval = float(interval)
        return buffer

    # -- workers ------------------------------------------------------------------------------------
    def _init_resource_pool_mgr(self):
        super()._init_resource_pool_mgr()
        for role in ACTOR_ROLES:
            if role in self.role_worker_mapping:
                self.role_worker_mapping[role] = ray.remote(TrustbenchActorRolloutRefWorker)

    # -- phases -------------------------------------------------------------------------------------
    def _compute_old_log_prob(self, batch, metrics: dict):
        sparse = self._sparse_settings()
        if sparse:
            batch.extra_info[SPARSIFY_KEY] = sparse
        try:
            out = super()._compute_old_log_prob(batch, metrics)
        finally:
            batch.extra_info.pop(SPARSIFY_KEY, None)
        if out is not batch and getattr(out, "extra_info", None) is not None:
            out.extra_info.pop(SPARSIFY_KEY, None)
        if self.control is not None and self.control.active:
            data = tq.kv_batch_get(
                keys=batch.keys, partition_id=batch.partition_id, select_fields=["entropy", "response_mask", "uid"]
            )
            real = [i for i, tag in enumerate(batch.tags) if not tag.get("is_padding", False)]
            width = int(data["response_mask"].offsets().diff().max())
            entropy = padded_from_nested(data["entropy"], width, 0.0)[real]
            mask = padded_from_nested(data["response_mask"], width, 0)[real]
            all_uids = _uids(data)
            uids = [all_uids[i] for i in real]
            metrics.update(self.control.observe(entropy, mask, uids))
        return out

    def _compute_advantage(self, batch, metrics: dict):
        if self.config.algorithm.adv_estimator in VALUE_ESTIMATORS:
            out = self._compute_value_advantage(batch, metrics)
        else:
            out = super()._compute_advantage(batch, metrics)
        metrics.update(self._iteration_metrics(batch))
        return out

    def _iteration_metrics(self, batch) -> dict:
        """``entropy/cov`` and (verl's built-in losses) the TRM monitor, as the built-in trainer logs them."""
        names = set(getattr(batch, "fields", None) or [])
        fields = ["old_log_probs", "advantages", "response_mask"]
        if "old_log_probs" not in names and names:
            return {}
        if "rollout_log_probs" in names:
            fields.append("rollout_log_probs")
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        real = [i for i, tag in enumerate(batch.tags) if not tag.get("is_padding", False)]
        width = int(data["response_mask"].offsets().diff().max())
        padded = {key: padded_from_nested(data[key], width, 0.0)[real].float() for key in fields}
        monitor = self.config.trainer.v1.get(MONITOR_KEY, None) or {}
        return iteration_metrics(
            padded["old_log_probs"],
            padded["advantages"],
            padded["response_mask"],
            padded.get("rollout_log_probs"),
            builtin_loss=self.trustbench is None,
            length_edges=list(monitor.get("length_edges", DEFAULT_EDGES)),
        )

    def _compute_value_advantage(self, batch, metrics: dict):
        """verl's ``_compute_advantage`` for the value estimators: its rollout correction (IS weights,
        rejection, ``rollout_corr/*``) on the same condition, then the estimator with the critic's values
        and T-PPO's ``finished`` (verl's own call passes neither)."""
        name = self.config.algorithm.adv_estimator
        names = set(getattr(batch, "fields", None) or [])
        correction = self.config.algorithm.get("rollout_correction", None)
        correct = correction is not None and "rollout_log_probs" in names and not correction.get("bypass_mode", False)
        fields = ["uid", "response_mask", "rm_scores", "values"]
        fields += ["finished"] if "finished" in names else []
        fields += ["old_log_probs", "rollout_log_probs"] if correct else []
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        mask_nested = data["response_mask"]
        width = int(mask_nested.offsets().diff().max())
        response_mask = padded_from_nested(mask_nested, width, 0).float()
        output = {}
        if correct:
            output = self._rollout_correction(data, response_mask, width, correction, metrics)
            response_mask = output["response_mask"].float()
        advantages, returns = get_adv_estimator_fn(name)(
            token_level_rewards=padded_from_nested(data["rm_scores"], width, 0.0).float(),
            response_mask=response_mask,
            config=self.config.algorithm,
            index=np.array(_uids(data), dtype=object),
            values=padded_from_nested(data["values"], width, 0.0).float(),
            finished=data["finished"].reshape(-1).bool() if "finished" in fields else None,
        )
        output.update({"advantages": advantages, "returns": returns})
        nested = {key: response_to_nested(value, mask_nested) for key, value in output.items()}
        return tq.kv_batch_put(
            keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict(nested, batch_size=len(batch))
        )

    @staticmethod
    def _rollout_correction(data, response_mask, width: int, correction, metrics: dict):
        """verl's ``compute_rollout_correction_and_add_to_batch`` on the padded batch: the fields to write
        back as verl's own advantage step does (the possibly rejection-masked response mask in the stored
        dtype, and the IS weights when enabled)."""
        from verl import DataProto
        from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

        tensors = {
            key: padded_from_nested(data[key], width, 0.0).float() for key in ("old_log_probs", "rollout_log_probs")
        }
        proto = DataProto(
            batch=TensorDict({**tensors, "response_mask": response_mask}, batch_size=[len(response_mask)])
        )
        proto, is_metrics = compute_rollout_correction_and_add_to_batch(proto, correction)
        metrics.update(is_metrics)
        fields = {"response_mask": proto.batch["response_mask"].to(data["response_mask"].dtype)}
        if "rollout_is_weights" in proto.batch.keys():
            fields["rollout_is_weights"] = proto.batch["rollout_is_weights"]
        return fields

    def _monitor(self) -> dict:
        return dict(self.config.trainer.v1.get(MONITOR_KEY, None) or {})

    def _sparse_settings(self) -> dict | None:
        """Sparse old distribution to store in the old pass: the loss's (TROLL, exact-KL TRM), or the
        cell's settings when the post-update diagnostics need pi_old's top-K."""
        if self.trustbench is not None and self.trustbench.needs_sparse_old:
            return dict(self.trustbench.sparse)
        monitor = self._monitor()
        return dict(monitor["sparse"]) if monitor.get("post_update") and monitor.get("sparse") else None

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        metrics.update(step_cpu_metrics(timing_raw))
        metrics.update(load_metrics())
        metrics.update(self._roofline_metrics(batch, timing_raw))
        return super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)

    def _roofline_metrics(self, batch, timing_raw: dict) -> dict:
        """The step's Roofline points from its real prompt and response lengths (``roofline``)."""
        if not hasattr(self, "_roofline"):  # the model's shape and the workers' ceiling, once
            self._roofline = StepRoofline.for_trainer(self)
        if self._roofline is None:
            return {}
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["prompts", "response_mask"]
        )
        real = [i for i, tag in enumerate(batch.tags) if not tag.get("is_padding", False)]
        prompts = data["prompts"].offsets().diff().tolist()
        width = int(data["response_mask"].offsets().diff().max())
        responses = padded_from_nested(data["response_mask"], width, 0).sum(-1).long().tolist()
        return self._roofline.metrics([prompts[i] for i in real], [responses[i] for i in real], timing_raw)

    def _step_once(self, metrics: dict, timing_raw: dict, sample_batch_size: int):
        """verl's iteration, then the post-update pass as its own phase (as the built-in trainer's)."""
        batch = super()._step_once(metrics, timing_raw, sample_batch_size)
        sparse = self._sparse_settings()
        if self._monitor().get("post_update") and sparse and self.config.trainer.critic_warmup <= self.global_steps:
            with trainer_base.marked_timer(POST_UPDATE_PHASE, timing_raw):  # the CPU-timed wrapper
                metrics.update(post_update_pass(self, batch, int(sparse["chunk_size"])))
        if getattr(self, "_non_finite", None) is None:  # the first one stays: later weights descend from it
            self._non_finite = non_finite(metrics, self.global_steps)
        return batch

    def _update_actor(self, batch, metrics: dict):
        extra: dict[str, Any] = {}
        if self.trustbench is not None:
            extra[RUNTIME_KEY] = self.control.runtime()
            if self.trustbench.needs_sparse_old:
                extra[KEEP_LOGITS_KEY] = True
        batch.extra_info.update(extra)
        try:
            out = super()._update_actor(batch, metrics)
        finally:
            for key in extra:
                batch.extra_info.pop(key, None)
        strip_actor_prefix(metrics)
        return out

    def on_step_end(self):
        super().on_step_end()
        self._check_stop_request()

    def _check_stop_request(self) -> bool:
        """End the run with a checkpoint if the trustbench backend asked to stop (preemption, time limit).

        The protocol (a stop file named by an environment variable) belongs to ``checkpoints.py``.
        """
        try:
            from runners.backends.verl.checkpoints import check_stop_request
        except ImportError as exc:  # pragma: no cover - backend module missing from the install
            logger.warning("trustbench stop requests disabled: %s", exc)
            return False
        return check_stop_request(self)

    # -- checkpoints --------------------------------------------------------------------------------
    def _step_folder(self) -> str:
        trainer = self.config.trainer
        if trainer.resume_mode == "resume_path" and trainer.resume_from_path:
            folder = trainer.resume_from_path
        else:
            folder = os.path.join(trainer.default_local_dir, f"global_step_{self.global_steps}")
        return folder if os.path.isabs(folder) else os.path.join(os.getcwd(), folder)

    def _save_checkpoint(self):
        reason = getattr(self, "_non_finite", None)
        if reason is not None:
            logger.error(
                "no checkpoint at step %s: %s (the last checkpoint stays the last good step)", self.global_steps, reason
            )
            return None
        if self.control is not None:  # before verl writes latest_checkpointed_iteration.txt
            self.control.save(os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}"))
        return super()._save_checkpoint()

    def _load_checkpoint(self):
        out = super()._load_checkpoint()
        if self.control is not None and self.global_steps > 0 and not self.control.load(self._step_folder()):
            logger.warning("no trustbench controller state in %s: controllers restart", self._step_folder())
        return out


__all__ = ["TrustbenchPPOTrainer", "strip_actor_prefix"]
