"""Benchmark: sampled-token log-probs and entropies from float32 logits at a real vocabulary, time and error.

Design: the forms ``runners.algorithms.numerics`` uses (``x[y] - logsumexp(x)`` and the masked
entropy) against the fused-kernel forms built on ``log_softmax`` (written out here: one pass
forward, one fused softmax pass backward), on the same fp32 logits [1, N, V] whose rows look like a
language model's (five dominant tokens over a Gaussian background), with a random weighting of the
outputs as the loss. The forms alternate in one process, one torch thread by default; each timing
clones the logits into a fresh leaf (both forms pay that copy). Printed per pair: median wall and
CPU seconds and their ratio, and each form's largest error against float64. On CPU the fused forms
are faster but ATen's float32 ``log_softmax`` normaliser loses precision as V grows (about 1e-4 at
V = 151,936 against 2e-6): numerics keeps the composite forms. No assertions: timings are
machine-dependent (tests/algorithms/test_numerics.py checks the precision).

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

import record  # noqa: E402

from runners.algorithms.numerics import entropy_from_logits, token_logprobs  # noqa: E402


def fused_logprobs(x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(x, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def fused_entropy(x: torch.Tensor, tokens=None) -> torch.Tensor:
    logp = torch.log_softmax(x, dim=-1)
    return -torch.where(logp > float("-inf"), logp.exp() * logp, 0.0).sum(-1)


def entropy(x: torch.Tensor, tokens=None) -> torch.Tensor:
    return entropy_from_logits(x)


def step(fn, logits: torch.Tensor, tokens: torch.Tensor, weights: torch.Tensor, grad: bool = True):
    x = logits.clone().requires_grad_(grad)
    with torch.set_grad_enabled(grad):
        out = fn(x, tokens)
        if grad:
            (out * weights).sum().backward()
    if x.is_cuda:
        torch.cuda.synchronize()
    return out.detach()


def compare(title: str, forms: dict, exact: torch.Tensor, args, logits, tokens, weights, grad: bool = True) -> dict:
    """Alternate the forms ``args.repeats`` times; print medians, ratios to the first, and float64 errors;
    returns each form's median wall and CPU seconds and its error."""
    errors = {
        name: float((step(fn, logits, tokens, weights, grad).double() - exact).abs().max())
        for name, fn in forms.items()
    }
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in forms}
    for _ in range(args.repeats):
        for name, fn in forms.items():
            wall, cpu = time.perf_counter(), time.process_time()
            step(fn, logits, tokens, weights, grad)
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    print(f"\n{title}")
    base = None
    out = {}
    for name, rows in times.items():
        wall = statistics.median(w for w, _ in rows)
        cpu = statistics.median(c for _, c in rows)
        base = base or (wall, cpu)
        out[name] = {"wall_s": wall, "cpu_s": cpu, "max_abs_error": errors[name]}
        print(
            f"  {name:24s} wall {wall:7.3f} s  CPU {cpu:7.3f} s  ratio wall {wall / base[0]:.2f}x "
            f"CPU {cpu / base[1]:.2f}x  max |error| vs float64 {errors[name]:.1e}"
        )
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    record.add_option(p)
    args = p.parse_args(argv)
    rec = record.start("bench_logprobs.py", argv=argv)
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, args.tokens, args.vocab, generator=g) * 2
    logits[..., :5] += torch.tensor([12.0, 10.0, 9.0, 8.0, 7.0])
    tokens = torch.randint(0, args.vocab, (1, args.tokens), generator=g)
    tokens[:, ::2] = torch.randint(0, 5, (1, (args.tokens + 1) // 2), generator=g)
    weights = torch.randn(1, args.tokens, generator=g)
    logits, tokens, weights = (t.to(args.device) for t in (logits, tokens, weights))
    exact = torch.log_softmax(logits.double(), -1)
    exact_logp = exact.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    exact_entropy = -(exact.exp() * exact).sum(-1)
    del exact
    print(f"{args.device}: N={args.tokens} V={args.vocab} fp32, {args.threads} thread(s), {args.repeats} repeats")
    log_probs = {"x[y] - logsumexp(x)": token_logprobs, "log_softmax(x)[y]": fused_logprobs}
    entropies = {"entropy_from_logits": entropy, "log_softmax form": fused_entropy}
    results = {
        "log-probs, forward + backward": compare(
            "log-probs, forward + backward", log_probs, exact_logp, args, logits, tokens, weights
        ),
        "entropy, forward + backward": compare(
            "entropy, forward + backward", entropies, exact_entropy, args, logits, tokens, weights
        ),
        "entropy, forward (no autograd)": compare(
            "entropy, forward (no autograd)", entropies, exact_entropy, args, logits, tokens, weights, grad=False
        ),
    }
    figures = []
    for title, forms in results.items():
        (ours, a), (fused, b) = forms.items()
        figures.append(
            record.figure(
                f"{title}, N = {args.tokens}, V = {args.vocab:,}, {args.threads} thread(s): `{fused}` / `{ours}`",
                f"{b['wall_s'] / a['wall_s']:.2f}x wall, {b['cpu_s'] / a['cpu_s']:.2f}x CPU; "
                f"max error vs float64 {b['max_abs_error']:.1e} against {a['max_abs_error']:.1e}",
            )
        )
    rec.write(args.json, figures, {"args": vars(args), "forms": results}, gpu=record.gpu_name(args.device))


if __name__ == "__main__":
    main()
