"""Benchmark: TROLL loss vs a PPO clip loss from the same logits, sparse storage, dual solver stats.

Design: both losses start from the same leaf logits [1, T, V] (Qwen3 vocabulary, V = 151,936) and
include their backward. TROLL = ``sparsify`` of the old logits (top-K, mass cut, sampled token)
+ ``troll_objective`` (gather at the kept set, projection, eq. 5 loss, kept-mass metric) +
token-mean + backward. PPO = log_softmax + gather + clipped ratio loss + token-mean + backward.
The script reports median and best times over repeats and their ratio (no assertions: timings
are machine-dependent; the targets are <= 1.5x on CPU and <= 1.3x on a GPU). The logits are
synthetic: a few dominant tokens over a Gaussian background, so that top-64 covers 1 - 1e-5 of
the mass; the new logits are the old ones plus noise, so that a few percent of tokens leave the
trust region.

    python tests/benchmarks/bench_troll.py                      # CPU, 1 x 512 tokens
    python tests/benchmarks/bench_troll.py --threads 1          # steadier on a shared machine
    python tests/benchmarks/bench_troll.py --device cuda --tokens 4096
"""

from __future__ import annotations

import argparse
import statistics
import time

import record
import torch

from runners.algorithms.loss_agg import token_mean
from runners.algorithms.numerics import token_logprobs
from runners.algorithms.troll import dense_storage_bytes, sparsify, troll_objective
from runners.algorithms.troll_solver import categorical_kl, project_with_info
from runners.algorithms.troll_sparse import reduce_on_kept_set
from runners.algorithms.types import PolicyInputs


def make_batch(tokens: int, vocab: int, noise: float, device: str, seed: int = 0):
    """Old/new logits [1,T,V], sampled tokens [1,T], advantages [1,T] (a peaked synthetic policy)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    old = torch.randn(1, tokens, vocab, generator=g) * 1.5  # background: ~1e-7 of the mass
    heads = torch.randint(0, vocab, (1, tokens, 6), generator=g)
    boost = torch.tensor([30.0, 27.0, 25.0, 23.0, 21.0, 19.0]).expand(1, tokens, 6)
    old.scatter_add_(-1, heads, boost + torch.randn(1, tokens, 6, generator=g))
    new = old + noise * torch.randn(1, tokens, vocab, generator=g)
    new.scatter_add_(-1, heads, 3 * noise * torch.randn(1, tokens, 6, generator=g))
    sampled = torch.distributions.Categorical(logits=old).sample()
    adv = torch.randn(1, 1, generator=g).expand(1, tokens).contiguous()
    return old.to(device), new.to(device), sampled.to(device), adv.to(device)


def ppo_step(logits: torch.Tensor, old_logp: torch.Tensor, sampled, adv, mask, clip: float = 0.2) -> None:
    """log_softmax + gather + PPO clipped loss + token-mean + backward."""
    logp = torch.log_softmax(logits, -1).gather(-1, sampled.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - old_logp)
    loss = -torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
    token_mean(loss, mask).backward()


def troll_step(logits: torch.Tensor, old_logits, sampled, adv, mask) -> dict[str, float]:
    """sparsify(old) + troll_objective + token-mean + backward; returns the objective's metrics."""
    index, logp = sparsify(old_logits, sampled)
    inp = PolicyInputs(
        logp=None, old_logp=None, advantages=adv, response_mask=mask, logits=logits,
        old_topk_index=index, old_topk_logp=logp, responses=sampled,
    )  # fmt: skip
    out = troll_objective(inp)
    token_mean(out.loss_mat, mask).backward()
    return out.metrics


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_alternating(fns: dict, leaf: torch.Tensor, repeats: int, device: str) -> dict[str, tuple[list, list]]:
    """Wall-clock and process CPU seconds of each function over ``repeats`` rounds after one warm-up;
    each round runs every function once, in turn, so that drifts of a shared machine hit them alike."""
    for fn in fns.values():
        fn()
    times: dict[str, tuple[list, list]] = {name: ([], []) for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            leaf.grad = None
            _sync(device)
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            _sync(device)
            times[name][0].append(time.perf_counter() - start)
            times[name][1].append(time.process_time() - start_cpu)
    return times


def count_syncs(fn) -> int:
    """Host synchronisations ``fn`` makes on a CUDA device (torch's sync debug mode, one warning each)."""
    import warnings

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message) for w in caught)


def solver_stats(old, new, sampled, eps: float = 0.05, batches: int = 4) -> dict[str, float]:
    """Projected tokens' convergence flags, |KL_after - eps| and steps over a few noise draws."""
    vocab = new.shape[-1]
    index, logp = sparsify(old, sampled)
    flat_idx, flat_lp = index.reshape(-1, index.shape[-1]).long(), logp.reshape(-1, logp.shape[-1])
    steps, conv, gaps, frac = [], [], [], []
    for b in range(batches):
        kept_logits = new.reshape(-1, vocab).gather(-1, flat_idx)
        kept_logits = kept_logits + 0.5 * b * torch.randn_like(kept_logits)  # larger steps: more projected
        logq, logo, _ = reduce_on_kept_set(kept_logits, flat_lp, vocab)
        lp, info = project_with_info(logq, logo, eps)
        steps.append(info.steps)
        p = info.projected
        frac.append(float(p.double().mean()))
        conv.append(float(info.converged[p].double().mean()) if p.any() else 1.0)
        if p.any():
            gaps.append(float((categorical_kl(lp[p], logo[p]) - eps).abs().max()))
    return {
        "projected_frac": statistics.mean(frac),
        "converged_frac": statistics.mean(conv),
        "max_abs_kl_gap": max(gaps) if gaps else 0.0,
        "steps_mean": statistics.mean(steps),
        "steps_max": max(steps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--noise", type=float, default=0.1, help="std of new - old logits (0.1: ~4% projected)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    record.add_option(parser)
    args = parser.parse_args()
    rec = record.start("bench_troll.py")
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = args.device
    old, new, sampled, adv = make_batch(args.tokens, args.vocab, args.noise, dev)
    mask = torch.ones_like(adv)
    leaf = new.clone().requires_grad_()
    with torch.no_grad():
        old_logp = torch.log_softmax(old, -1).gather(-1, sampled.unsqueeze(-1)).squeeze(-1)
    index, logp = sparsify(old, sampled)
    inp = PolicyInputs(
        logp=None, old_logp=None, advantages=adv, response_mask=mask, logits=leaf,
        old_topk_index=index, old_topk_logp=logp, responses=sampled,
    )  # fmt: skip
    metrics: dict[str, float] = {}

    def old_ppo():  # the old-policy pass every method makes: log pi_old of the sampled tokens
        with torch.no_grad():
            return token_logprobs(old.view(-1, args.vocab), sampled.view(-1))

    def old_troll():  # ... and TROLL's sparse store besides (the trainer's form: true log-probs)
        old_ppo()
        with torch.no_grad():
            return sparsify(old, sampled, renormalize=False)

    fns = {
        "ppo_update": lambda: ppo_step(leaf, old_logp, sampled, adv, mask),
        "troll_update": lambda: token_mean(troll_objective(inp).loss_mat, mask).backward(),
        "troll_step": lambda: metrics.update(troll_step(leaf, old, sampled, adv, mask)),
        "sparsify": lambda: sparsify(old, sampled),
        "old_ppo": old_ppo,
        "old_troll": old_troll,
    }
    times = time_alternating(fns, leaf, args.repeats, dev)
    med = {name: (statistics.median(w), statistics.median(c)) for name, (w, c) in times.items()}

    tokens, vocab = args.tokens, args.vocab
    print(f"device={dev} tokens={tokens} vocab={vocab} repeats={args.repeats} threads={torch.get_num_threads()}")
    print("wall = perf_counter, cpu = process CPU time (all threads); medians over rounds that run every row in turn")
    head = ["wall med", "wall best", "cpu med", "cpu best", "ratio wall", "ratio cpu"]
    print(f"{'step':<46}" + "".join(f"{h:>11}" for h in head))
    rows = [
        ("update: PPO log_softmax+gather+clip+backward", "ppo_update", "ppo_update"),
        ("update: TROLL objective+backward", "troll_update", "ppo_update"),
        ("old pass: log pi_old (every method)", "old_ppo", "old_ppo"),
        ("old pass: log pi_old + TROLL sparsify", "old_troll", "old_ppo"),
        ("TROLL sparsify(old)+objective+backward", "troll_step", "ppo_update"),
        ("  of which sparsify(old)", "sparsify", "ppo_update"),
    ]
    for label, name, base in rows:
        wall, cpu = times[name]
        row = [
            med[name][0],
            min(wall),
            med[name][1],
            min(cpu),
            med[name][0] / med[base][0],
            med[name][1] / med[base][1],
        ]
        print(f"{label:<46}" + "".join(f"{v:>11.4f}" for v in row))
    batch_ratio = {}
    for epochs in (1, 4):  # one rollout batch: the old pass once, then `epochs` updates of the same tokens
        ppo = med["old_ppo"][0] + epochs * med["ppo_update"][0]
        troll = med["old_troll"][0] + epochs * med["troll_update"][0]
        batch_ratio[epochs] = troll / ppo
        print(f"rollout batch with {epochs} update(s) (old pass + updates), wall: TROLL / PPO = {troll / ppo:.3f}")
    syncs = {}
    if dev.startswith("cuda"):
        leaf.grad = None
        syncs = {name: count_syncs(fns[name]) for name in ("troll_update", "sparsify", "ppo_update")}
        print(f"host synchronisations: TROLL update {syncs['troll_update']}, "
              f"sparsify {syncs['sparsify']}, PPO update {syncs['ppo_update']}")  # fmt: skip
    kept = (logp > -float("inf")).sum(-1).double()
    sparse_bytes = index.numel() * index.element_size() + logp.numel() * logp.element_size()
    dense_bytes = dense_storage_bytes(tokens, 1, vocab)
    packed = float(kept.sum()) * 8
    print(f"storage: sparse [T,K+1] int32+fp32 {sparse_bytes} B vs dense fp32 {dense_bytes} B -> "
          f"1/{dense_bytes / sparse_bytes:.0f}; packed mean-kept {packed:.0f} B -> 1/{dense_bytes / packed:.0f}")  # fmt: skip
    print(f"kept tokens mean {float(kept.mean()):.2f} max {int(kept.max())}; "
          f"objective metrics: " + ", ".join(f"{k}={v:.4g}" for k, v in metrics.items()))  # fmt: skip
    stats = solver_stats(old, new, sampled)
    print("dual solver: " + ", ".join(f"{k}={v:.4g}" for k, v in stats.items()))
    where = f"{dev}, T = {tokens}, V = {vocab:,}, {torch.get_num_threads()} thread(s)"
    ratio = {name: med[name][0] / med[base][0] for _, name, base in rows}
    cpu_ratio = {name: med[name][1] / med[base][1] for _, name, base in rows}
    target = "<= 1.3x" if dev.startswith("cuda") else "<= 1.5x"
    figures = [
        record.figure(
            f"TROLL sparsify + objective + backward / PPO clip loss + backward ({where})",
            f"{ratio['troll_step']:.2f}x wall, {cpu_ratio['troll_step']:.2f}x CPU",
            target,
        ),
        record.figure(
            "TROLL update (objective + backward) / PPO update",
            f"{ratio['troll_update']:.2f}x wall, {cpu_ratio['troll_update']:.2f}x CPU",
        ),
        record.figure(
            "old pass: log pi_old + TROLL's sparse store / log pi_old alone",
            f"{ratio['old_troll']:.2f}x wall, {cpu_ratio['old_troll']:.2f}x CPU",
        ),
        record.figure("rollout batch, old pass + 4 updates: TROLL / PPO", f"{batch_ratio[4]:.2f}x wall"),
        record.figure("sparse storage / dense fp32", f"1/{dense_bytes / sparse_bytes:.0f}", "<= 1/1000"),
    ]
    if syncs:
        figures.append(record.figure("host synchronisations per TROLL update", str(syncs["troll_update"])))
    results = {
        "args": vars(args),
        "median_s": {name: {"wall": w, "cpu": c} for name, (w, c) in med.items()},
        "rollout_batch_ratio": batch_ratio,
        "storage_bytes": {"sparse": sparse_bytes, "dense": dense_bytes},
        "host_syncs": syncs,
        "objective_metrics": metrics,
        "solver": stats,
    }  # fmt: skip
    rec.write(args.json, figures, results, gpu=record.gpu_name(dev))


if __name__ == "__main__":
    main()
