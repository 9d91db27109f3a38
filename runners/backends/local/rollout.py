"""Rollout: prompts -> sampled responses -> rewards, as one padded training batch.

Design: generation works on *slots*. A slot is one response being generated for one prompt (a
group of ``n`` slots shares a prompt). Each training step asks the sampler to extend every active
slot by at most ``window`` tokens:

- ``mode="full"`` (PPO, GRPO, ...): every step starts ``prompts_per_step`` fresh groups and the
  window is the whole response budget, so every slot finishes within the step.
- ``mode="truncated"`` (T-PPO, T-PPO (arXiv 2506.15050) section 3, Algorithm 1): the window is ``l`` tokens;
  slots that finish leave, unfinished ones carry over to the next step with their tokens so far as
  context, and free places are refilled from new prompt groups so the batch size stays constant.

Either way the step's training batch is the tokens generated *in this step* (``segment``) with the
prompt plus earlier tokens as context, so the trainer does not care which mode produced it.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
from torch import Tensor

from runners.models.sampler import left_pad


@dataclass
class Slot:
    """One response under generation."""

    example: Any  # runners.data.types.Example
    prompt_ids: list[int]
    group: int  # global id of the prompt instance (members of a group share it)
    response_ids: list[int] = field(default_factory=list)
    finished: bool = False
    steps: int = 0  # training steps this slot has been part of

    def state(self) -> dict:
        return {
            "example_index": self.example.meta.get("index"),
            "prompt_ids": self.prompt_ids,
            "group": self.group,
            "response_ids": self.response_ids,
            "steps": self.steps,
        }


@dataclass
class RolloutBatch:
    """One step's training data; B = slots, C = context, R = segment length. The rollout manager builds it
    on the CPU; ``to(device)`` gives the copy the trainer's passes read (by attribute)."""

    input_ids: Tensor  # [B, C+R] left-padded context then right-padded segment
    attention_mask: Tensor  # [B, C+R]
    context_length: int  # C: logits of the segment are at positions C-1 .. C+R-2
    responses: Tensor  # [B, R] segment token ids (pad beyond the mask)
    response_mask: Tensor  # [B, R] float
    rollout_logp: Tensor  # [B, R] log-prob of each sampled token under the sampling distribution
    group_index: Tensor  # [B] long
    finished: Tensor  # [B] bool, response complete after this step
    scores: Tensor  # [B] reward of finished responses (0 for unfinished)
    token_rewards: Tensor  # [B, R] score on the last segment token of finished responses
    full_lengths: Tensor  # [B] total response length so far (all windows)
    slots: list[Slot]  # the slots, in batch order (texts, gold answers)
    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0

    @property
    def position_ids(self) -> Tensor:
        return (self.attention_mask.long().cumsum(-1) - 1).clamp(min=0)

    def to(self, device: torch.device | str) -> RolloutBatch:
        """The same batch with every tensor on ``device`` (the trainer's passes read it there; a tensor
        already on ``device`` is shared, not copied)."""
        values = ((f.name, getattr(self, f.name)) for f in fields(self))
        return replace(self, **{name: value.to(device) for name, value in values if isinstance(value, Tensor)})


class PromptStream:
    """Endless shuffled stream over the training examples (reshuffled each epoch, seeded)."""

    def __init__(self, examples: Sequence[Any], seed: int) -> None:
        if not examples:
            raise ValueError("the training split has no examples")
        self.examples = list(examples)
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._shuffle(0)

    def _shuffle(self, epoch: int) -> list[int]:
        order = list(range(len(self.examples)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next(self) -> tuple[int, Any]:
        if self.position >= len(self._order):
            self.epoch += 1
            self.position = 0
            self._order = self._shuffle(self.epoch)
        index = self._order[self.position]
        self.position += 1
        return index, self.examples[index]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = state["epoch"]
        self.position = state["position"]
        self._order = self._shuffle(self.epoch)


GenerateFn = Callable[..., Any]  # runners.models.sampler.generate
RewardFn = Callable[[Any, str], float]  # (example, response_text) -> score


class RolloutManager:
    """Keeps the active slots and turns one generation round into a ``RolloutBatch``."""

    def __init__(
        self,
        *,
        examples: Sequence[Any],
        encode_prompt: Callable[[Any], list[int]],
        decode: Callable[[list[int]], str],
        reward: RewardFn,
        prompts_per_step: int,
        n: int,
        max_response_length: int,
        mode: str = "full",
        window: int | None = None,
        pad_token_id: int,
        eos_token_id: int,
        seed: int = 0,
    ) -> None:
        if mode not in ("full", "truncated"):
            raise ValueError(f"rollout.mode must be 'full' or 'truncated', got {mode!r}")
        self.stream = PromptStream(examples, seed)
        self.encode_prompt = encode_prompt
        self.decode = decode
        self.reward = reward
        self.prompts_per_step = prompts_per_step
        self.n = n
        self.max_response_length = max_response_length
        self.mode = mode
        self.window = max_response_length if mode == "full" else int(window or max_response_length)
        self.pad_token_id = pad_token_id
        self.eos_token_id = eos_token_id
        self.active: list[Slot] = []
        self.queue: deque[Slot] = deque()  # slots of new groups not yet active (truncated mode)
        self.next_group = 0

    @property
    def batch_slots(self) -> int:
        return self.prompts_per_step * self.n

    def _new_group(self) -> list[Slot]:
        index, example = self.stream.next()
        example.meta.setdefault("index", index)
        prompt_ids = self.encode_prompt(example)
        group = self.next_group
        self.next_group += 1
        return [Slot(example=example, prompt_ids=list(prompt_ids), group=group) for _ in range(self.n)]

    def _fill(self) -> None:
        if self.mode == "full":
            self.active = [slot for _ in range(self.prompts_per_step) for slot in self._new_group()]
            return
        self.active = [s for s in self.active if not s.finished]
        while len(self.active) < self.batch_slots:
            if not self.queue:
                self.queue.extend(self._new_group())
            self.active.append(self.queue.popleft())

    def step(self, generate: GenerateFn) -> RolloutBatch:
        """Extend every active slot by up to ``window`` tokens and build the training batch.

        ``generate(input_ids, attention_mask, max_new_tokens)`` must return an object with
        ``responses [B,R]``, ``response_mask [B,R]``, ``logp [B,R]`` and ``finished [B]``.
        """
        self._fill()
        slots = self.active
        ctx, ctx_mask = left_pad([s.prompt_ids + s.response_ids for s in slots], pad_token_id=self.pad_token_id)
        ctx_len = ctx.shape[1]
        budget = torch.tensor([self.max_response_length - len(s.response_ids) for s in slots])
        max_new = int(min(self.window, int(budget.max())))
        out = generate(ctx, ctx_mask, max_new)
        # the sampler's outputs sit on the model's device; the batch is built (and returned) on the CPU
        responses = out.responses.to("cpu", copy=True)
        generated = out.response_mask.to("cpu")
        mask = generated.to(torch.float32, copy=True)
        R = responses.shape[1]
        # slots whose remaining budget is below the window stop at their budget
        over = torch.arange(R)[None, :] >= budget[:, None]
        mask[over] = 0.0
        lengths = mask.sum(-1).long()
        hit_eos = out.finished.to("cpu") & (lengths == generated.sum(-1).long())
        finished = hit_eos | (torch.tensor([len(s.response_ids) for s in slots]) + lengths >= self.max_response_length)
        if self.mode == "full":
            finished = torch.ones(len(slots), dtype=torch.bool)

        # per slot in Python lists (a tensor element read or write per slot costs more than the work)
        scores_list, full_list = [], []
        for slot, row, n, done in zip(slots, responses.tolist(), lengths.tolist(), finished.tolist()):
            slot.response_ids.extend(row[:n])
            slot.steps += 1
            slot.finished = done
            full_list.append(len(slot.response_ids))
            scores_list.append(float(self.reward(slot.example, self.decode(slot.response_ids))) if done else 0.0)
        scores = torch.tensor(scores_list)
        full_lengths = torch.tensor(full_list, dtype=torch.long)
        # the score on the last new token of each finished slot that has one
        token_rewards = torch.zeros_like(mask)
        scored = finished & (lengths > 0)
        token_rewards[scored, lengths[scored] - 1] = scores[scored]
        responses[mask == 0] = self.pad_token_id
        input_ids = torch.cat([ctx, responses], dim=1)
        attention_mask = torch.cat([ctx_mask, mask.long()], dim=1)
        return RolloutBatch(
            input_ids=input_ids,
            attention_mask=attention_mask,
            context_length=ctx_len,
            responses=responses,
            response_mask=mask,
            rollout_logp=out.logp.to("cpu").float() * mask,
            group_index=torch.tensor([s.group for s in slots], dtype=torch.long),
            finished=finished,
            scores=scores,
            token_rewards=token_rewards,
            full_lengths=full_lengths,
            slots=list(slots),
            num_prompt_tokens=int(ctx_mask.sum()),
            num_generated_tokens=int(mask.sum()),
        )

    # -- checkpointing ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        unfinished = [s.state() for s in self.active if not s.finished]
        return {
            "stream": self.stream.state_dict(),
            "next_group": self.next_group,
            "active": unfinished,
            "queue": [s.state() for s in self.queue],
        }

    def load_state_dict(self, state: dict) -> None:
        self.stream.load_state_dict(state["stream"])
        self.next_group = state["next_group"]

        def restore(st: dict) -> Slot:
            example = self.stream.examples[st["example_index"]]
            return Slot(
                example=example,
                prompt_ids=list(st["prompt_ids"]),
                group=st["group"],
                response_ids=list(st["response_ids"]),
                steps=st["steps"],
            )

        self.active = [restore(s) for s in state["active"]]
        self.queue = deque(restore(s) for s in state["queue"])
