"""Periodic evaluation: mean@n (pass@1 estimate), pass@k and maj@k on a held-out split.

Every evaluation prompt gets ``n`` samples at the evaluation temperature. Per data source:

- ``val-core/<data>/acc/mean_at_<n>``: mean reward over all samples (the pass@1 estimate);
- ``val-core/<data>/acc/best_at_<k>/mean``: pass@k with the unbiased estimator
  1 - C(n - c, k) / C(n, k) (c correct of n; Chen et al. 2021), for k = 2, 4, ... <= n;
- ``val-core/<data>/acc/maj_at_<k>/mean``: the reward of the most frequent extracted final answer
  among the first k samples (ties: the earliest), for the same k;
- ``val-aux/<data>/response_length/mean`` and ``val-aux/<data>/entropy/mean``.

The per-prompt scores of the last ``evaluate`` call are kept (``Evaluator.per_prompt``: per data source, each
prompt's key and its ``n`` scores, in the evaluator's order) and logged by ``Evaluator.log_per_prompt`` as the
run's JSON artifact ``metric_names.per_prompt_artifact(step)``: the evaluation's sampling error over prompts
(``analysis.eval_error``) is computed from it. A prompt's key is its dataset index (``Example.meta["index"]``),
else its position in the evaluator's list (also where indices repeat within a data source). Keeping and logging
them draws nothing: the evaluation's numbers are the same with or without.
"""

from __future__ import annotations

import json
import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from math import comb
from typing import Any

import torch

from runners import metric_names
from runners.algorithms.numerics import entropy_from_logits
from runners.backends.local.policy import segment_logits
from runners.data.answers import extract_answer_line, extract_gsm8k_answer, extract_last_boxed
from runners.models.sampler import generate, left_pad

ANSWER_EXTRACTORS: dict[str, Callable[[str], str | None]] = {
    "embedded_int": extract_last_boxed,
    "math": extract_last_boxed,
    "math_answer_line": extract_answer_line,
    "gsm8k": lambda text: extract_gsm8k_answer(text) or extract_last_boxed(text),
}
_log = logging.getLogger(__name__)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from c correct of n samples."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def ks_for(n: int) -> list[int]:
    ks, k = [], 2
    while k <= n:
        ks.append(k)
        k *= 2
    return ks


def majority_score(answers: Sequence[str | None], scores: Sequence[float]) -> float:
    """Reward of the most common non-empty answer (earliest on ties); 0 when none was extracted."""
    counted = Counter(a for a in answers if a)
    if not counted:
        return 0.0
    best = max(counted.values())
    for answer, score in zip(answers, scores):
        if answer and counted[answer] == best:
            return float(score)
    return 0.0  # pragma: no cover


def per_prompt_scores(examples: Sequence[Any], scores: dict[int, list[float]]) -> dict[str, dict[str, list]]:
    """{data source: {"keys": [...], "scores": [[...], ...]}} in the order of ``examples``; ``scores`` maps
    ``id(example)`` to the example's sample scores. Keys: dataset indices where they are unique within the
    source, else positions in ``examples``."""
    out: dict[str, dict[str, list]] = {}
    seen: set[int] = set()
    for position, example in enumerate(examples):
        if id(example) not in scores or id(example) in seen:
            continue
        seen.add(id(example))
        meta = getattr(example, "meta", None)
        index = meta.get("index") if isinstance(meta, dict) else None
        key = index if isinstance(index, (int, str)) and not isinstance(index, bool) else None
        entry = out.setdefault(example.data_source, {"keys": [], "positions": [], "scores": []})
        entry["keys"].append(key)
        entry["positions"].append(position)
        entry["scores"].append(list(scores[id(example)]))
    for entry in out.values():
        positions = entry.pop("positions")
        keys = entry["keys"]
        if None in keys or len(set(keys)) < len(keys):
            entry["keys"] = positions
    return out


class Evaluator:
    """Samples ``n`` responses per evaluation prompt and reports the metrics above."""

    def __init__(
        self,
        *,
        examples: Sequence[Any],
        encode: Callable[[Any], list[int]],
        decode: Callable[[list[int]], str],
        reward: Callable[[Any, str], float],
        n: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        pad_token_id: int,
        eos_token_id: int,
        batch_size: int = 64,
    ) -> None:
        self.examples = list(examples)
        self.encode = encode
        self.decode = decode
        self.reward = reward
        self.n = n
        self.temperature = temperature
        self.top_p = top_p
        self.max_new_tokens = max_new_tokens
        self.pad = pad_token_id
        self.eos = eos_token_id
        self.batch_size = batch_size
        # {data source: {"keys": [...], "scores": [[n scores], ...]}} of the last evaluate() (module docstring)
        self.per_prompt: dict[str, dict[str, list]] | None = None

    def _batches(self, examples: Sequence[Any], n: int, device: torch.device):
        """Each example ``n`` times, in left-padded batches of ``batch_size`` prompts."""
        items = [(e, self.encode(e)) for e in examples for _ in range(n)]
        for s in range(0, len(items), self.batch_size):
            chunk = items[s : s + self.batch_size]
            ids, mask = left_pad([p for _, p in chunk], pad_token_id=self.pad)
            yield [e for e, _ in chunk], ids.to(device), mask.to(device)

    def _sample(self, model, ids: torch.Tensor, mask: torch.Tensor, generator: torch.Generator):
        """Sample one response per row; also its per-token entropy [B,R] at the evaluation temperature."""
        out = generate(
            model,
            ids,
            mask,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            eos_token_id=self.eos,
            pad_token_id=self.pad,
            generator=generator,
        )
        full = torch.cat([ids, out.responses], dim=1)
        attn = torch.cat([mask, out.response_mask.long()], dim=1)
        entropy = entropy_from_logits(segment_logits(model, full, attn, ids.shape[1], self.temperature))
        return out, entropy * out.response_mask.float()

    @torch.inference_mode()
    def evaluate(self, model, *, generator: torch.Generator) -> dict[str, float]:
        device = next(model.parameters()).device
        per_example: dict[int, list[tuple[float, str | None, int]]] = defaultdict(list)
        sources: dict[int, str] = {}
        entropies: dict[str, list[float]] = defaultdict(list)
        for exs, ids, mask in self._batches(self.examples, self.n, device):
            out, entropy = self._sample(model, ids, mask, generator)
            lengths = out.response_mask.sum(-1).tolist()
            mean_entropy = (entropy.sum(-1) / out.response_mask.float().sum(-1).clamp(min=1)).tolist()
            for i, example in enumerate(exs):
                text = self.decode(out.responses[i, : int(lengths[i])].tolist())
                score = float(self.reward(example, text))
                extractor = ANSWER_EXTRACTORS.get(example.reward_fn)
                answer = extractor(text) if extractor else None
                per_example[id(example)].append((score, answer, int(lengths[i])))
                sources[id(example)] = example.data_source
                entropies[example.data_source].append(mean_entropy[i])
        self.per_prompt = per_prompt_scores(self.examples, {k: [s for s, _, _ in v] for k, v in per_example.items()})
        return self._summarise(per_example, sources, entropies)

    def log_per_prompt(self, tracker, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """Log the last evaluation's per-prompt scores as the artifact ``metric_names.per_prompt_artifact(step)``
        through ``tracker.log_text``; returns ``metrics`` unchanged. Never fails the run: a tracker without
        ``log_text`` logs nothing, a failed write is a warning."""
        log_text = getattr(tracker, "log_text", None)
        if log_text is None or self.per_prompt is None:
            return metrics
        text = json.dumps({"step": int(step), "n": self.n, "sources": self.per_prompt})
        try:
            log_text(text, metric_names.per_prompt_artifact(int(step)))
        except Exception as err:  # noqa: BLE001 - an analysis artifact, never a reason to fail the run
            _log.warning("per-prompt evaluation results of step %d not logged (%s: %s)", step, type(err).__name__, err)
        return metrics

    def _summarise(self, per_example, sources, entropies) -> dict[str, float]:
        by_source: dict[str, list[list[tuple[float, str | None, int]]]] = defaultdict(list)
        for key, samples in per_example.items():
            by_source[sources[key]].append(samples)
        metrics: dict[str, float] = {}
        for data, groups in by_source.items():
            scores = [s for g in groups for s, _, _ in g]
            metrics[metric_names.val_acc_mean(data, self.n)] = sum(scores) / len(scores)
            for k in ks_for(self.n):
                metrics[metric_names.val_acc_best(data, k)] = sum(
                    pass_at_k(len(g), sum(s >= 1.0 for s, _, _ in g), k) for g in groups
                ) / len(groups)
                metrics[metric_names.val_acc_maj(data, k)] = sum(
                    majority_score([a for _, a, _ in g[:k]], [s for s, _, _ in g[:k]]) for g in groups
                ) / len(groups)
            lengths = [ln for g in groups for _, _, ln in g]
            metrics[metric_names.val_response_length(data)] = sum(lengths) / len(lengths)
            metrics[metric_names.val_entropy(data)] = sum(entropies[data]) / max(len(entropies[data]), 1)
        return metrics

    @torch.inference_mode()
    def mean_entropy(self, model, examples: Sequence[Any], *, generator: torch.Generator) -> float:
        """Mean token entropy of one sampled response per example (GTPO's H_ini)."""
        device = next(model.parameters()).device
        total, count = 0.0, 0.0
        for _exs, ids, mask in self._batches(examples, 1, device):
            out, entropy = self._sample(model, ids, mask, generator)
            total += float(entropy.sum())
            count += float(out.response_mask.sum())
        return total / max(count, 1.0)
