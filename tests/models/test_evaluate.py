"""``evaluate_embedded`` plumbing: decoding, masks and the reward registry.

The sampler is replaced by one that returns given texts, so the expected accuracy is known by
construction: the reference solutions score 1, a response that only echoes the question scores 0.
"""

from __future__ import annotations

import torch

import runners.models.sampler as sampler
from runners.data.embedded import EMBEDDED_ALPHABET, generate_embedded, parse_prompt
from runners.models.evaluate import evaluate_embedded
from runners.models.sampler import GenerationOutput
from runners.models.tokenizer import build_char_tokenizer

# the scripted sampler never calls the model; evaluation only asks it for its device
CPU_MODEL = torch.nn.Linear(1, 1)


def scripted_sampler(tokenizer, respond):
    """A stand-in for ``generate`` answering each prompt with ``respond(prompt_text)`` then EOS."""

    def fake_generate(model, input_ids, attention_mask, *, max_new_tokens, pad_token_id, **_):
        texts = [
            tokenizer.decode(row[mask.bool()], skip_special_tokens=True) for row, mask in zip(input_ids, attention_mask)
        ]
        rows = [tokenizer(respond(t), add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for t in texts]
        width = max(len(r) for r in rows)
        responses = torch.full((len(rows), width), pad_token_id)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            responses[i, : len(r)] = torch.tensor(r)
            mask[i, : len(r)] = 1
        return GenerationOutput(responses, mask, torch.zeros(responses.shape), torch.ones(len(rows), dtype=torch.bool))

    return fake_generate


def test_reference_solutions_score_one_and_echoes_zero(monkeypatch):
    tokenizer = build_char_tokenizer(EMBEDDED_ALPHABET)
    solutions = {e.prompt: e.solution for e in generate_embedded(40, split="test", seed=0)}
    monkeypatch.setattr(sampler, "generate", scripted_sampler(tokenizer, lambda p: solutions[p]))
    result = evaluate_embedded(CPU_MODEL, tokenizer, n=40, batch_size=16)
    assert result["accuracy"] == 1.0 and result["finished"] == 1.0
    expected_length = sum(len(s) + 1 for s in solutions.values()) / 40
    assert abs(result["response_length"] - expected_length) < 1e-9

    def echo(prompt: str) -> str:
        a, op, b = parse_prompt(prompt)
        return f"\\boxed{{{a}{op}{b}}}"

    monkeypatch.setattr(sampler, "generate", scripted_sampler(tokenizer, echo))
    assert evaluate_embedded(CPU_MODEL, tokenizer, n=40, batch_size=16)["accuracy"] == 0.0
