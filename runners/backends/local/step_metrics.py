"""Per-iteration metrics of the built-in trainer, under the names of ``runners.metric_names``.

Phase timing (``timing_s/<phase>``), the training batch's scores, lengths, advantages and values
(verl's ``critic/*`` and ``response_length/*`` names), TRM acceptance by response length, and the
progress bar's summary.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator

import torch

from runners import metric_names as names
from runners.backends.base import progress_postfix as postfix  # noqa: F401  (re-exported)
from runners.backends.local.rollout import RolloutBatch
from runners.perf.hardware import load_metrics  # noqa: F401  (re-exported)


class PhaseTimer:
    """Wall-clock and process CPU seconds per phase of one iteration (``timing_s/<phase>``,
    ``timing_cpu_s/<phase>``): on a shared machine wall time alone mixes in other work; CPU time
    (every thread of this process) does not, and CPU < wall with load above the cores says so."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.cpu_seconds: dict[str, float] = defaultdict(float)
        self.start, self.cpu_start = time.perf_counter(), time.process_time()

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start
            self.cpu_seconds[phase] += time.process_time() - cpu

    def metrics(self) -> dict[str, float]:
        """Every phase, plus ``step`` (the whole iteration so far), wall and CPU."""
        out = {f"timing_s/{k}": v for k, v in self.seconds.items()}
        out.update({f"{names.TIMING_CPU_PREFIX}{k}": v for k, v in self.cpu_seconds.items()})
        out[names.TIMING_STEP] = time.perf_counter() - self.start
        out[names.TIMING_CPU_STEP] = time.process_time() - self.cpu_start
        return out


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def rss_gb() -> float:
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**30
    except Exception:  # pragma: no cover
        return float("nan")


def batch_metrics(
    batch: RolloutBatch,
    response_mask: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor | None,
    entropy: float,
    max_response_length: int,
) -> dict[str, float]:
    """Scores and lengths of the finished responses, advantages, values, prompt length, entropy covariance."""
    finished = batch.finished
    scores = batch.scores[finished] if finished.any() else batch.scores[:0]
    lengths = batch.full_lengths[finished].float() if finished.any() else torch.zeros(0)
    m: dict[str, float] = {names.ENTROPY: entropy}
    if len(scores):
        m[names.SCORE_MEAN] = float(scores.mean())
        m[names.SCORE_MAX] = float(scores.max())
        m[names.SCORE_MIN] = float(scores.min())
        m[names.RESPONSE_LENGTH_MEAN] = float(lengths.mean())
        m[names.RESPONSE_LENGTH_MAX] = float(lengths.max())
        m[names.RESPONSE_LENGTH_MIN] = float(lengths.min())
        m[names.RESPONSE_LENGTH_CLIP_RATIO] = float((lengths >= max_response_length).float().mean())
    valid = response_mask > 0
    adv = advantages[valid]
    if adv.numel():
        m[names.ADVANTAGES_MEAN] = float(adv.mean())
        m[names.ADVANTAGES_MAX] = float(adv.max())
        m[names.ADVANTAGES_MIN] = float(adv.min())
    if values is not None:
        m[names.VALUES_MEAN] = float(values[valid].mean())
        m[names.RETURNS_MEAN] = float(returns[valid].mean())
    m[names.PROMPT_LENGTH_MEAN] = float(batch.attention_mask[:, : batch.context_length].sum(-1).float().mean())
    from runners.algorithms.entropy import entropy_covariance

    m[names.ENTROPY_COV] = float(entropy_covariance(old_logp, advantages, response_mask))
    return m


def acceptance_metrics(batch: RolloutBatch, seq_masks, length_buckets) -> dict[str, float]:
    """TRM acceptance over the iteration's micro-batches, overall and by response length."""
    from runners.algorithms.trm import acceptance_by_length

    keep = torch.cat([m for m, _ in seq_masks])
    rows = torch.cat([r for _, r in seq_masks])
    lengths = batch.response_mask.sum(-1)[rows]
    out = {names.TRM_ACCEPT_RATE: float(keep.float().mean())}
    out.update(acceptance_by_length(keep, lengths, list(length_buckets)))
    return out


def throughput_metrics(batch: RolloutBatch, timing: dict[str, float]) -> dict[str, float]:
    tokens = batch.num_prompt_tokens + batch.num_generated_tokens
    return {
        names.TOTAL_NUM_TOKENS: tokens,
        names.THROUGHPUT: tokens / max(timing[names.TIMING_STEP], 1e-9),
        names.GEN_THROUGHPUT: batch.num_generated_tokens / max(timing[names.TIMING_GEN], 1e-9),
        names.CPU_MEMORY_USED_GB: rss_gb(),
    }


def progress(iterable, *, enabled: bool, desc: str):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, unit="step", dynamic_ncols=True, leave=True)


__all__ = [
    "PhaseTimer",
    "load_metrics",
    "acceptance_metrics",
    "batch_metrics",
    "masked_mean",
    "postfix",
    "progress",
    "rss_gb",
    "throughput_metrics",
]
