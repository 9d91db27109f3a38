"""The built-in trainer: one grid cell on CPU (or one GPU) with the algorithm library.

One iteration (``LocalTrainer.step``), with the metric names' phases:

1. ``timing_s/gen``: the rollout manager extends every active slot (full responses, or one
   T-PPO window) with the KV-cache sampler (``runners.models.sampler``) and scores finished ones.
2. ``timing_s/old_log_prob``: a no-grad forward gives log pi_old, token entropy and, when the method
   needs it (``Method.requires("sparse_old")``: TROLL, exact-KL TRM), its sparse top-K form
   (``actor.old_pass``). Where that forward would repeat the update's (``_old_from_update``: on-policy
   sampler, one epoch of one mini-batch, nothing needs pi_old before the update) the update fills the
   same entries from its own forward instead. Reference log-probs (``kl_coef > 0``) and critic values
   follow (``timing_s/ref``, ``timing_s/values``).
3. ``timing_s/adv``: the estimator turns rewards (and values) into advantages.
4. The entropy controller updates once per iteration from the batch entropy, before the update.
5. ``timing_s/update_actor``: epochs x mini-batches of whole prompt groups (``batching``), each
   micro-batch's loss from the shared ``runners.algorithms.policy_loss.PolicyLoss`` (``actor``).
6. ``timing_s/update_critic``: clipped value regression (PPO, T-PPO: ``critic``).
7. ``perf/mfu/actor`` and Roofline points per phase from model FLOPs (``perf``, ``flops``, ``hardware``).

What the method needs is read from its registry declarations (``runners.algorithms.method``),
never from component names. Run it through ``trustbench run`` (see README); ``runners.run.run`` opens
the MLflow run and hands this class a ``RunTracker``.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig

from runners import metric_names as names
from runners.algorithms import ESTIMATORS, ROLLOUT_CORRECTIONS
from runners.algorithms.method import Method
from runners.algorithms.policy_loss import PolicyLoss
from runners.algorithms.rollout_correction import no_correction, offpolicy_metrics, prefixed
from runners.algorithms.types import AdvantageInputs
from runners.backends.base import StopRequested, check_finite, pause
from runners.backends.local import checkpoint as ckpt
from runners.backends.local.actor import OldFromUpdate, OldPass, UpdateSettings, old_pass, update_actor
from runners.backends.local.batching import micro_rows, policy_mask
from runners.backends.local.critic import CriticSettings, update_critic
from runners.backends.local.diagnostics import post_update_metrics
from runners.backends.local.heads import response_logprobs
from runners.backends.local.packed import dropout_free, supports_packed
from runners.backends.local.perf import model_shape, perf_metrics
from runners.backends.local.policy import Head, chunked_old_pass, chunked_passes, segment_head, segment_logits
from runners.backends.local.rollout import RolloutBatch
from runners.backends.local.rollout_policy import RolloutPolicy
from runners.backends.local.setup import Codec, build_data, build_models, resolve_device
from runners.backends.local.step_metrics import (
    PhaseTimer,
    acceptance_metrics,
    batch_metrics,
    load_metrics,
    masked_mean,
    postfix,
    progress,
    throughput_metrics,
)
from runners.models.sampler import generate, make_generator
from runners.perf.hardware import default_threads, machine_ceiling


class LocalTrainer:
    """Trains one cell; ``train()`` returns the final metrics."""

    def __init__(self, cfg: DictConfig, tracker, run_dir: Path, label: str = "") -> None:
        self.cfg = cfg
        self.tracker = tracker
        self.run_dir = Path(run_dir)
        self.label = label
        self.stop_requested = False
        t = cfg.trainer
        torch.set_num_threads(cfg.backend.num_threads or default_threads())
        self.device = resolve_device(cfg.backend.device)
        _seed_everything(cfg.seed)
        self.method = Method.from_config(cfg)
        m = build_models(cfg, needs_critic=self.method.requires("critic"), device=self.device)
        self.model, self.tokenizer, self.ref_model, self.critic = m.model, m.tokenizer, m.ref_model, m.critic
        self.optimizer, self.scheduler, self.critic_optimizer = m.optimizer, m.scheduler, m.critic_optimizer
        self.pad_id, self.eos_id = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        self.shape, self.ceiling = model_shape(self.model), machine_ceiling(self.device)  # MFU, Roofline
        self.packed = supports_packed(self.model)  # its forwards run a shared context once (FLOP counts)
        self.rollout_policy = RolloutPolicy(self.model, staleness=cfg.rollout.staleness, dtype=cfg.rollout.dtype)
        self._sampler = self.model
        self.estimator = ESTIMATORS.get(self.method.estimator)
        self.loss_fn = PolicyLoss(self.method)
        self._chunked = chunked_passes(self.model, self.method)  # (old, reference, post-update passes; update)
        self.controller = self.loss_fn.controller
        self.h_ini: float | None = None
        self.update_settings = UpdateSettings(
            ppo_epochs=t.ppo_epochs,
            mini_batch_share=t.mini_batch_prompts / t.prompts_per_step,
            micro_batch_size=t.micro_batch_size,
            grad_clip=t.grad_clip,
            logprob_precision=t.logprob_precision,
        )
        self.codec = Codec(cfg, self.tokenizer)
        self.rollout, self.evaluator = build_data(cfg, self.codec, pad_id=self.pad_id, eos_id=self.eos_id)
        # sampling draws on the model's device; the mini-batch order is drawn on the CPU (randperm)
        self.sample_generator = make_generator(self.device, cfg.seed + 1)
        self.shuffle_generator = torch.Generator(device="cpu").manual_seed(cfg.seed + 2)

    @classmethod
    def discard_checkpoints(cls, run_dir: str | Path) -> None:
        ckpt.discard(run_dir)

    def _generate(self, input_ids, attention_mask, max_new_tokens):
        return generate(
            self._sampler,
            input_ids.to(self.device),
            attention_mask.to(self.device),
            max_new_tokens=max_new_tokens,
            temperature=self.cfg.rollout.temperature,
            top_p=self.cfg.rollout.top_p,
            eos_token_id=self.eos_id,
            pad_token_id=self.pad_id,
            generator=self.sample_generator,
        )

    def _logits(self, model, batch: RolloutBatch, rows=None) -> torch.Tensor:
        """Temperature-scaled response logits [rows, T, V] of ``model`` (all rows when ``rows`` is None)."""
        return segment_logits(model, *self._rows(batch, rows), batch.context_length, self.cfg.rollout.temperature)

    def _forward(self, model, chunked: bool):
        """``(batch, rows) ->`` logits [rows,T,V], or where ``chunked`` a ``Head`` (``chunked_head``'s inputs)."""
        return lambda b, rows: (self._head if chunked else self._logits)(model, b, rows)

    @staticmethod
    def _rows(batch: RolloutBatch, rows) -> tuple:
        ids, attn = batch.input_ids, batch.attention_mask
        return (ids, attn) if rows is None else (ids[rows], attn[rows])

    # -- training ---------------------------------------------------------------------------------
    def train(self) -> dict[str, float]:
        t = self.cfg.trainer
        state = ckpt.load(self.run_dir)
        start = 0 if state is None else ckpt.restore(self, state)
        if start == 0 and self.method.requires("h_ini"):
            self.h_ini = self._initial_entropy(self.method.h_ini_prompts)
        if start == 0 and t.eval_every:
            self.tracker.log_metrics(self._evaluate(0), step=0)
        final: dict[str, float] = {}
        bar = progress(range(start, t.total_steps), enabled=self.cfg.progress, desc=self.label or "train")
        for step in bar:
            if self.cfg.debug.fail_at_step is not None and step >= self.cfg.debug.fail_at_step:
                raise RuntimeError(f"debug.fail_at_step={self.cfg.debug.fail_at_step} reached (test hook)")
            metrics = self.step(step)
            self._leak = [*getattr(self, "_leak", []), b"\1" * (self.cfg.debug.grow_memory_mb << 20)]  # debug hook
            below = self.cfg.debug.delay_steps_below
            if self.cfg.debug.step_delay_s and (below is None or step < below):
                pause(self.cfg.debug.step_delay_s, lambda: self.stop_requested)
            done = step + 1
            if t.eval_every and (done % t.eval_every == 0 or done == t.total_steps):
                metrics.update(self._evaluate(done))
            check_finite(metrics, done)
            self.tracker.log_metrics(metrics, step=done)
            final = metrics
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(postfix(metrics))
            if (t.checkpoint_every and done % t.checkpoint_every == 0) or done == t.total_steps or self.stop_requested:
                self._save(done)
            if self.stop_requested and done < t.total_steps:
                raise StopRequested(f"stopped after step {done} (checkpoint saved)")
        return final

    def step(self, step: int) -> dict[str, float]:
        """One RL iteration (module docstring); returns its metrics."""
        cfg, t = self.cfg, self.cfg.trainer
        timer = PhaseTimer()
        self.model.eval()
        self._sampler = self.rollout_policy.sampler()
        with timer("gen"), torch.inference_mode():
            host = self.rollout.step(self._generate)  # on the CPU, where the step's metrics read it
        batch = host.to(self.device)
        fused = self._old_from_update()  # None: a separate old-log-prob pass
        with timer("old_log_prob"):
            old = OldPass() if fused else self._old_pass(batch)
        old.ref_logp = self._ref_logp(timer, batch)
        values, advantages, returns = self._advantages(timer, batch)
        correction = ROLLOUT_CORRECTIONS.get(self.method.rollout_correction)(
            old.old_logp, batch.rollout_logp, batch.response_mask, **self.method.rollout_correction_kw
        )
        mask = policy_mask(
            correction.response_mask,
            batch.finished,
            truncated=cfg.rollout.mode == "truncated",
            drop_last_k=cfg.rollout.drop_last_k,
        )
        entropy, controller_metrics = (None, {}) if fused else self._update_controller(old, batch)
        with timer("update_actor"):
            metrics, seq_masks = update_actor(
                self.model,
                self.optimizer,
                self._forward(self.model, self._chunked[1]),
                self.loss_fn,
                batch,
                old,
                advantages,
                mask,
                settings=self.update_settings,
                shuffle=self.shuffle_generator,
                h_ini=self.h_ini,
                is_weights=correction.is_weights,
                fill_old=fused,
            )
        if fused:  # a controller that needs no batch entropy ends in the same state either side of the update
            entropy, controller_metrics = self._update_controller(old, batch)
        self.rollout_policy.after_update()
        if t.post_update_diagnostics:
            with timer("post_update"):
                metrics.update(self._post_update(batch, old, advantages))
        if self.critic is not None:
            with timer("update_critic"):
                metrics.update(self._update_critic(batch, values, returns))
        old_logp, response_mask = old.old_logp, batch.response_mask  # old_logp: from the update if fused
        metrics.update(acceptance_metrics(host, seq_masks, t.length_buckets))
        metrics.update(controller_metrics)
        metrics.update(
            prefixed({**offpolicy_metrics(old_logp, batch.rollout_logp, response_mask), **correction.metrics})
        )
        metrics.update(
            batch_metrics(
                host, response_mask, old_logp, advantages, returns, values, entropy, cfg.rollout.max_response_length
            )
        )
        return self._finish_step(metrics, timer, host, old_pass=not fused)

    def _update_controller(self, old: OldPass, batch: RolloutBatch) -> tuple[float, dict[str, float]]:
        """The batch's token-mean entropy under pi_old and the entropy controller's update from it."""
        entropy = float(masked_mean(old.entropy, batch.response_mask))
        return entropy, self.controller.update(entropy)

    def _old_from_update(self) -> OldFromUpdate | None:
        """What the update fills in for the old-log-prob pass where that pass would repeat its first forward
        (pi_old is the policy of every row's first forward): the trained model sampled the batch (staleness 0,
        its dtype), one epoch of one mini-batch, no dropout, no batch-entropy controller or rollout correction."""
        t, method = self.cfg.trainer, self.method
        on_policy = self._sampler is self.model and t.ppo_epochs == 1 and self.update_settings.mini_batch_share >= 1
        before_update = (
            method.requires("batch_entropy") or ROLLOUT_CORRECTIONS.get(method.rollout_correction) is not no_correction
        )
        if not on_policy or before_update or not dropout_free(self.model):
            return None
        return OldFromUpdate(method, bool(t.post_update_diagnostics))

    def _head(self, model, batch: RolloutBatch, rows=None) -> Head:
        """``_logits`` before the output layer (``Head``: hidden states and the layer, for ``chunked_head``)."""
        return segment_head(model, *self._rows(batch, rows), batch.context_length, self.cfg.rollout.temperature)

    def _old_pass(self, batch: RolloutBatch) -> OldPass:
        """log pi_old (trained model), the sampling policy's sparse store (its copy); ``chunked_old_pass``'s passes."""
        t, separate = self.cfg.trainer, self._sampler is not self.model
        own, sampler = chunked_old_pass(self.model, self._sampler)
        rollout = self._head if sampler else lambda model, b, rows: self._logits(model, b, rows).float()
        return old_pass(
            self._forward(self.model, own),
            batch,
            method=self.method,
            micro_batch_size=t.micro_batch_size,
            precision=t.logprob_precision,
            rollout_forward=(lambda b, rows: rollout(self._sampler, b, rows)) if separate else None,
            diagnostics=bool(t.post_update_diagnostics),
        )

    def _ref_logp(self, timer: PhaseTimer, batch: RolloutBatch) -> torch.Tensor | None:
        """The reference model's log-probs of the sampled tokens (KL term), None without a reference model."""
        if self.ref_model is None:
            return None
        with timer("ref"):
            forward, chunked = self._forward(self.ref_model, self._chunked[0]), self._chunked[0]
            return response_logprobs(forward, batch, chunked=chunked, settings=self.update_settings)

    def _advantages(self, timer: PhaseTimer, batch: RolloutBatch):
        """Critic values and the estimator's advantages and returns."""
        values = None
        if self.critic is not None:
            with timer("values"), torch.no_grad():
                values = self.critic(batch.input_ids, batch.attention_mask, batch.context_length)
                values *= batch.response_mask
        with timer("adv"):
            inputs = AdvantageInputs(
                batch.token_rewards, batch.response_mask, batch.group_index, values, batch.finished
            )
            advantages, returns = self.estimator(inputs, **self.method.estimator_kw)
        return values, advantages, returns

    def _post_update(self, batch: RolloutBatch, old: OldPass, advantages) -> dict[str, float]:
        self.model.eval()
        return post_update_metrics(
            self._forward(self.model, self._chunked[0]),
            batch,
            old,
            advantages,
            chunk=micro_rows(batch.input_ids.shape[0], self.cfg.trainer.micro_batch_size),
            precision=self.cfg.trainer.logprob_precision,
        )

    def _finish_step(self, metrics: dict[str, float], timer: PhaseTimer, batch, old_pass: bool) -> dict[str, float]:
        """Timing (wall, CPU), throughput, MFU, Roofline points, memory, load, learning rate; advances the schedule."""
        timing = timer.metrics()
        metrics.update(timing)
        metrics.update(throughput_metrics(batch, timing))
        work = {"old_pass": old_pass, "settings": self.update_settings, "packed": self.packed}
        metrics.update(perf_metrics(self.shape, self.ceiling, batch, timing, **work))
        metrics.update(load_metrics())
        if self.device.type == "cuda":
            metrics[names.MAX_MEMORY_ALLOCATED_GB] = torch.cuda.max_memory_allocated() / 2**30
        metrics[names.LR] = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        return metrics

    def _update_critic(self, batch: RolloutBatch, values, returns) -> dict[str, float]:
        settings = CriticSettings.from_config(self.cfg, self.method)
        return update_critic(
            self.critic, self.critic_optimizer, batch, values, returns, settings=settings, pad_id=self.pad_id
        )

    # -- evaluation and checkpoints ---------------------------------------------------------------
    def _evaluate(self, step: int) -> dict[str, float]:
        start = time.perf_counter()
        self.model.eval()
        metrics = self.evaluator.evaluate(self.model, generator=make_generator(self.device, self.cfg.seed + 7))
        metrics[names.TIMING_TESTING] = time.perf_counter() - start
        return self.evaluator.log_per_prompt(self.tracker, step, metrics)  # its per-prompt scores: an artifact

    def _initial_entropy(self, prompts: int) -> float:
        """H_ini of GTPO: mean token entropy of the initial model on the first training prompts."""
        examples = self.rollout.stream.examples[:prompts]
        return self.evaluator.mean_entropy(
            self.model, examples, generator=make_generator(self.device, self.cfg.seed + 5)
        )

    def _save(self, step: int) -> None:
        self.tracker.flush(wait=True)  # metrics up to this step are durable before the checkpoint
        ckpt.save(self.run_dir, ckpt.state_of(self, step))


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


__all__ = ["LocalTrainer", "StopRequested"]
