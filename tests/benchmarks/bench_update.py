"""Benchmark: the policy update at Qwen's vocabulary (V = 151,936), dense logits against the chunked head.

Design: a tiny random Qwen3 (``runners.models.tiny``, hidden 64, tied embeddings) with Qwen's output
size, one micro-batch of ``--rows`` x ``--tokens`` response tokens (default 8 x 512 = 4,096) after an
8-token context. Each variant runs the built-in trainer's own ``update_actor`` (one optimiser step:
forward, ``PolicyLoss``, backward, AdamW) after its own old-log-prob pass (``old_pass``), with the
forward returning either the dense logits [rows,T,V] (``dense``: the path every vocabulary took
before the chunked update) or a ``Head`` (``chunked``: ``chunked_head``, what the trainer now uses
from ``chunked_head.MIN_VOCAB`` tokens on). Methods: Clip (GRPO's preset), TROLL (``objective=troll``,
sparse top-64) and TRM-Max (``mask=trm_max``, exact KL from the top-64 store).

Measured per variant, alternating the variants in one process over ``--repeats`` rounds:
- time of the update (``update_actor``): wall and process CPU seconds, medians;
- its peak memory above what was resident before it: the kernel's peak resident set (``VmHWM``,
  reset through ``/proc/self/clear_refs`` before each update, after ``malloc_trim`` returned freed
  memory) minus the resident set then (the old pass's outputs and the model stay resident).
Ratios: dense / chunked per method (time, memory), and TROLL / Clip, TRM-Max / Clip on the chunked path.
No assertions: the figures depend on the machine (targets: chunked peak memory <= 1/3 of dense;
TROLL <= 1.3x Clip's time and <= +10% of its peak memory).

    python tests/benchmarks/bench_update.py                    # 8 x 512 tokens, 1 thread, 3 rounds
    python tests/benchmarks/bench_update.py --rows 2 --tokens 256 --repeats 2   # a quick look
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import record
import rss
import torch

from runners.algorithms.method import Method
from runners.algorithms.policy_loss import PolicyLoss
from runners.backends.local.actor import UpdateSettings, old_pass, update_actor
from runners.backends.local.policy import segment_head, segment_logits
from runners.backends.local.rollout import RolloutBatch
from runners.config import compose
from runners.models.tiny import build_tiny_model

VOCAB = 151936
CONTEXT = 8
METHODS = {
    "Clip": ["algorithm=grpo"],
    "TROLL": ["algorithm=grpo", "objective=troll"],
    "TRM-Max": ["algorithm=grpo", "mask=trm_max"],
}


def make_data(rows: int, tokens: int, seed: int = 0) -> tuple[RolloutBatch, torch.Tensor]:
    """A batch of random finished responses and its advantages (one per row, on every token)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (rows, CONTEXT + tokens), generator=g)
    mask = torch.ones(rows, tokens)
    batch = RolloutBatch(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        context_length=CONTEXT,
        responses=ids[:, CONTEXT:],
        response_mask=mask,
        rollout_logp=torch.full((rows, tokens), -11.0),
        group_index=torch.arange(rows) // 4,
        finished=torch.ones(rows, dtype=torch.bool),
        scores=torch.zeros(rows),
        token_rewards=torch.zeros(rows, tokens),
        full_lengths=torch.full((rows,), tokens),
        slots=[],
    )
    return batch, torch.randn(rows, 1, generator=g).expand(rows, tokens).contiguous()


def run_variant(model, optimizer, method: Method, data: tuple, chunked: bool, rows: int) -> dict:
    """old_pass then one update_actor step; returns wall / CPU seconds and peak memory (MiB) of the update."""
    fwd = segment_head if chunked else segment_logits
    batch, advantages = data

    def forward(b, sel):
        return fwd(model, b.input_ids[sel], b.attention_mask[sel], b.context_length)

    settings = UpdateSettings(
        ppo_epochs=1, mini_batch_share=1.0, micro_batch_size=rows, grad_clip=1.0, logprob_precision="fp32"
    )
    old = old_pass(forward, batch, method=method, micro_batch_size=rows, precision="fp32")
    loss_fn = PolicyLoss(method)
    before = rss.settle()
    wall, cpu = time.perf_counter(), time.process_time()
    update_actor(
        model,
        optimizer,
        forward,
        loss_fn,
        batch,
        old,
        advantages,
        batch.response_mask,
        settings=settings,
        shuffle=torch.Generator().manual_seed(0),
    )
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    peak = rss.kib("VmHWM")
    return {"wall_s": wall, "cpu_s": cpu, "peak_mib": (peak - before) / 1024}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--tokens", type=int, default=512, help="response tokens per row")
    p.add_argument("--repeats", type=int, default=3, help="rounds; each runs every variant once")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of " + ", ".join(METHODS))
    p.add_argument("--json", help="write a machine-readable record here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    rec = record.start("bench_update.py", section="scripts")
    model = build_tiny_model("qwen3", vocab_size=VOCAB, seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: every round sees the same policy
    data = make_data(args.rows, args.tokens)
    methods = {name: Method.from_config(compose(METHODS[name])[0]) for name in args.methods.split(",")}
    variants = [(name, chunked) for name in methods for chunked in (False, True)]
    runs: dict = {v: [] for v in variants}
    for round_ in range(args.repeats + 1):  # round 0 warms up
        order = variants if round_ % 2 else variants[::-1]
        for name, chunked in order:
            result = run_variant(model, optimizer, methods[name], data, chunked, args.rows)
            if round_:
                runs[(name, chunked)].append(result)
    med = {v: {k: statistics.median(r[k] for r in runs[v]) for k in ("wall_s", "cpu_s", "peak_mib")} for v in variants}
    n = args.rows * args.tokens
    print(
        f"update of {args.rows} x {args.tokens} = {n} tokens, V = {VOCAB}, {args.threads} thread(s), {args.repeats} rounds (medians)"
    )
    print(f"{'method':<9}{'path':<9}{'wall s':>8}{'CPU s':>8}{'peak MiB':>10}")
    for name, chunked in variants:
        m = med[(name, chunked)]
        print(
            f"{name:<9}{'chunked' if chunked else 'dense':<9}{m['wall_s']:8.2f}{m['cpu_s']:8.2f}{m['peak_mib']:10.0f}"
        )
    figures, results = [], {"medians": {f"{k[0]}/{'chunked' if k[1] else 'dense'}": v for k, v in med.items()}}
    for name in methods:
        dense, chunk = med[(name, False)], med[(name, True)]
        t, mem = dense["wall_s"] / chunk["wall_s"], chunk["peak_mib"] / dense["peak_mib"]
        print(f"{name}: dense / chunked time {t:.2f}x; chunked peak memory {mem:.3f} of dense")
        figures.append(record.figure(f"{name} update time, dense / chunked (V = 151,936, N = {n})", f"{t:.2f}x"))
        figures.append(record.figure(f"{name} update peak memory, chunked / dense", f"{mem:.3f}", "<= 0.333"))
    if "Clip" in methods:
        for name in (m for m in methods if m != "Clip"):
            t = med[(name, True)]["wall_s"] / med[("Clip", True)]["wall_s"]
            mem = med[(name, True)]["peak_mib"] / med[("Clip", True)]["peak_mib"]
            print(f"{name} / Clip (chunked): time {t:.2f}x, peak memory {mem:.2f}x")
            target = ("<= 1.3x", "<= 1.10x") if name == "TROLL" else ("", "")
            figures.append(record.figure(f"{name} / Clip update time (chunked)", f"{t:.2f}x", target[0]))
            figures.append(record.figure(f"{name} / Clip update peak memory (chunked)", f"{mem:.2f}x", target[1]))
    if args.json:
        rec.write(args.json, figures=figures, results=results)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
