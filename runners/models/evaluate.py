"""Accuracy of a policy on the embedded task's test split (a model-side sanity measure).

Design: the same pieces the trainer uses, nothing private: problems from
``runners.data.embedded.generate_embedded(split="test")``, prompts encoded as the data package
encodes plain prompts (``<bos>`` + text, left-padded), responses from the KV-cache sampler, and the
score from the data package's reward registry (``embedded_int``: the last ``\\boxed{}`` must hold
exactly the gold integer). Used to report the embedded default's starting accuracy and by tests.

    python -m runners.models.embedded      # prints greedy and sampled accuracy of the default
"""

from __future__ import annotations

from typing import Any


def evaluate_embedded(
    model,
    tokenizer,
    *,
    n: int = 512,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    digits: int = 3,
    ops: str = "+-*",
    max_new_tokens: int = 96,
    batch_size: int = 256,
    long_fraction: float = 0.0,
    long_digits: int = 0,
) -> dict[str, Any]:
    """Mean reward over ``n`` test problems, one sample each (``temperature=0``: greedy).

    Returns {"accuracy", "response_length" (mean tokens, EOS included), "finished" (fraction that
    emitted EOS), "n"}.
    """

    from runners.data.embedded import generate_embedded
    from runners.data.rewards import REWARDS
    from runners.models.sampler import generate, make_generator

    examples = generate_embedded(
        n, split="test", seed=seed, digits=digits, ops=ops, long_fraction=long_fraction, long_digits=long_digits
    )
    generator = make_generator(next(model.parameters()).device, seed)
    rewards: list[float] = []
    lengths: list[float] = []
    finished: list[float] = []
    for start in range(0, n, batch_size):
        chunk = examples[start : start + batch_size]
        batch = tokenizer([e.prompt for e in chunk], padding=True, return_tensors="pt")
        out = generate(
            model,
            batch["input_ids"],
            batch["attention_mask"],
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            generator=generator,
        )
        for row, example in enumerate(chunk):
            tokens = out.responses[row][out.response_mask[row].bool()]
            text = tokenizer.decode(tokens, skip_special_tokens=True)
            rewards.append(REWARDS.get(example.reward_fn)(text, example.answer, prompt=example.prompt))
        lengths.extend(out.response_mask.sum(dim=1).tolist())
        finished.extend(out.finished.float().tolist())
    return {
        "accuracy": sum(rewards) / n,
        "response_length": sum(lengths) / n,
        "finished": sum(finished) / n,
        "n": n,
    }
