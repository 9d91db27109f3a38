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

import torch

from runners.algorithms.loss_agg import token_mean
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


def ppo_step(logits: torch.Tensor, logp_old: torch.Tensor, sampled, adv, mask, clip: float = 0.2) -> None:
    """log_softmax + gather + PPO clipped loss + token-mean + backward."""
    logp = torch.log_softmax(logits, -1).gather(-1, sampled.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp_old)
    loss = -torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
    token_mean(loss, mask).backward()


def troll_step(logits: torch.Tensor, old_logits, sampled, adv, mask) -> dict[str, float]:
    """sparsify(old) + troll_objective + token-mean + backward; returns the objective's metrics."""
    index, logp = sparsify(old_logits, sampled)
    inp = PolicyInputs(
        logp=None, logp_old=None, advantages=adv, response_mask=mask, logits=logits,
        old_topk_index=index, old_topk_logp=logp, responses=sampled,
    )  # fmt: skip
    out = troll_objective(inp)
    token_mean(out.loss_mat, mask).backward()
    return out.metrics


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_it(fn, leaf: torch.Tensor, repeats: int, device: str) -> tuple[list[float], list[float]]:
    """Wall-clock and process CPU seconds of ``fn`` over ``repeats`` runs after one warm-up."""
    fn()
    wall, cpu = [], []
    for _ in range(repeats):
        leaf.grad = None
        _sync(device)
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        _sync(device)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return wall, cpu


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
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = args.device
    old, new, sampled, adv = make_batch(args.tokens, args.vocab, args.noise, dev)
    mask = torch.ones_like(adv)
    leaf = new.clone().requires_grad_()
    with torch.no_grad():
        logp_old = torch.log_softmax(old, -1).gather(-1, sampled.unsqueeze(-1)).squeeze(-1)

    t_ppo = time_it(lambda: ppo_step(leaf, logp_old, sampled, adv, mask), leaf, args.repeats, dev)
    metrics: dict[str, float] = {}
    t_troll = time_it(lambda: metrics.update(troll_step(leaf, old, sampled, adv, mask)), leaf, args.repeats, dev)
    t_sparsify = time_it(lambda: sparsify(old, sampled), leaf, args.repeats, dev)
    index, logp = sparsify(old, sampled)
    inp = PolicyInputs(
        logp=None, logp_old=None, advantages=adv, response_mask=mask, logits=leaf,
        old_topk_index=index, old_topk_logp=logp, responses=sampled,
    )  # fmt: skip
    t_loss = time_it(lambda: token_mean(troll_objective(inp).loss_mat, mask).backward(), leaf, args.repeats, dev)

    tokens, vocab = args.tokens, args.vocab
    print(f"device={dev} tokens={tokens} vocab={vocab} repeats={args.repeats} threads={torch.get_num_threads()}")
    print("wall = perf_counter, cpu = process CPU time (all threads); ratios are to the PPO row's medians")
    head = ["wall med", "wall best", "cpu med", "cpu best", "ratio wall", "ratio cpu"]
    print(f"{'step':<42}" + "".join(f"{h:>11}" for h in head))
    base_wall, base_cpu = statistics.median(t_ppo[0]), statistics.median(t_ppo[1])
    for name, (wall, cpu) in [
        ("PPO: log_softmax+gather+clip+backward", t_ppo),
        ("TROLL: sparsify old+objective+backward", t_troll),
        ("  of which sparsify(old)", t_sparsify),
        ("  of which objective+backward", t_loss),
    ]:
        row = [statistics.median(wall), min(wall), statistics.median(cpu), min(cpu)]
        row += [row[0] / base_wall, row[2] / base_cpu]
        print(f"{name:<42}" + "".join(f"{v:>11.4f}" for v in row))
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


if __name__ == "__main__":
    main()
