"""Benchmark: the output layer's log-probs and entropies, dense logits vs ``chunked_head``, time and peak memory.

Design: the update's head at a real vocabulary, from last hidden states h [N,H] and the output
matrix W [V,H] (tiny Qwen3 shape: V = 151,936, H = 64, ``runners/models/tiny.py``) to the loss
``sum(a * logp + c * entropy)`` and its backward w.r.t. h and W:

- ``dense``: ``z = h @ W.T`` (the [N,V] float32 logits), ``numerics.token_logprobs`` and
  ``numerics.entropy_from_logits``, autograd (today's trainer);
- ``chunked``: ``runners.algorithms.chunked_head.chunked_head`` (``--chunk-sizes``; "auto" = the
  default), the logits never held for all N rows.

With ``--sparse`` also the no-grad old pass: dense ``token_logprobs`` + entropy + ``sparsify``
(K = 64) against ``chunked_head(..., sparse={})`` under ``torch.no_grad``.

Time: the variants alternate in one process (``--repeats`` rounds), one torch thread by default;
printed: median wall and CPU (``time.process_time``) seconds and their ratios to dense. Peak
memory: each variant runs once in a fresh subprocess; on CPU the growth of the peak resident set
from after the inputs are built to after the step (the peak mark is reset first through
``/proc/self/clear_refs`` and read as ``VmHWM``; without that, ``resource.getrusage``'s
``ru_maxrss``, which the setup's own peak can hide), on CUDA ``torch.cuda.max_memory_allocated``
above the inputs. Also printed: each variant's largest
log-prob error against float64 (from the first timing round). No assertions: figures are
machine-dependent (tests/algorithms/test_chunked_head.py checks values, gradients and saved sizes).
The dense variant at N = 4,096 needs ~20 GB of RAM on CPU: ``--skip-dense-above`` leaves it out
above a token count (its memory grows linearly in N; the chunked one's does not).

    python tests/benchmarks/bench_chunked_head.py                        # N = 1,024
    python tests/benchmarks/bench_chunked_head.py --tokens 4096 --skip-dense-above 2048
    python tests/benchmarks/bench_chunked_head.py --device cuda --tokens 4096 --threads 4
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import record
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from runners.algorithms.chunked_head import chunked_head, default_chunk_size  # noqa: E402
from runners.algorithms.numerics import entropy_from_logits, token_logprobs  # noqa: E402
from runners.algorithms.troll_sparse import sparsify  # noqa: E402


def make_inputs(tokens: int, hidden: int, vocab: int, device: str, seed: int = 0):
    """Peaked rows like test_numerics' (five dominant tokens over a Gaussian background of std ~2)."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab, hidden, generator=g) * (2.0 / hidden**0.5)
    h = torch.randn(tokens, hidden, generator=g)
    h[:, 0] = 1.0
    weight[:, 0] = 0.0
    weight[:5, 0] = torch.tensor([12.0, 10.0, 9.0, 8.0, 7.0])
    y = torch.randint(0, vocab, (tokens,), generator=g)
    y[::2] = torch.randint(0, 5, (y[::2].numel(),), generator=g)
    a, c = torch.randn(tokens, generator=g), torch.randn(tokens, generator=g) * 0.01
    return tuple(t.to(device) for t in (h, weight, y, a, c))


def dense_step(h, w, y, a, c, chunk=None):
    h, w = h.detach().requires_grad_(True), w.detach().requires_grad_(True)
    z = (h @ w.T)[None]
    logp = token_logprobs(z, y[None])[0]
    ((logp * a).sum() + (entropy_from_logits(z)[0] * c).sum()).backward()
    return logp.detach()


def chunked_step(h, w, y, a, c, chunk=None):
    h, w = h.detach().requires_grad_(True), w.detach().requires_grad_(True)
    out = chunked_head(h, w, y, chunk_size=chunk)
    ((out.logp * a).sum() + (out.entropy * c).sum()).backward()
    return out.logp.detach()


def dense_old_pass(h, w, y, a, c, chunk=None):
    with torch.no_grad():
        z = h @ w.T
        logp = token_logprobs(z[None], y[None])[0]
        entropy_from_logits(z)
        sparsify(z, y, renormalize=False)
    return logp


def chunked_old_pass(h, w, y, a, c, chunk=None):
    with torch.no_grad():
        return chunked_head(h, w, y, chunk_size=chunk, sparse={}).logp


STEPS = {
    "dense": dense_step,
    "chunked": chunked_step,
    "dense old pass": dense_old_pass,
    "chunked old pass": chunked_old_pass,
}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _variants(args) -> list[tuple[str, str, int | None]]:
    """(label, step name, chunk size) in the order they alternate."""
    chunks = [None if c == "auto" else int(c) for c in args.chunk_sizes.split(",")]
    out = []
    for prefix in ("",) + ((" old pass",) if args.sparse else ()):
        if args.tokens <= args.skip_dense_above:
            out.append((f"dense{prefix}", f"dense{prefix}", None))
        for c in chunks:
            shown = c or default_chunk_size(args.vocab, args.device)
            out.append((f"chunked{prefix} ({shown} rows{', auto' if c is None else ''})", f"chunked{prefix}", c))
    return out


def worker(args) -> None:
    """One variant once, in this fresh process: print its peak-memory growth in MiB as JSON."""
    torch.set_num_threads(args.threads)
    inputs = make_inputs(args.tokens, args.hidden, args.vocab, args.device)
    step = STEPS[args.worker]
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step(*inputs, chunk=args.chunk)
        torch.cuda.synchronize()
        grown = torch.cuda.max_memory_allocated() - before
    else:
        reset = _reset_peak_rss()
        before = _rss_kib("VmRSS") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        step(*inputs, chunk=args.chunk)
        after = _rss_kib("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        grown = (after - before) * 1024
    print(json.dumps({"peak_mib": grown / 2**20}))


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (Linux >= 4.0), so the setup's own peak does not hide the step's."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _rss_kib("VmHWM") > 0
    except OSError:
        return False


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def peak_memory(args, name: str, chunk: int | None) -> float:
    cmd = [sys.executable, __file__, "--worker", name, "--tokens", str(args.tokens), "--vocab", str(args.vocab)]
    cmd += ["--hidden", str(args.hidden), "--threads", str(args.threads), "--device", args.device]
    if chunk is not None:
        cmd += ["--chunk", str(chunk)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["peak_mib"]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--hidden", type=int, default=64, help="tiny Qwen3's hidden size (runners/models/tiny.py)")
    p.add_argument("--chunk-sizes", default="auto,128,512", help="comma-separated rows per chunk; auto = default")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--sparse", action="store_true", help="also the no-grad old pass with the top-64 store")
    p.add_argument("--skip-dense-above", type=int, default=1 << 30, help="no dense variant above this many tokens")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--chunk", type=int, default=None, help=argparse.SUPPRESS)
    record.add_option(p)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    rec = record.start("bench_chunked_head.py", argv=argv)
    torch.set_num_threads(args.threads)
    variants = _variants(args)
    memory = {label: peak_memory(args, name, chunk) for label, name, chunk in variants}
    inputs = make_inputs(args.tokens, args.hidden, args.vocab, args.device)
    h, w, y = inputs[0], inputs[1], inputs[2]
    exact = torch.log_softmax(h.double() @ w.double().T, -1).gather(-1, y[:, None]).squeeze(-1)
    times: dict[str, list[tuple[float, float]]] = {label: [] for label, _, _ in variants}
    errors: dict[str, float] = {}
    for _ in range(args.repeats):
        for label, name, chunk in variants:
            _sync(args.device)
            wall, cpu = time.perf_counter(), time.process_time()
            logp = STEPS[name](*inputs, chunk=chunk)
            _sync(args.device)
            times[label].append((time.perf_counter() - wall, time.process_time() - cpu))
            errors.setdefault(label, float((logp.double() - exact).abs().max()))
    print(
        f"{args.device}: N={args.tokens} V={args.vocab} H={args.hidden} fp32, {args.threads} thread(s), "
        f"{args.repeats} repeats; peak memory = growth above the inputs, one fresh process per variant"
    )
    base: dict[str, tuple[float, float, float]] = {}
    rows, figures = [], []
    for label, name, _ in variants:
        wall = statistics.median(t for t, _ in times[label])
        cpu = statistics.median(c for _, c in times[label])
        kind = "old pass" if "old pass" in name else "update"
        ref = base.setdefault(kind, (wall, cpu, memory[label])) if name.startswith("dense") else base.get(kind)
        ratio = (
            f"wall {wall / ref[0]:5.2f}x CPU {cpu / ref[1]:5.2f}x memory {memory[label] / ref[2]:6.3f}x" if ref else ""
        )
        print(
            f"  {label:34s} wall {wall:7.3f} s  CPU {cpu:7.3f} s  peak {memory[label]:8.1f} MiB  {ratio}  "
            f"max |logp error| vs float64 {errors[label]:.1e}"
        )
        row = {"variant": label, "wall_s": wall, "cpu_s": cpu, "peak_mib": memory[label], "error": errors[label]}
        rows.append(row)
        if ref and not name.startswith("dense"):
            figures.append(
                record.figure(
                    f"{label} / dense, N = {args.tokens:,}, V = {args.vocab:,}, {args.threads} thread(s)",
                    f"{wall / ref[0]:.2f}x wall, {cpu / ref[1]:.2f}x CPU, peak memory {memory[label] / ref[2]:.3f}x",
                )
            )
    rec.write(args.json, figures, {"args": vars(args), "variants": rows}, gpu=record.gpu_name(args.device))


if __name__ == "__main__":
    main()
