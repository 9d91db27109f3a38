"""Benchmark: sampled-token log-probs from logits, forward and backward, at a real vocabulary.

Design: ``token_logprobs`` (runners.algorithms.numerics: one fused log-softmax pass forward, one fused
softmax pass scaled in place backward) against the composite ``x[y] - logsumexp(x)`` it replaced
(written out here), on the same fp32 logits [1, N, V], with a random weighting of the log-probs as
the loss. The two alternate in one process, one torch thread by default; each timing clones the
logits into a fresh leaf (both pay that copy). Printed: median wall and CPU seconds, their ratio,
and the largest differences of the values and the gradients (float32 rounding). No assertions:
timings are machine-dependent.

    python tests/benchmarks/bench_logprobs.py                       # N = 512, V = 151,936 (Qwen)
    python tests/benchmarks/bench_logprobs.py --vocab 49152         # SmolLM2's vocabulary
    python tests/benchmarks/bench_logprobs.py --device cuda --tokens 4096
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from runners.algorithms.numerics import token_logprobs  # noqa: E402


def composite(x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The previous form: gather minus logsumexp over V."""
    return x.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(x, dim=-1)


def step(fn, logits: torch.Tensor, tokens: torch.Tensor, weights: torch.Tensor):
    x = logits.clone().requires_grad_(True)
    logp = fn(x, tokens)
    (logp * weights).sum().backward()
    if x.is_cuda:
        torch.cuda.synchronize()
    return logp.detach(), x.grad


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, args.tokens, args.vocab, generator=g) * 2
    tokens = torch.randint(0, args.vocab, (1, args.tokens), generator=g)
    weights = torch.randn(1, args.tokens, generator=g)
    logits, tokens, weights = (t.to(args.device) for t in (logits, tokens, weights))
    forms = {"x[y] - logsumexp(x)": composite, "token_logprobs": token_logprobs}
    (v0, g0), (v1, g1) = (step(fn, logits, tokens, weights) for fn in forms.values())
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in forms}
    for _ in range(args.repeats):
        for name, fn in forms.items():
            wall, cpu = time.perf_counter(), time.process_time()
            step(fn, logits, tokens, weights)
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    print(
        f"{args.device}: N={args.tokens} V={args.vocab} fp32, forward + backward, {args.threads} thread(s), {args.repeats} repeats"
    )
    base = None
    for name, rows in times.items():
        wall = statistics.median(w for w, _ in rows)
        cpu = statistics.median(c for _, c in rows)
        base = base or (wall, cpu)
        print(
            f"{name:22s} wall {wall:7.3f} s  CPU {cpu:7.3f} s  ratio wall {wall / base[0]:.2f}x CPU {cpu / base[1]:.2f}x"
        )
    print(f"max |value diff| {float((v0 - v1).abs().max()):.2e}, max |grad diff| {float((g0 - g1).abs().max()):.2e}")


if __name__ == "__main__":
    main()
