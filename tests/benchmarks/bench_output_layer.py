"""Benchmark: the output layer's float32 matmul on CPU, ``F.linear`` against ``output_logits``'s column blocks.

Design: the logits ``x W^T`` of ``--rows`` rows at SmolLM2-135M's width (H = 576) for each vocabulary in
``--vocabs`` (SmolLM2's 49,152, Qwen's 151,936): the shapes of a decode step (the rollout's batch of
rows) and of one ``chunked_head`` chunk (``default_chunk_size``: 170 rows at V = 49,152, 55 at
151,936). ``F.linear`` is one BLAS call over all V columns; ``runners.algorithms.chunked_head.output_logits``
makes one call per ``VOCAB_BLOCK`` columns into the same output. The two alternate in one process
(``--repeats`` rounds, one torch thread by default) and each is checked equal to the other, bit for bit,
first. Printed per shape: median wall and CPU seconds of ``--calls`` calls, GFLOP/s of each, and the
ratio F.linear / output_logits (above 1: the blocks are faster). No assertions: figures depend on the
machine's BLAS and caches (tests/algorithms/test_chunked_head.py checks the values).

    python tests/benchmarks/bench_output_layer.py
    python tests/benchmarks/bench_output_layer.py --threads 2 --rows 16 64 85 256
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import record  # noqa: E402
import torch  # noqa: E402

from runners.algorithms.chunked_head import VOCAB_BLOCK, default_chunk_size, output_logits  # noqa: E402


def _time(fn, calls: int) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(rows: int, vocab: int, hidden: int, repeats: int, calls: int) -> dict:
    g = torch.Generator().manual_seed(rows + vocab)
    weight = torch.randn(vocab, hidden, generator=g) * hidden**-0.5
    x = torch.randn(rows, hidden, generator=g)
    if not torch.equal(output_logits(x, weight), torch.nn.functional.linear(x, weight)):
        raise SystemExit(f"output_logits differs from F.linear at rows={rows}, V={vocab}")
    variants = {"F.linear": lambda: torch.nn.functional.linear(x, weight), "blocks": lambda: output_logits(x, weight)}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for fn in variants.values():  # warm-up
        fn()
    for _ in range(repeats):
        for name, fn in variants.items():
            times[name].append(_time(fn, calls))
    flop = 2.0 * rows * hidden * vocab * calls
    out = {"rows": rows, "vocab": vocab, "hidden": hidden, "calls": calls}
    for name, pairs in times.items():
        wall = statistics.median(w for w, _ in pairs)
        cpu = statistics.median(c for _, c in pairs)
        out[name] = {"wall_s": wall, "cpu_s": cpu, "gflops": flop / wall / 1e9}
    out["ratio_wall"] = out["F.linear"]["wall_s"] / out["blocks"]["wall_s"]
    out["ratio_cpu"] = out["F.linear"]["cpu_s"] / out["blocks"]["cpu_s"]
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocabs", type=int, nargs="+", default=[49152, 151936])
    p.add_argument("--rows", type=int, nargs="*", default=[16, 64], help="also each vocabulary's chunk rows")
    p.add_argument("--hidden", type=int, default=576, help="SmolLM2-135M's hidden size")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--calls", type=int, default=5, help="calls per timed round")
    p.add_argument("--threads", type=int, default=1)
    record.add_option(p)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    rec = record.start("bench_output_layer.py", argv=argv)
    print(f"output layer x W^T, H = {args.hidden}, float32, {args.threads} thread(s), blocks of {VOCAB_BLOCK} columns")
    print(f"{'rows':>6s}{'V':>8s}{'F.linear GF/s':>15s}{'blocks GF/s':>13s}{'wall ratio':>12s}{'CPU ratio':>11s}")
    results = []
    for vocab in args.vocabs:
        for rows in sorted({*args.rows, default_chunk_size(vocab)}):
            r = measure(rows, vocab, args.hidden, args.repeats, args.calls)
            results.append(r)
            print(
                f"{rows:6d}{vocab:8d}{r['F.linear']['gflops']:15.1f}{r['blocks']['gflops']:13.1f}"
                f"{r['ratio_wall']:11.2f}x{r['ratio_cpu']:10.2f}x",
                flush=True,
            )
    figures = [
        record.figure(
            f"F.linear / output_logits time, {r['rows']} rows x V = {r['vocab']:,} (H = {args.hidden}, "
            f"{args.threads} thread(s))",
            f"{r['ratio_cpu']:.2f}x CPU, {r['ratio_wall']:.2f}x wall "
            f"({r['F.linear']['gflops']:.0f} -> {r['blocks']['gflops']:.0f} GFLOP/s)",
        )
        for r in results
    ]
    rec.write(args.json, figures, {"args": vars(args), "block": VOCAB_BLOCK, "shapes": results})


if __name__ == "__main__":
    main()
