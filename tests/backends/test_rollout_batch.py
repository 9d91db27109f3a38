"""The rollout manager's training batch against its slots, recomputed row by row.

A scripted sampler gives row i of each round (i % 4) new tokens (none for every fourth row), the last
one EOS on every third row; over several rounds of both modes (full responses; T-PPO windows of 3
tokens under a budget of 5) every row of the batch must agree with its slot: the slot's response
grew by the row's new tokens, the score is the reward of the slot's whole decoded response (0 while
unfinished), placed on the row's last new token, and padding fills the rest.
"""

from __future__ import annotations

import pytest
import torch

from runners.backends.local.rollout import RolloutManager
from runners.data.types import Example
from runners.models.sampler import GenerationOutput

PAD, EOS = 0, 1


def _manager(mode: str) -> RolloutManager:
    examples = [Example(prompt=f"q{i}", answer="1", data_source="t", reward_fn="exact") for i in range(5)]
    return RolloutManager(
        examples=examples,
        encode_prompt=lambda e: [5, 6, 7][: 1 + int(e.prompt[1:]) % 3],
        decode=lambda ids: " ".join(map(str, ids)),
        reward=lambda example, text: float(len(text)) + 0.5,
        prompts_per_step=3,
        n=2,
        max_response_length=5,
        mode=mode,
        window=3,
        pad_token_id=PAD,
        eos_token_id=EOS,
    )


def _sampler(round_: int):
    def generate(input_ids, attention_mask, max_new_tokens):
        B, R = input_ids.shape[0], max_new_tokens
        responses = torch.full((B, R), PAD, dtype=torch.long)
        mask = torch.zeros(B, R, dtype=torch.long)
        finished = torch.zeros(B, dtype=torch.bool)
        for i in range(B):
            n = min(i % 4, R)
            responses[i, :n] = torch.arange(10 + round_, 10 + round_ + n)
            mask[i, :n] = 1
            if i % 3 == 0 and n:
                responses[i, n - 1], finished[i] = EOS, True
        return GenerationOutput(responses, mask, -torch.rand(B, R) * mask, finished)

    return generate


@pytest.mark.parametrize("mode", ["full", "truncated"])
def test_batch_rows_agree_with_their_slots(mode):
    manager = _manager(mode)
    scored = 0
    for round_ in range(4):
        before = {id(s): list(s.response_ids) for s in manager.active}
        batch = manager.step(_sampler(round_))
        for i, slot in enumerate(batch.slots):
            n = int(batch.response_mask[i].sum())
            new = batch.responses[i, :n].tolist()
            assert slot.response_ids == before.get(id(slot), []) + new
            assert batch.responses[i, n:].eq(PAD).all() and batch.response_mask[i, n:].eq(0).all()
            assert int(batch.full_lengths[i]) == len(slot.response_ids)
            assert bool(batch.finished[i]) == slot.finished
            expected = float(len(" ".join(map(str, slot.response_ids)))) + 0.5 if slot.finished else 0.0
            assert float(batch.scores[i]) == expected
            rewards = batch.token_rewards[i]
            if slot.finished and n > 0:
                assert float(rewards[n - 1]) == expected and int(rewards.ne(0).sum()) == 1
                scored += 1
            else:
                assert rewards.eq(0).all()
    assert scored >= 4  # the scored path ran (rows of every fourth index finish with no new token)
