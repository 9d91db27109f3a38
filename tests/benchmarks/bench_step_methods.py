"""Benchmark: TROLL and TRM-Max against Clip over whole training steps of the built-in trainer.

Design: three ``LocalTrainer``s in one process on the same model config (default the tiny Qwen3 with
Qwen's output size, V = 151,936, ``model=tiny_qwen3_v152k``), the same seed and settings: GRPO's
preset with Clip, with ``objective=troll`` (sparse top-64, TROLL arXiv 2510.03817) and with
``mask=trm_max`` (exact-KL TRM-Max, arXiv 2512.23075). Each round runs one step of each trainer,
in alternating order; a step is the whole iteration (rollout, old-log-prob pass, update, post-update
diagnostics). Measured per step: wall and process CPU seconds, and the step's peak resident memory
above what was resident before it (``VmHWM`` after ``/proc/self/clear_refs``, once ``malloc_trim``
returned freed memory), beside the process's whole peak during the step. Ratios TROLL / Clip and
TRM-Max / Clip of the medians; no assertions (targets from the issue: TROLL at most 1.3x Clip's step
time and +10% of its peak memory; TROLL's paper reports +9.1% time and +4.6% memory at Qwen3-4B scale,
Table 5).

    python tests/benchmarks/bench_step_methods.py                  # 8 prompts x 8 samples x 48 tokens
    python tests/benchmarks/bench_step_methods.py --prompts 2 --n 2 --max-new 8 --steps 2
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import record
import rss
import torch

from runners.backends.local.trainer import LocalTrainer
from runners.config import compose

METHODS = {"Clip": [], "TROLL": ["objective=troll"], "TRM-Max": ["mask=trm_max"]}


class NullTracker:
    def log_metrics(self, metrics, step):
        pass

    def flush(self, wait=True):
        pass


def trainer(args, extra: list[str], run_dir: Path) -> LocalTrainer:
    cfg, _ = compose(
        [
            f"model={args.model}",
            "algorithm=grpo",
            *extra,
            f"trainer.total_steps={args.steps + 1}",
            f"trainer.prompts_per_step={args.prompts}",
            f"trainer.n={args.n}",
            f"trainer.mini_batch_prompts={args.prompts}",
            "trainer.eval_every=0",
            "trainer.checkpoint_every=0",
            f"rollout.max_response_length={args.max_new}",
            f"backend.num_threads={args.threads}",
            "progress=false",
            f"seed={args.seed}",
        ]
    )
    return LocalTrainer(cfg, NullTracker(), run_dir, label="bench")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny_qwen3_v152k")
    p.add_argument("--steps", type=int, default=3, help="timed steps per method (after one warm-up step)")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--n", type=int, default=8, help="samples per prompt")
    p.add_argument("--max-new", type=int, default=48)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write a machine-readable record here")
    args = p.parse_args(argv)
    rec = record.start("bench_step_methods.py", section="scripts")
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {name: trainer(args, extra, Path(tmp) / name) for name, extra in METHODS.items()}
        torch.set_num_threads(args.threads)
        runs: dict[str, list[dict]] = {name: [] for name in METHODS}
        for step in range(args.steps + 1):  # step 0 warms up
            order = list(METHODS) if step % 2 else list(METHODS)[::-1]
            for name in order:
                before = rss.settle()
                wall, cpu = time.perf_counter(), time.process_time()
                trainers[name].step(step)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                peak = rss.kib("VmHWM")
                if step:
                    runs[name].append(
                        {"wall_s": wall, "cpu_s": cpu, "peak_mib": (peak - before) / 1024, "process_mib": peak / 1024}
                    )
    med = {n: {k: statistics.median(r[k] for r in runs[n]) for k in runs[n][0]} for n in METHODS}
    print(
        f"{args.model}: {args.prompts} prompts x {args.n} samples x <= {args.max_new} tokens, {args.threads} thread(s), {args.steps} steps each (medians)"
    )
    print(f"{'method':<9}{'wall s':>8}{'CPU s':>8}{'step peak MiB':>15}{'process peak MiB':>18}")
    for name, m in med.items():
        print(f"{name:<9}{m['wall_s']:8.2f}{m['cpu_s']:8.2f}{m['peak_mib']:15.0f}{m['process_mib']:18.0f}")
    figures = []
    for name in ("TROLL", "TRM-Max"):
        t = med[name]["wall_s"] / med["Clip"]["wall_s"]
        c = med[name]["cpu_s"] / med["Clip"]["cpu_s"]
        mem = med[name]["peak_mib"] / med["Clip"]["peak_mib"]
        proc = med[name]["process_mib"] / med["Clip"]["process_mib"]
        print(
            f"{name} / Clip: step time {t:.2f}x (CPU {c:.2f}x), step peak memory {mem:.2f}x, process peak {proc:.3f}x"
        )
        troll = name == "TROLL"
        figures.append(
            record.figure(
                f"{name} / Clip training step time ({args.model})",
                f"{t:.2f}x (CPU {c:.2f}x)",
                "<= 1.3x" if troll else "",
            )
        )
        figures.append(
            record.figure(
                f"{name} / Clip step peak memory above the resident set", f"{mem:.2f}x", "<= 1.10x" if troll else ""
            )
        )
        figures.append(record.figure(f"{name} / Clip process peak memory during the step", f"{proc:.3f}x", ""))
    rec.write(args.json, figures=figures, results={"medians": med, "runs": runs})


if __name__ == "__main__":
    main()
