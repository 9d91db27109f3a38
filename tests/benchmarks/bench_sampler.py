"""Benchmark: the KV-cache sampler vs ``model.generate(do_sample=True)``, generated tokens per second.

    python tests/benchmarks/bench_sampler.py                    # embedded default + tiny Qwen2, batch 32
    python tests/benchmarks/bench_sampler.py --repeats 7 --smollm2

Same model, same left-padded prompts (embedded test problems), same batch and token budget, both at
temperature 1 with top-p 1 and top-k off. Two regimes:
- ``fixed``: no EOS, every row generates ``--tokens`` tokens (pure per-step cost);
- ``eos``: the model's EOS ends rows (the RL case; only models that emit EOS, i.e. not the random
  tiny one): tokens/s counts real response tokens, so finishing early is rewarded for both.
Columns: ``generate``; ``generic`` = our loop through the model's own forward (``fast=False``);
``ours`` = the default (lean Llama-family decode step where supported); ratio = ours / generate
on median times, best ratio on the fastest run of each (less sensitive to background load).
Timings alternate between the samplers and report the median of ``--repeats`` runs (the machine is
shared); the target is a ratio >= 1.5. Prints a table; asserts nothing about time.

``--draw`` times only the token draw (``runners.models.sampler.draw``) at 64 rows of a real vocabulary
(49,152 and 151,936 entries, softmax of Gaussian logits of std 3): one level (a float64 cumulative sum
over all V entries: ``block=V``) against the default two levels, alternating, CPU time per draw.

    python tests/benchmarks/bench_sampler.py --draw
"""

from __future__ import annotations

import argparse
import statistics
import time

import record
import torch


def prompts(tokenizer, batch: int, chat: bool):
    from runners.data.embedded import generate_embedded

    examples = generate_embedded(batch, split="test", seed=0)
    if chat:
        texts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": e.prompt}], tokenize=False, add_generation_prompt=True
            )
            for e in examples
        ]
        return tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
    return tokenizer([e.prompt for e in examples], padding=True, return_tensors="pt")


def run_hf(model, batch, tokens: int, eos, pad: int) -> int:
    from transformers import GenerationConfig

    config = GenerationConfig(
        do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=tokens, eos_token_id=eos, pad_token_id=pad
    )
    # generate() fills an unset eos from the model's own generation config; clear it for "fixed"
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = eos
    try:
        with torch.inference_mode():
            out = model.generate(**batch, generation_config=config)
    finally:
        model.generation_config.eos_token_id = saved
    response = out[:, batch["input_ids"].shape[1] :]
    if eos is None:
        return response.numel()
    # real tokens: up to and including the first EOS of each row
    is_eos = response == eos
    after = (is_eos.cumsum(dim=1) - is_eos.long()) > 0
    return int((~after).sum())


def run_ours(model, batch, tokens: int, eos, pad: int, fast: bool = True) -> int:
    from runners.models.sampler import generate

    out = generate(
        model,
        batch["input_ids"],
        batch["attention_mask"],
        max_new_tokens=tokens,
        eos_token_id=eos,
        pad_token_id=pad,
        fast=fast,
    )
    return int(out.response_mask.sum())


def run_generic(model, batch, tokens: int, eos, pad: int) -> int:
    return run_ours(model, batch, tokens, eos, pad, fast=False)


def timed(fn, *args) -> tuple[float, int]:
    """(seconds, generated tokens) of one call."""
    start = time.perf_counter()
    count = fn(*args)
    return time.perf_counter() - start, count


def bench(name: str, model, tokenizer, *, batch_size: int, tokens: int, repeats: int, regimes, chat=False):
    batch = prompts(tokenizer, batch_size, chat)
    rows = []
    for regime in regimes:
        eos = tokenizer.eos_token_id if regime == "eos" else None
        args = (model, batch, tokens, eos, tokenizer.pad_token_id)
        samplers = {"generate": run_hf, "generic": run_generic, "ours": run_ours}
        times: dict[str, list[float]] = {key: [] for key in samplers}
        counts: dict[str, int] = {}
        for fn in samplers.values():  # warm-up (lazy inits, allocator)
            fn(*args)
        for _ in range(repeats):  # alternate so all see the same background load
            for key, fn in samplers.items():
                seconds, counts[key] = timed(fn, *args)
                times[key].append(seconds)
        rate = {key: counts[key] / statistics.median(times[key]) for key in samplers}
        best = {key: counts[key] / min(times[key]) for key in samplers}
        rows.append(
            (
                name,
                regime,
                batch_size,
                tokens,
                rate["generate"],
                rate["generic"],
                rate["ours"],
                best["ours"] / best["generate"],
            )
        )
    return rows


def bench_draw(repeats: int, rows: int = 64) -> list[dict]:
    """CPU ms per ``draw`` of ``rows`` tokens, one level against two, per vocabulary (median of ``repeats``)."""
    from runners.models.sampler import draw

    out = []
    for vocab in (49152, 151936):
        probs = (torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)) * 3).softmax(-1)
        g = torch.Generator().manual_seed(1)
        variants = {
            "one level": lambda p=probs, g=g, v=vocab: draw(p, g, block=v),
            "two levels": lambda p=probs, g=g: draw(p, g),
        }
        times: dict[str, list[float]] = {k: [] for k in variants}
        for fn in variants.values():
            fn()
        for _ in range(repeats):
            for name, fn in variants.items():
                start = time.process_time()
                fn()
                times[name].append(time.process_time() - start)
        ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        out.append({"vocab": vocab, "rows": rows, **ms, "ratio": ms["one level"] / ms["two levels"]})
        print(f"draw {rows} x {vocab}: one level {ms['one level']:.2f} ms, two levels {ms['two levels']:.2f} ms (CPU)")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64, help="max new tokens per row")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--smollm2", action="store_true", help="also SmolLM2-135M (slow: ~100 tok/s)")
    parser.add_argument("--draw", action="store_true", help="only the token draw: one level against two")
    record.add_option(parser)
    args = parser.parse_args()
    rec = record.start("bench_sampler.py")
    if args.draw:
        torch.set_num_threads(1)
        draws = bench_draw(max(args.repeats, 15))
        figures = [
            record.figure(
                f"token draw, {d['rows']} rows x V = {d['vocab']:,}, 1 thread: one level / two levels CPU time",
                f"{d['ratio']:.1f}x ({d['one level']:.1f} -> {d['two levels']:.1f} ms)",
            )
            for d in draws
        ]
        rec.write(args.json, figures, {"args": vars(args), "draws": draws})
        return

    from runners.models import load_model

    rows = []
    common = {"batch_size": args.batch, "tokens": args.tokens, "repeats": args.repeats}
    model, tokenizer = load_model("embedded")
    rows += bench("embedded", model, tokenizer, regimes=("fixed", "eos"), **common)
    model, tokenizer = load_model("tiny", arch="qwen2")
    rows += bench("tiny-qwen2", model, tokenizer, regimes=("fixed",), **common)
    if args.smollm2:
        model, tokenizer = load_model("smollm2")
        rows += bench("smollm2", model, tokenizer, regimes=("fixed", "eos"), chat=True, **{**common, "repeats": 1})

    print(f"\ntorch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.repeats} runs")
    header = (
        f"{'model':<12} {'regime':<6} {'batch':>5} {'tokens':>6} {'generate tok/s':>15} {'generic tok/s':>14} "
        f"{'ours tok/s':>11} {'ratio':>6} {'best ratio':>10}"
    )
    print(header)
    print("-" * len(header))
    for name, regime, batch, tokens, hf_rate, generic_rate, our_rate, best_ratio in rows:
        print(
            f"{name:<12} {regime:<6} {batch:>5} {tokens:>6} {hf_rate:>15.0f} {generic_rate:>14.0f} "
            f"{our_rate:>11.0f} {our_rate / hf_rate:>6.2f} {best_ratio:>10.2f}"
        )
    figures = [
        record.figure(
            f"{name} ({regime}), batch {batch} x {tokens} tokens, {torch.get_num_threads()} thread(s): "
            "ours / `model.generate` tokens/s",
            f"{our_rate / hf_rate:.2f}x (best run {best_ratio:.2f}x)",
            ">= 1.5x",
        )
        for name, regime, batch, tokens, hf_rate, _, our_rate, best_ratio in rows
    ]
    keys = ("model", "regime", "batch", "tokens", "generate_tok_s", "generic_tok_s", "ours_tok_s", "best_ratio")
    results = {"args": vars(args), "threads": torch.get_num_threads(), "rows": [dict(zip(keys, r)) for r in rows]}
    rec.write(args.json, figures, results)


if __name__ == "__main__":
    main()
