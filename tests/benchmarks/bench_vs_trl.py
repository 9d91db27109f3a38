"""Benchmark: the built-in trainer against TRL's GRPOTrainer on the same CPU work, alternating steps.

Design: one process, one torch thread, both trainers built from the same weights (TRL's model is a
deep copy of the built-in trainer's before its first step) and the same prompts in the same order
(TRL's dataset is the built-in prompt stream's order, not shuffled; each prompt's token ids are
checked equal under both tokenisations before anything runs). Both run GRPO with one optimiser step
per batch of ``--prompts`` x ``--n`` responses of up to ``--max-new`` tokens at temperature 1 (top-p 1,
no top-k), fp32, PPO clip 0.2, no KL term, AdamW with the same learning rate and gradient clipping,
a constant schedule: TRL with ``loss_type="bnpo"`` (token-mean over the batch, the built-in
``loss_agg=token-mean``), no vLLM, no gradient checkpointing (TRL's default turns it on; the built-in
trainer does not checkpoint). The reward is the dataset's own verifier for both.

TRL runs its own training loop (``GRPOTrainer.train``); a callback times each TRL optimiser step from
``on_step_begin`` to ``on_step_end`` (generation, scoring, loss, backward, clipping, optimiser step)
and, inside ``on_step_end``, runs and times one built-in ``LocalTrainer.step``: the two alternate
A, B, A, B, so slow phases of a shared machine hit both. Tokens per step are prompt plus generated
tokens (TRL's ``num_input_tokens_seen`` increments; the built-in ``perf/total_num_tokens``); the two
sample different responses, so tokens per second, not seconds, are compared. The first
``--warmup`` pairs are not counted. Wall and process CPU time are both printed; CPU time is the
one to trust on a loaded machine. TRL's ``model.generate`` is wrapped to time its generation alone.

TRL comes from the ``bench`` extra, in an environment of its own (``make bench`` makes
``.venv-bench``): verl 0.9.1 cannot start where TRL 1.x is installed.

    python tests/benchmarks/bench_vs_trl.py                              # embedded model, 8 x 8 x 48, 6 pairs
    python tests/benchmarks/bench_vs_trl.py --model smollm2_135m --steps 3   # SmolLM2-135M, shorter
    python tests/benchmarks/bench_vs_trl.py --diagnostics               # keep the post-update diagnostics pass
    python tests/benchmarks/bench_vs_trl.py --profile 3                 # then a torch.profiler table of 3 steps
    python tests/benchmarks/bench_vs_trl.py --device cuda --model tiny_qwen3_v152k   # on a GPU (wall time)
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import record  # noqa: E402
import torch  # noqa: E402

from runners import metric_names as names  # noqa: E402
from runners.perf.roofline import phase_flops  # noqa: E402


class NullTracker:
    def log_metrics(self, metrics, step):
        pass

    def flush(self, wait=True):
        pass


def builtin_trainer(args, run_dir: Path):
    from runners.backends.local.trainer import LocalTrainer
    from runners.config import compose

    cfg, _ = compose(
        [
            f"model={args.model}",
            "algorithm=grpo",
            f"trainer.total_steps={args.steps + args.warmup}",
            f"trainer.prompts_per_step={args.prompts}",
            f"trainer.n={args.n}",
            f"trainer.mini_batch_prompts={args.prompts}",
            "trainer.ppo_epochs=1",
            "trainer.micro_batch_size=0",
            f"trainer.lr={args.lr}",
            "trainer.grad_clip=1.0",
            "trainer.warmup_steps=0",
            "trainer.eval_every=0",
            "trainer.checkpoint_every=0",
            f"trainer.post_update_diagnostics={str(args.diagnostics).lower()}",
            f"rollout.max_response_length={args.max_new}",
            "rollout.temperature=1.0",
            "rollout.top_p=1.0",
            f"backend.device={args.device}",
            f"backend.num_threads={args.threads}",
            "progress=false",
            f"seed={args.seed}",
        ]
    )
    return LocalTrainer(cfg, NullTracker(), run_dir, label="builtin")


def prompt_order(trainer, count: int) -> list:
    """The examples the built-in trainer's prompt stream will hand out, in order (a copy of the stream)."""
    stream = copy.deepcopy(trainer.rollout.stream)
    return [stream.next()[1] for _ in range(count)]


def trl_trainer(args, builtin, examples: list, callbacks: list, out_dir: Path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from runners.data.prompts import format_prompt
    from runners.data.rewards import compute_reward

    tokenizer = builtin.tokenizer
    chat = bool(builtin.cfg.model.chat_template)
    texts = [format_prompt(e, tokenizer, chat=chat) for e in examples]
    for example, text in zip(examples, texts):
        # TRL tokenises a plain prompt with tokenizer(text=...) (specials added); it must match the built-in ids
        if list(tokenizer(text=text)["input_ids"]) != builtin.codec.encode(example):
            raise SystemExit(f"prompt tokenisation differs between TRL and the built-in trainer: {text!r}")
    dataset = Dataset.from_dict({"prompt": texts, "row": list(range(len(examples)))})

    def reward(prompts, completions, row, **_):
        return [
            float(compute_reward(examples[i].reward_fn, c, examples[i].answer, prompt=examples[i].prompt_text()))
            for i, c in zip(row, completions)
        ]

    config = GRPOConfig(
        output_dir=str(out_dir),
        per_device_train_batch_size=args.prompts * args.n,
        gradient_accumulation_steps=1,
        num_generations=args.n,
        max_completion_length=args.max_new,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        num_iterations=1,
        beta=0.0,
        epsilon=0.2,
        loss_type="bnpo",
        scale_rewards="group",
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        max_grad_norm=1.0,
        max_steps=args.steps + args.warmup,
        bf16=False,
        fp16=False,
        use_cpu=args.device == "cpu",
        gradient_checkpointing=False,
        shuffle_dataset=False,
        dataloader_num_workers=0,
        logging_steps=10**6,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=args.seed,
        use_vllm=False,
    )
    model = copy.deepcopy(builtin.model).train()
    return GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=callbacks,
    )


def _sync() -> None:
    """Wait for queued GPU work, so that a timer read after it counts that work (no-op on CPU)."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _timed_generate(model, log: list):
    """Wrap ``model.generate`` (what TRL calls) to record its (wall, CPU) seconds."""
    real = model.generate

    def generate(*a, **kw):
        _sync()
        start, cpu = time.perf_counter(), time.process_time()
        try:
            return real(*a, **kw)
        finally:
            _sync()
            log.append((time.perf_counter() - start, time.process_time() - cpu))

    model.generate = generate


def run(args) -> dict:
    from transformers import TrainerCallback

    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="bench_vs_trl_"))
    builtin = builtin_trainer(args, work / "builtin")
    examples = prompt_order(builtin, (args.steps + args.warmup) * args.prompts)
    rows: list[dict] = []

    class Alternate(TrainerCallback):
        """Times TRL's optimiser step, then runs and times one built-in step (A, B, A, B, ...)."""

        def __init__(self) -> None:
            self.gen: list[float] = []
            self.step = 0

        def on_step_begin(self, targs, state, control, **kw):
            self.tokens = state.num_input_tokens_seen
            self.gen.clear()
            _sync()
            self.start, self.cpu = time.perf_counter(), time.process_time()

        def on_step_end(self, targs, state, control, **kw):
            _sync()
            trl_wall, trl_cpu = time.perf_counter() - self.start, time.process_time() - self.cpu
            trl_tokens = state.num_input_tokens_seen - self.tokens
            torch.set_num_threads(args.threads)
            start, cpu = time.perf_counter(), time.process_time()
            metrics = builtin.step(self.step)
            _sync()
            ours_wall, ours_cpu = time.perf_counter() - start, time.process_time() - cpu
            rows.append(
                {
                    "trl_wall": trl_wall,
                    "trl_cpu": trl_cpu,
                    "trl_tokens": trl_tokens,
                    "trl_gen": sum(w for w, _ in self.gen),
                    "trl_gen_cpu": sum(c for _, c in self.gen),
                    "ours_wall": ours_wall,
                    "ours_cpu": ours_cpu,
                    "ours_tokens": metrics[names.TOTAL_NUM_TOKENS],
                    "ours_gen": metrics[names.TIMING_GEN],
                    "ours_gen_cpu": metrics[names.TIMING_CPU_GEN],
                    "ours_old_cpu": metrics.get(names.TIMING_CPU_OLD_LOG_PROB, 0.0),
                    "ours_update_cpu": metrics[names.TIMING_CPU_UPDATE_ACTOR],
                    "ours_mfu": metrics.get(getattr(names, "MFU_ACTOR", ""), float("nan")),
                    "ours_flops": phase_flops(metrics) or float("nan"),
                    "peak_tflops": metrics.get(names.PEAK_TFLOPS, float("nan")),
                }
            )
            r = rows[-1]
            print(
                f"pair {self.step}: TRL {trl_wall:6.2f} s ({trl_cpu:6.2f} CPU) {trl_tokens:6.0f} tok | "
                f"built-in {ours_wall:6.2f} s ({ours_cpu:6.2f} CPU) {r['ours_tokens']:6.0f} tok"
                + (" (warm-up)" if self.step < args.warmup else ""),
                flush=True,
            )
            self.step += 1

    alternate = Alternate()
    trl = trl_trainer(args, builtin, examples, [alternate], work / "trl")
    _timed_generate(trl.model, alternate.gen)
    torch.set_num_threads(args.threads)
    trl.train()
    out = summarise(args, rows[args.warmup :])
    if args.profile:
        profile_builtin(builtin, args.profile, start=len(rows))
    return out


def profile_builtin(builtin, steps: int, start: int) -> None:
    """torch.profiler table (self CPU time per op) of ``steps`` more built-in steps, after the timed pairs."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for step in range(start, start + steps):
            builtin.step(step)
    print(f"\nbuilt-in trainer, {steps} step(s) under torch.profiler (op times are wall-clock, profiler included):")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))


def ideal_s(row: dict) -> float:
    """The built-in step's model FLOPs at the machine's measured matmul peak (``perf/peak_tflops``), in
    seconds: the least time its work takes there. NaN without Roofline metrics."""
    return row["ours_flops"] / (row["peak_tflops"] * 1e12)


def ceiling(rows: list[dict]) -> list[float]:
    """Per pair, built-in / TRL tokens/s if the built-in step took ``ideal_s`` and TRL's step what it took:
    the best ratio this machine allows at the built-in step's work. Empty without Roofline metrics."""
    return [
        (r["ours_tokens"] / ideal_s(r)) / (r["trl_tokens"] / r["trl_cpu"]) for r in rows if not math.isnan(ideal_s(r))
    ]


def summarise(args, rows: list[dict]) -> dict:
    def med(key):
        return statistics.median(r[key] for r in rows)

    def rate(tokens, seconds):
        return sum(r[tokens] for r in rows) / sum(r[seconds] for r in rows)

    out = {
        "trl_tok_s_wall": rate("trl_tokens", "trl_wall"),
        "ours_tok_s_wall": rate("ours_tokens", "ours_wall"),
        "trl_tok_s_cpu": rate("trl_tokens", "trl_cpu"),
        "ours_tok_s_cpu": rate("ours_tokens", "ours_cpu"),
    }
    pair_ratios = [(r["ours_tokens"] / r["ours_cpu"]) / (r["trl_tokens"] / r["trl_cpu"]) for r in rows]
    gen_ratio = [
        (r["ours_tokens"] / r["ours_gen_cpu"]) / (r["trl_tokens"] / r["trl_gen_cpu"])
        for r in rows
        if r["trl_gen_cpu"] > 0
    ]
    print(
        f"\n{args.model}: {args.prompts} prompts x {args.n} samples, <= {args.max_new} new tokens, "
        f"{args.device}, {args.threads} thread(s), {len(rows)} timed pairs (after {args.warmup} warm-up)"
    )
    print(f"{'':28s}{'TRL GRPOTrainer':>18s}{'built-in':>14s}")
    print(f"{'s/step wall (median)':28s}{med('trl_wall'):18.3f}{med('ours_wall'):14.3f}")
    print(f"{'s/step CPU (median)':28s}{med('trl_cpu'):18.3f}{med('ours_cpu'):14.3f}")
    print(f"{'tokens/step (median)':28s}{med('trl_tokens'):18.0f}{med('ours_tokens'):14.0f}")
    print(f"{'tokens/s wall':28s}{out['trl_tok_s_wall']:18.1f}{out['ours_tok_s_wall']:14.1f}")
    print(f"{'tokens/s CPU':28s}{out['trl_tok_s_cpu']:18.1f}{out['ours_tok_s_cpu']:14.1f}")
    print(f"{'generation s wall (median)':28s}{med('trl_gen'):18.3f}{med('ours_gen'):14.3f}")
    print(f"{'generation s CPU (median)':28s}{med('trl_gen_cpu'):18.3f}{med('ours_gen_cpu'):14.3f}")
    print(f"built-in phases (median CPU s): gen {med('ours_gen_cpu'):.3f}, old_log_prob {med('ours_old_cpu'):.3f}, "
          f"update_actor {med('ours_update_cpu'):.3f}")  # fmt: skip
    if not all(r["ours_mfu"] != r["ours_mfu"] for r in rows):
        print(f"built-in perf/mfu/actor (median): {med('ours_mfu'):.4f}")
    ratio_wall = out["ours_tok_s_wall"] / out["trl_tok_s_wall"]
    ratio_cpu = out["ours_tok_s_cpu"] / out["trl_tok_s_cpu"]
    print(
        f"ratio built-in / TRL tokens/s: wall {ratio_wall:.2f}x, CPU {ratio_cpu:.2f}x "
        f"(per pair, CPU: {min(pair_ratios):.2f}-{max(pair_ratios):.2f}x); target >= 2x"
    )
    if gen_ratio:
        print(f"generation tokens/s ratio (per pair, CPU): {min(gen_ratio):.2f}-{max(gen_ratio):.2f}x")
    bound = ceiling(rows) if args.device == "cpu" else []  # CPU time against a CPU peak
    if bound:
        share = statistics.median(ideal_s(r) / r["ours_cpu"] for r in rows)
        print(
            f"ceiling at equal work: the built-in step's {med('ours_flops') / 1e12:.3g} TFLOP at the measured matmul "
            f"peak ({med('peak_tflops') * 1e3:.1f} GFLOP/s) would be {statistics.median(bound):.2f}x TRL "
            f"(per pair {min(bound):.2f}-{max(bound):.2f}x); the built-in step runs at {share:.0%} of that peak"
        )
    out.update(ratio_wall=ratio_wall, ratio_cpu=ratio_cpu, pair_ratios_cpu=pair_ratios, gen_ratios_cpu=gen_ratio)
    out.update(ceiling_ratios_cpu=bound)
    out.update({f"median_{key}": med(key) for key in rows[0]})
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="embedded", help="a model config name (embedded, smollm2_135m, ...)")
    p.add_argument("--steps", type=int, default=6, help="timed pairs (TRL step + built-in step)")
    p.add_argument("--warmup", type=int, default=1, help="untimed pairs first")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--n", type=int, default=8, help="samples per prompt")
    p.add_argument("--max-new", type=int, default=48, help="max new tokens per response")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", help="cpu, or cuda: both trainers on the GPU (compare wall time there)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--diagnostics", action="store_true", help="keep the built-in post-update diagnostics pass")
    p.add_argument("--profile", type=int, default=0, help="then profile this many built-in steps (torch.profiler)")
    record.add_option(p)
    args = p.parse_args(argv)
    rec = record.start("bench_vs_trl.py", argv=argv)
    out = run(args)
    size = f"{args.model}, {args.prompts} prompts x {args.n} samples x <= {args.max_new} tokens, {args.device}"
    figures = [
        record.figure(
            f"built-in / TRL `GRPOTrainer` tokens/s ({size}, {args.threads} thread(s), {args.steps} pairs)",
            f"{out['ratio_cpu']:.2f}x CPU, {out['ratio_wall']:.2f}x wall "
            f"(per pair {min(out['pair_ratios_cpu']):.2f}-{max(out['pair_ratios_cpu']):.2f}x)",
            ">= 2x",
        )
    ]
    if out["gen_ratios_cpu"]:
        lo, hi = min(out["gen_ratios_cpu"]), max(out["gen_ratios_cpu"])
        figures.append(record.figure("generation tokens/s, built-in / TRL (per pair, CPU)", f"{lo:.2f}-{hi:.2f}x"))
    if out["ceiling_ratios_cpu"]:
        bound = out["ceiling_ratios_cpu"]
        figures.append(
            record.figure(
                "ceiling at equal work: the built-in step's model FLOPs at the measured matmul peak / TRL, tokens/s",
                f"{statistics.median(bound):.2f}x (per pair {min(bound):.2f}-{max(bound):.2f}x)",
            )
        )
    trl = None
    try:
        from importlib.metadata import version

        trl = version("trl")
    except Exception:
        pass
    rec.write(args.json, figures, {"args": vars(args), "trl": trl, **out}, gpu=record.gpu_name(args.device))


if __name__ == "__main__":
    main()
