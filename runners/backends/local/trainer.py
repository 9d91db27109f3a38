"""The built-in trainer: one grid cell on CPU (or one GPU) with the algorithm library.

One iteration (``LocalTrainer.step``), with the metric schema's phase names:

1. ``timing_s/gen``: the rollout manager extends every active slot (full responses, or one
   T-PPO window) with the KV-cache sampler and scores finished responses.
2. ``timing_s/old_log_prob``: a no-grad forward gives log pi_old, token entropy and, when the
   objective or mask needs the old distribution (TROLL, exact-KL TRM), its sparse top-K form.
   Reference log-probs (``kl_coef > 0``) and critic values follow (``timing_s/ref``, ``/values``).
3. ``timing_s/adv``: the estimator turns rewards (and values) into advantages.
4. ``timing_s/update_actor``: for each epoch and mini-batch of prompt groups (groups stay whole:
   GTPO compares responses of a group), the entropy controller transforms advantages, the mask
   gives per-sequence keep weights, the objective a per-token loss; the loss is aggregated with the
   mini-batch's global counts (trm.txt eq. 50: rejected sequences stay in the denominator).
5. ``timing_s/update_critic``: clipped value regression (PPO, T-PPO).
6. The entropy controller updates once per iteration from the batch entropy.

Run it through ``trustbench run`` (see README); ``runners.run.run`` opens the MLflow run and hands
this class a ``RunTracker``.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from runners import schema
from runners.algorithms import ENTROPY_CONTROLLERS, ESTIMATORS, LOSS_AGGS, MASKS, OBJECTIVES
from runners.algorithms.numerics import entropy_from_logits, token_logprobs
from runners.algorithms.types import AdvantageInputs, PolicyInputs
from runners.backends.local import checkpoint as ckpt
from runners.backends.local.evaluate import Evaluator
from runners.backends.local.policy import ValueModel, k3_kl, segment_logits
from runners.backends.local.rollout import RolloutBatch, RolloutManager
from runners.backends.local.sampler import generate
from runners.config.validate import CRITIC_ESTIMATORS, EXACT_KL_MASKS
from runners.data.prompts import encode_prompt
from runners.data.rewards import compute_reward

GRAD_ENTROPY_OBJECTIVES = {"gtpo"}


def _params(node: DictConfig) -> dict[str, Any]:
    return {k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if k != "name"}


class PhaseTimer:
    """Wall-clock seconds per phase of one iteration (``timing_s/<phase>``)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        return {f"timing_s/{k}": v for k, v in self.seconds.items()}


def pause(seconds: float, stop, *, clock=time.monotonic, sleep=time.sleep, tick: float = 0.1) -> None:
    """Sleep ``seconds``, or less if ``stop()`` turns true first (checked every ``tick`` s).

    ``debug.step_delay_s`` uses it as a stand-in for a long step: a stop signal that arrives during
    the pause is acted on at its end, as one arriving during a real step is at the step's end."""
    deadline = clock() + seconds
    while not stop():
        left = deadline - clock()
        if left <= 0:
            return
        sleep(min(left, tick))


class StopRequested(Exception):
    """Raised after a checkpoint when a stop signal (preemption, time limit) was received."""


class LocalTrainer:
    """Trains one cell; ``train()`` returns the final metrics."""

    def __init__(self, cfg: DictConfig, tracker, run_dir: Path, label: str = "") -> None:
        self.cfg = cfg
        self.tracker = tracker
        self.run_dir = Path(run_dir)
        self.label = label
        self.stop_requested = False
        t = cfg.trainer
        threads = cfg.backend.num_threads or os.cpu_count() or 1
        torch.set_num_threads(threads)
        self.device = torch.device(
            "cuda"
            if cfg.backend.device == "cuda" or (cfg.backend.device == "auto" and torch.cuda.is_available())
            else "cpu"
        )
        _seed_everything(cfg.seed)

        from runners.models.loader import load_model

        self.model, self.tokenizer = load_model(
            cfg.model.kind,
            path=cfg.model.path,
            arch=cfg.model.arch,
            dtype=cfg.model.dtype,
            **OmegaConf.to_container(cfg.model.options, resolve=True),
        )
        self.model.to(self.device)
        self.pad_id = self.tokenizer.pad_token_id
        self.eos_id = self.tokenizer.eos_token_id
        self.ref_model = None
        if t.kl_coef > 0:
            import copy

            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.critic = ValueModel(self.model).to(self.device) if cfg.estimator.name in CRITIC_ESTIMATORS else None

        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=t.lr, betas=(t.adam_beta1, t.adam_beta2), weight_decay=t.weight_decay
        )
        warm = max(int(t.warmup_steps), 0)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0
        )
        self.critic_optimizer = (
            torch.optim.AdamW(self.critic.parameters(), lr=t.critic_lr, betas=(t.adam_beta1, t.adam_beta2))
            if self.critic is not None
            else None
        )

        # algorithm components (registries; kwargs straight from the config nodes)
        self.estimator = ESTIMATORS.get(cfg.estimator.name)
        self.estimator_kw = _params(cfg.estimator)
        self.objective = OBJECTIVES.get(cfg.objective.name)
        self.objective_kw = _params(cfg.objective)
        for key in ("h_ini_prompts", "k", "delta"):  # consumed by the trainer (H_ini, sparsify)
            self.objective_kw.pop(key, None)
        self.mask = MASKS.get(cfg.mask.name)
        edges = list(t.length_buckets)
        self.mask_kw = {**_params(cfg.mask), "length_edges": edges, "position_edges": edges}
        self.controller = ENTROPY_CONTROLLERS.get(cfg.entropy_control.name)(**_params(cfg.entropy_control))
        self.agg = LOSS_AGGS.get(cfg.loss_agg.name)
        self.norm_len = cfg.loss_agg.norm_len or cfg.rollout.max_response_length
        self.needs_sparse_old = cfg.objective.name == "troll" or cfg.mask.name in EXACT_KL_MASKS
        self.h_ini: float | None = None

        # data (runners.data.splits: the same examples for every backend)
        from runners.data.splits import eval_examples, train_examples

        self.train_examples = train_examples(cfg)
        self.eval_examples = eval_examples(cfg)
        self.rollout = RolloutManager(
            examples=self._fit_prompts(self.train_examples, "train"),
            encode_prompt=self._encode,
            decode=self._decode,
            reward=self._reward,
            prompts_per_step=t.prompts_per_step,
            n=t.n,
            max_response_length=cfg.rollout.max_response_length,
            mode=cfg.rollout.mode,
            window=cfg.rollout.window,
            pad_token_id=self.pad_id,
            eos_token_id=self.eos_id,
            seed=cfg.seed,
        )
        self.evaluator = Evaluator(
            examples=self._fit_prompts(self.eval_examples, "eval"),
            encode=self._encode,
            decode=self._decode,
            reward=self._reward,
            n=t.eval_n,
            temperature=t.eval_temperature,
            top_p=cfg.rollout.top_p,
            max_new_tokens=cfg.rollout.max_response_length,
            pad_token_id=self.pad_id,
            eos_token_id=self.eos_id,
            batch_size=max(t.prompts_per_step * t.n, 32),
        )
        self.sample_generator = torch.Generator().manual_seed(cfg.seed + 1)
        self.shuffle_generator = torch.Generator().manual_seed(cfg.seed + 2)
        self.step_index = 0

    # -- data helpers ------------------------------------------------------------------------------
    def _encode(self, example) -> list[int]:
        return encode_prompt(example, self.tokenizer, chat=self.cfg.model.chat_template)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _reward(self, example, response: str) -> float:
        return compute_reward(example.reward_fn, response, example.answer, prompt=example.prompt_text())

    def _fit_prompts(self, examples: list, split: str) -> list:
        limit = self.cfg.rollout.max_prompt_length
        kept = [e for e in examples if len(self._encode(e)) <= limit]
        if not kept:
            raise ValueError(
                f"no {split} prompt fits rollout.max_prompt_length={limit} tokens (dataset {self.cfg.dataset.name!r})"
            )
        return kept

    def _generate(self, input_ids, attention_mask, max_new_tokens):
        return generate(
            self.model,
            input_ids.to(self.device),
            attention_mask.to(self.device),
            max_new_tokens=max_new_tokens,
            temperature=self.cfg.rollout.temperature,
            top_p=self.cfg.rollout.top_p,
            eos_token_id=self.eos_id,
            pad_token_id=self.pad_id,
            generator=self.sample_generator,
        )

    # -- training ---------------------------------------------------------------------------------
    def train(self) -> dict[str, float]:
        t = self.cfg.trainer
        start = self._restore()
        if start == 0 and self.cfg.objective.name == "gtpo":
            self.h_ini = self._initial_entropy(self.cfg.objective.h_ini_prompts)
        if start == 0 and t.eval_every:
            self.tracker.log_metrics(self._evaluate(), step=0)
        final: dict[str, float] = {}
        progress = _progress(range(start, t.total_steps), enabled=self.cfg.progress, desc=self.label or "train")
        for step in progress:
            if self.cfg.debug.fail_at_step is not None and step >= self.cfg.debug.fail_at_step:
                raise RuntimeError(f"debug.fail_at_step={self.cfg.debug.fail_at_step} reached (test hook)")
            metrics = self.step(step)
            below = self.cfg.debug.delay_steps_below
            if self.cfg.debug.step_delay_s and (below is None or step < below):
                pause(self.cfg.debug.step_delay_s, lambda: self.stop_requested)
            done = step + 1
            if t.eval_every and (done % t.eval_every == 0 or done == t.total_steps):
                metrics.update(self._evaluate())
            self.tracker.log_metrics(metrics, step=done)
            final = metrics
            if hasattr(progress, "set_postfix"):
                progress.set_postfix(_postfix(metrics))
            if (t.checkpoint_every and done % t.checkpoint_every == 0) or done == t.total_steps or self.stop_requested:
                self._save(done)
            if self.stop_requested and done < t.total_steps:
                raise StopRequested(f"stopped after step {done} (checkpoint saved)")
        return final

    def step(self, step: int) -> dict[str, float]:
        timer = PhaseTimer()
        self.step_index = step
        start = time.perf_counter()
        self.model.eval()
        with timer("gen"), torch.inference_mode():
            batch = self.rollout.step(self._generate)
        data = self._to_device(batch)
        with timer("old_log_prob"):
            old = self._old_pass(data)
        if self.ref_model is not None:
            with timer("ref"):
                old["ref_logp"] = self._logp(self.ref_model, data)
        values = None
        if self.critic is not None:
            with timer("values"), torch.no_grad():
                values = self.critic(data["input_ids"], data["attention_mask"], batch.context_length) * data["mask"]
        with timer("adv"):
            advantages, returns = self.estimator(
                AdvantageInputs(
                    token_rewards=data["token_rewards"],
                    response_mask=data["mask"],
                    group_index=data["group_index"],
                    values=values,
                    finished=data["finished"],
                ),
                **self.estimator_kw,
            )
        policy_mask = self._policy_mask(data)
        # entropy controllers act once per iteration on the batch entropy before its update
        entropy = float(_masked_mean(old["entropy"], data["mask"]))
        controller_metrics = self.controller.update(entropy)
        with timer("update_actor"):
            metrics = self._update_actor(batch, data, old, advantages, policy_mask)
        metrics.update(controller_metrics)
        if self.critic is not None:
            with timer("update_critic"):
                metrics.update(self._update_critic(batch, data, values, returns))
        metrics.update(self._batch_metrics(batch, data, old, advantages, returns, values, entropy))
        timing = timer.metrics()
        timing[schema.TIMING_STEP] = time.perf_counter() - start
        metrics.update(timing)
        tokens = batch.num_prompt_tokens + batch.num_generated_tokens
        metrics[schema.TOTAL_NUM_TOKENS] = tokens
        metrics[schema.THROUGHPUT] = tokens / max(timing[schema.TIMING_STEP], 1e-9)
        metrics[schema.GEN_THROUGHPUT] = batch.num_generated_tokens / max(timing[schema.TIMING_GEN], 1e-9)
        metrics[schema.CPU_MEMORY_USED_GB] = _rss_gb()
        if self.device.type == "cuda":
            metrics[schema.MAX_MEMORY_ALLOCATED_GB] = torch.cuda.max_memory_allocated() / 2**30
        metrics[schema.LR] = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        return metrics

    # -- phases -----------------------------------------------------------------------------------
    def _to_device(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        dev = self.device
        return {
            "input_ids": batch.input_ids.to(dev),
            "attention_mask": batch.attention_mask.to(dev),
            "responses": batch.responses.to(dev),
            "mask": batch.response_mask.to(dev),
            "group_index": batch.group_index.to(dev),
            "finished": batch.finished.to(dev),
            "token_rewards": batch.token_rewards.to(dev),
            "rollout_logp": batch.rollout_logp.to(dev),
            "context_length": batch.context_length,
        }

    def _forward_logits(self, model, data: dict, rows=None) -> torch.Tensor:
        ids, attn = data["input_ids"], data["attention_mask"]
        if rows is not None:
            ids, attn = ids[rows], attn[rows]
        return segment_logits(model, ids, attn, data["context_length"], self.cfg.rollout.temperature)

    def _logp(self, model, data: dict) -> torch.Tensor:
        with torch.no_grad():
            logits = self._forward_logits(model, data)
            return token_logprobs(logits, data["responses"], precision=self.cfg.trainer.logprob_precision)

    def _old_pass(self, data: dict) -> dict[str, torch.Tensor]:
        """log pi_old, entropy and (if needed) the sparse old distribution; chunked over rows."""
        out: dict[str, list] = defaultdict(list)
        B = data["input_ids"].shape[0]
        chunk = self._micro_rows(B)
        with torch.no_grad():
            for s in range(0, B, chunk):
                rows = slice(s, s + chunk)
                logits = self._forward_logits(self.model, data, rows)
                out["logp"].append(
                    token_logprobs(logits, data["responses"][rows], precision=self.cfg.trainer.logprob_precision)
                )
                out["entropy"].append(entropy_from_logits(logits))
                if self.needs_sparse_old:
                    from runners.algorithms.troll import sparsify

                    o = self.cfg.objective
                    flat = logits.reshape(-1, logits.shape[-1])
                    idx, lp = sparsify(
                        flat,
                        data["responses"][rows].reshape(-1),
                        k=min(int(o.get("k", 64)), logits.shape[-1]),
                        delta=o.get("delta", 1e-5),
                        p_default=o.get("p_default", 1e-12),
                        chunk_size=o.get("chunk_size", 1024),
                    )
                    shape = (*logits.shape[:2], idx.shape[-1])
                    out["old_topk_index"].append(idx.reshape(shape))
                    out["old_topk_logp"].append(lp.reshape(shape))
        result = {k: torch.cat(v) for k, v in out.items()}
        if "old_topk_index" in result:
            result["old_topk_index"] = result["old_topk_index"].long()
        return result

    def _micro_rows(self, batch_rows: int) -> int:
        m = self.cfg.trainer.micro_batch_size
        return m if m and m > 0 else batch_rows

    def _policy_mask(self, data: dict) -> torch.Tensor:
        """Response mask of the policy loss; T-PPO may drop the last k tokens of unfinished rows."""
        mask = data["mask"]
        k = self.cfg.rollout.drop_last_k
        if self.cfg.rollout.mode != "truncated" or not k:
            return mask
        lengths = mask.sum(-1).long()
        pos = torch.arange(mask.shape[1], device=mask.device)[None, :]
        cut = (~data["finished"])[:, None] & (pos >= (lengths[:, None] - k))
        return mask * (~cut).float()

    def _mini_batches(self, group_index: torch.Tensor) -> list[torch.Tensor]:
        """Row indices per mini-batch: whole prompt groups, shuffled with a seeded generator."""
        groups = torch.unique(group_index)
        order = groups[torch.randperm(len(groups), generator=self.shuffle_generator)]
        per = max(1, math.ceil(len(groups) * self.cfg.trainer.mini_batch_prompts / self.cfg.trainer.prompts_per_step))
        batches = []
        for s in range(0, len(order), per):
            chosen = order[s : s + per]
            rows = torch.nonzero(torch.isin(group_index, chosen.to(group_index.device))).squeeze(-1)
            batches.append(rows)
        return batches

    def _micro_batches(self, rows: torch.Tensor, group_index: torch.Tensor) -> list[torch.Tensor]:
        """Split a mini-batch into micro-batches of about ``micro_batch_size`` rows, keeping groups whole."""
        size = self.cfg.trainer.micro_batch_size
        if not size or size >= len(rows):
            return [rows]
        out, current, current_len = [], [], 0
        for g in torch.unique(group_index[rows]):
            members = rows[group_index[rows] == g]
            if current and current_len + len(members) > size:
                out.append(torch.cat(current))
                current, current_len = [], 0
            current.append(members)
            current_len += len(members)
        if current:
            out.append(torch.cat(current))
        return out

    def _update_actor(self, batch, data, old, advantages, policy_mask) -> dict[str, float]:
        t = self.cfg.trainer
        self.model.train()
        sums: dict[str, float] = defaultdict(float)
        weights: dict[str, float] = defaultdict(float)
        seq_masks, grad_norms = [], []
        overrides = self.controller.objective_overrides()
        need_grad_entropy = (
            self.cfg.objective.name in GRAD_ENTROPY_OBJECTIVES or self.cfg.entropy_control.name == "bonus"
        )
        objective_kw = {**self.objective_kw, **overrides}
        if self.cfg.objective.name == "gtpo":
            objective_kw["h_ini"] = self.h_ini
        for _epoch in range(t.ppo_epochs):
            for rows in self._mini_batches(data["group_index"]):
                num_tokens = policy_mask[rows].sum().clamp(min=1)
                num_seqs = (policy_mask[rows].sum(-1) > 0).sum().clamp(min=1)
                self.optimizer.zero_grad(set_to_none=True)
                for micro in self._micro_batches(rows, data["group_index"]):
                    logits = self._forward_logits(self.model, data, micro)
                    logp = token_logprobs(logits, data["responses"][micro], precision=t.logprob_precision)
                    entropy = entropy_from_logits(logits) if need_grad_entropy else None
                    mask = policy_mask[micro]
                    adv = self.controller.transform_advantages(advantages[micro], logp.detach(), mask)
                    inp = PolicyInputs(
                        logp=logp,
                        logp_old=old["logp"][micro],
                        advantages=adv,
                        response_mask=mask,
                        responses=data["responses"][micro],
                        group_index=data["group_index"][micro],
                        entropy=entropy,
                        logits=logits,
                        old_topk_index=old["old_topk_index"][micro] if "old_topk_index" in old else None,
                        old_topk_logp=old["old_topk_logp"][micro] if "old_topk_logp" in old else None,
                    )
                    with torch.no_grad():
                        masked = self.mask(inp, **self.mask_kw)
                    out = self.objective(inp, **objective_kw)
                    loss_mat = out.loss_mat
                    term = self.controller.loss_term(entropy) if entropy is not None else None
                    if term is not None:
                        loss_mat = loss_mat + term
                    if self.ref_model is not None:
                        loss_mat = loss_mat + t.kl_coef * k3_kl(logp, old["ref_logp"][micro])
                    seq_mask = masked.seq_mask.to(loss_mat.dtype)
                    loss = self.agg(
                        loss_mat * seq_mask[:, None],
                        mask,
                        num_tokens=num_tokens,
                        num_seqs=num_seqs,
                        norm_len=self.norm_len,
                    )
                    loss.backward()
                    tokens = float(mask.sum())
                    sums[schema.PG_LOSS] += float(loss.detach())
                    weights[schema.PG_LOSS] = 1.0
                    for key, value in {**out.metrics, **masked.metrics}.items():
                        sums[key] += float(value) * tokens
                        weights[key] += tokens
                    seq_masks.append((masked.seq_mask.detach().cpu(), micro.cpu()))
                clip = t.grad_clip if t.grad_clip > 0 else float("inf")
                grad_norms.append(float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)))
                self.optimizer.step()
        metrics = {k: sums[k] / max(weights[k], 1e-12) for k in sums}
        metrics[schema.PG_LOSS] = sums[schema.PG_LOSS] / max(len(grad_norms), 1)
        metrics[schema.GRAD_NORM] = float(np.mean(grad_norms)) if grad_norms else 0.0
        if self.cfg.mask.name != "none" and seq_masks:
            metrics.update(self._acceptance_metrics(batch, seq_masks))
        self.model.eval()
        return metrics

    def _acceptance_metrics(self, batch: RolloutBatch, seq_masks) -> dict[str, float]:
        from runners.algorithms.trm import acceptance_by_length

        keep = torch.cat([m for m, _ in seq_masks])
        rows = torch.cat([r for _, r in seq_masks])
        lengths = batch.response_mask.sum(-1)[rows]
        out = {schema.TRM_ACCEPT_RATE: float(keep.float().mean())}
        out.update(acceptance_by_length(keep, lengths, list(self.cfg.trainer.length_buckets)))
        return out

    def _update_critic(self, batch, data, values_old, returns) -> dict[str, float]:
        """Clipped value regression; T-PPO trains on whole finished responses with MC returns."""
        from runners.algorithms.objectives import value_loss

        t = self.cfg.trainer
        if self.cfg.rollout.mode == "truncated":
            critic_data = self._finished_sequences(batch)
            if critic_data is None:
                return {}
        else:
            critic_data = {**data, "values_old": values_old, "returns": returns}
        self.critic.train()
        sums: dict[str, float] = defaultdict(float)
        count = 0
        rows_all = torch.arange(critic_data["input_ids"].shape[0], device=self.device)
        for _epoch in range(t.ppo_epochs):
            self.critic_optimizer.zero_grad(set_to_none=True)
            total_tokens = critic_data["mask"].sum().clamp(min=1)
            for s in range(0, len(rows_all), self._micro_rows(len(rows_all))):
                rows = rows_all[s : s + self._micro_rows(len(rows_all))]
                v = self.critic(
                    critic_data["input_ids"][rows], critic_data["attention_mask"][rows], critic_data["context_length"]
                )
                mask = critic_data["mask"][rows]
                out = value_loss(
                    v,
                    critic_data["values_old"][rows],
                    critic_data["returns"][rows],
                    mask,
                    clip_low=t.value_clip_low,
                    clip_high=t.value_clip_high,
                )
                loss = (out.loss_mat * mask).sum() / total_tokens
                loss.backward()
                for key, value in out.metrics.items():
                    sums[key] += float(value)
                count += 1
            clip = t.grad_clip if t.grad_clip > 0 else float("inf")
            torch.nn.utils.clip_grad_norm_(self.critic.parameters(), clip)
            self.critic_optimizer.step()
        self.critic.eval()
        return {k: v / max(count, 1) for k, v in sums.items()}

    def _finished_sequences(self, batch: RolloutBatch) -> dict | None:
        """Prompt + whole response of every slot that finished this step, with MC returns (T-PPO)."""
        slots = [s for s, f in zip(batch.slots, batch.finished.tolist()) if f and s.response_ids]
        if not slots:
            return None
        gamma = float(self.cfg.estimator.get("gamma", 1.0))
        P = max(len(s.prompt_ids) for s in slots)
        R = max(len(s.response_ids) for s in slots)
        B = len(slots)
        ids = torch.full((B, P + R), self.pad_id, dtype=torch.long)
        attn = torch.zeros((B, P + R), dtype=torch.long)
        mask = torch.zeros((B, R))
        returns = torch.zeros((B, R))
        for i, s in enumerate(slots):
            p, r = s.prompt_ids, s.response_ids
            ids[i, P - len(p) : P] = torch.tensor(p)
            attn[i, P - len(p) : P] = 1
            ids[i, P : P + len(r)] = torch.tensor(r)
            attn[i, P : P + len(r)] = 1
            mask[i, : len(r)] = 1
            score = float(batch.scores[batch.slots.index(s)])
            steps_to_end = torch.arange(len(r) - 1, -1, -1, dtype=torch.float32)
            returns[i, : len(r)] = score * gamma**steps_to_end
        data = {
            "input_ids": ids.to(self.device),
            "attention_mask": attn.to(self.device),
            "mask": mask.to(self.device),
            "returns": returns.to(self.device),
            "context_length": P,
        }
        with torch.no_grad():
            data["values_old"] = self.critic(data["input_ids"], data["attention_mask"], P) * data["mask"]
        return data

    # -- evaluation and metrics -------------------------------------------------------------------
    def _evaluate(self) -> dict[str, float]:
        start = time.perf_counter()
        self.model.eval()
        metrics = self.evaluator.evaluate(self.model, generator=torch.Generator().manual_seed(self.cfg.seed + 7))
        metrics[schema.TIMING_TESTING] = time.perf_counter() - start
        return metrics

    def _initial_entropy(self, prompts: int) -> float:
        """H_ini of GTPO: mean token entropy of the initial model on the first training prompts."""
        examples = self.rollout.stream.examples[:prompts]
        return self.evaluator.mean_entropy(
            self.model, examples, generator=torch.Generator().manual_seed(self.cfg.seed + 5)
        )

    def _batch_metrics(self, batch, data, old, advantages, returns, values, entropy) -> dict[str, float]:
        mask = data["mask"]
        finished = batch.finished
        scores = batch.scores[finished] if finished.any() else batch.scores[:0]
        lengths = batch.full_lengths[finished].float() if finished.any() else torch.zeros(0)
        m: dict[str, float] = {schema.ENTROPY: entropy}
        if len(scores):
            m[schema.SCORE_MEAN] = float(scores.mean())
            m[schema.SCORE_MAX] = float(scores.max())
            m[schema.SCORE_MIN] = float(scores.min())
            m[schema.RESPONSE_LENGTH_MEAN] = float(lengths.mean())
            m[schema.RESPONSE_LENGTH_MAX] = float(lengths.max())
            m[schema.RESPONSE_LENGTH_MIN] = float(lengths.min())
            m[schema.RESPONSE_LENGTH_CLIP_RATIO] = float(
                (lengths >= self.cfg.rollout.max_response_length).float().mean()
            )
        valid = mask > 0
        adv = advantages[valid]
        if adv.numel():
            m[schema.ADVANTAGES_MEAN] = float(adv.mean())
            m[schema.ADVANTAGES_MAX] = float(adv.max())
            m[schema.ADVANTAGES_MIN] = float(adv.min())
        if values is not None:
            m[schema.VALUES_MEAN] = float(values[valid].mean())
            m[schema.RETURNS_MEAN] = float(returns[valid].mean())
        m[schema.PROMPT_LENGTH_MEAN] = float(batch.attention_mask[:, : batch.context_length].sum(-1).float().mean())
        from runners.algorithms.entropy import entropy_covariance

        m[schema.ENTROPY_COV] = float(entropy_covariance(old["logp"], advantages, mask))
        return m

    # -- checkpoints --------------------------------------------------------------------------------
    def _state(self, step: int) -> dict:
        return {
            "step": step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "critic": self.critic.state_dict() if self.critic is not None else None,
            "critic_optimizer": self.critic_optimizer.state_dict() if self.critic_optimizer is not None else None,
            "controller": self.controller.state_dict(),
            "rollout": self.rollout.state_dict(),
            "h_ini": self.h_ini,
            "rng": {
                "torch": torch.get_rng_state(),
                "python": random.getstate(),
                "numpy": np.random.get_state(),
                "sample": self.sample_generator.get_state(),
                "shuffle": self.shuffle_generator.get_state(),
            },
        }

    def _save(self, step: int) -> None:
        self.tracker.flush(wait=True)  # metrics up to this step are durable before the checkpoint
        ckpt.save(self.run_dir, self._state(step))

    def _restore(self) -> int:
        state = ckpt.load(self.run_dir)
        if state is None:
            return 0
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.critic is not None and state["critic"] is not None:
            self.critic.load_state_dict(state["critic"])
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.controller.load_state_dict(state["controller"])
        self.rollout.load_state_dict(state["rollout"])
        self.h_ini = state["h_ini"]
        rng = state["rng"]
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        self.sample_generator.set_state(rng["sample"])
        self.shuffle_generator.set_state(rng["shuffle"])
        return int(state["step"])


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def _rss_gb() -> float:
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**30
    except Exception:  # pragma: no cover
        return float("nan")


def _progress(iterable, *, enabled: bool, desc: str):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, unit="step", dynamic_ncols=True, leave=True)


def _postfix(metrics: dict[str, float]) -> dict[str, str]:
    out = {}
    if schema.SCORE_MEAN in metrics:
        out["score"] = f"{metrics[schema.SCORE_MEAN]:.2f}"
    for key, value in metrics.items():
        if key.startswith("val-core/") and "mean_at" in key:
            out["eval"] = f"{value:.2f}"
    if schema.ENTROPY in metrics:
        out["H"] = f"{metrics[schema.ENTROPY]:.2f}"
    return out
