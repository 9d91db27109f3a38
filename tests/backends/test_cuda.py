"""CUDA paths: the same results on a GPU as on the CPU (skipped, and reported as such, without CUDA).

References: the CPU result of the same function on the same inputs (TROLL projection and its
gradient), ``model.generate`` on the GPU (greedy sampler), and for the trainer the same checks as
the CPU preset test (parameters change, metrics finite, every phase timed).
"""

from __future__ import annotations

import math

import pytest
import torch

from runners import metric_names
from runners.algorithms.loss_agg import token_mean
from runners.algorithms.troll import project, sparsify, troll_objective
from runners.algorithms.types import PolicyInputs
from runners.backends.local.trainer import LocalTrainer
from runners.config import compose
from runners.models.sampler import generate
from runners.models.tiny import build_tiny_model

from ._tiny import TINY
from .test_local_trainer import MemoryTracker

pytestmark = pytest.mark.gpu


def test_troll_projection_and_gradient_on_cuda_match_cpu():
    g = torch.Generator().manual_seed(0)
    old = torch.log_softmax(torch.randn(64, 4096, generator=g, dtype=torch.float64) * 3, -1)
    new = torch.log_softmax(old + 0.5 * torch.randn(64, 4096, generator=g, dtype=torch.float64), -1)
    weights = torch.randn(64, 4096, generator=g, dtype=torch.float64)

    def run(device: str):
        lq = new.detach().clone().to(device).requires_grad_(True)  # a fresh leaf per device
        out = project(lq, old.to(device), 0.05)
        (out.exp() * weights.to(device)).sum().backward()
        return out.detach().cpu(), lq.grad.cpu()

    out_cpu, grad_cpu = run("cpu")
    out_gpu, grad_gpu = run("cuda")
    torch.testing.assert_close(out_gpu, out_cpu, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(grad_gpu, grad_cpu, rtol=1e-7, atol=1e-9)


def _troll_batch(tokens: int = 256, vocab: int = 151936):
    """Old/new logits [1,T,V] float64 (a peaked old policy; the new one leaves the trust region on
    part of the tokens), sampled tokens and advantages [1,T], all from one seeded generator."""
    g = torch.Generator().manual_seed(3)
    old = torch.randn(1, tokens, vocab, generator=g, dtype=torch.float64) * 1.5
    heads = torch.randint(0, vocab, (1, tokens, 6), generator=g)
    old.scatter_add_(-1, heads, torch.tensor([30.0, 27, 25, 23, 21, 19], dtype=torch.float64).expand(1, tokens, 6))
    new = old + 0.3 * torch.randn(1, tokens, vocab, generator=g, dtype=torch.float64)
    sampled = torch.multinomial(torch.softmax(old[0], -1), 1, generator=g).view(1, tokens)
    adv = torch.randn(1, tokens, generator=g, dtype=torch.float64)
    return old, new, sampled, adv


def _troll_loss(device: str, new, sampled, adv, index, logp, polish_steps: int = 0):
    """Eq. 5 loss (token mean), its gradient in the logits and the troll/* metrics on ``device``."""
    leaf = new.detach().clone().to(device).requires_grad_(True)
    mask = torch.ones(adv.shape, dtype=torch.float64, device=device)
    out = troll_objective(
        PolicyInputs(
            logp=None,
            old_logp=None,
            advantages=adv.to(device),
            response_mask=mask,
            logits=leaf,
            old_topk_index=index.to(device),
            old_topk_logp=logp.to(device),
            responses=sampled.to(device),
        ),
        polish_steps=polish_steps,
    )
    loss = token_mean(out.loss_mat, mask)
    loss.backward()
    return loss.detach().cpu(), leaf.grad.cpu(), out.metrics


def test_sparse_troll_at_v152k_on_cuda_matches_cpu():
    """Where top-K keeps a small part of V (the case a 28-token vocabulary never reaches), the GPU
    keeps the CPU's token set with the same stored log-probs (float32, sparsify's storage type). On
    the same sparse old policy, with eta* polished to machine precision, it gives the CPU's loss,
    gradient and metrics (float64); with the paper's bracketing alone eta* is only known to the
    bracket's width (1e-5 in log eta), and the devices' sums can pick different brackets among nearly
    equal dual values (seen: loss off by 1.2e-9 relative), so there the check is at that precision."""
    old, new, sampled, adv = _troll_batch()
    index_c, logp_c = sparsify(old, sampled)
    index_g, logp_g = (t.cpu() for t in sparsify(old.cuda(), sampled.cuda()))
    assert index_c.shape[-1] < 151936 // 100
    torch.testing.assert_close(index_g.sort(-1).values, index_c.sort(-1).values, rtol=0, atol=0)
    torch.testing.assert_close(logp_g.sort(-1).values, logp_c.sort(-1).values, rtol=1e-6, atol=0)

    for polish, rtol in ((3, 1e-9), (0, 1e-6)):
        loss_c, grad_c, metrics_c = _troll_loss("cpu", new, sampled, adv, index_g, logp_g, polish)
        loss_g, grad_g, metrics_g = _troll_loss("cuda", new, sampled, adv, index_g, logp_g, polish)
        assert 0 < metrics_c["troll/projected_frac"] < 1
        torch.testing.assert_close(loss_g, loss_c, rtol=rtol, atol=0)
        torch.testing.assert_close(grad_g, grad_c, rtol=0, atol=rtol * float(grad_c.abs().max()))
        assert metrics_g.keys() == metrics_c.keys()
        for key in metrics_c:
            assert metrics_g[key] == pytest.approx(metrics_c[key], rel=max(rtol, 1e-6), abs=1e-12), key


def test_troll_update_reads_the_device_at_most_four_times():
    """A TROLL update step (objective + backward) at V = 151,936 synchronises with the host, as
    counted by torch's sync debug mode (one warning each), at most 4 times: the response rows and the
    projected rows (two ``nonzero``), one read for every input check, one for the metrics. The dual
    solver's stop step is known before its search (``troll_solver.bracket_steps``), so its 10 steps read
    nothing (14 syncs on an H200 when each step read its stop test; 27 when every check and metric was
    read on its own). The CPU suite counts the same reads: tests/algorithms/test_troll_accelerator_paths.py."""
    import warnings

    old, new, sampled, adv = (t.float() if t.is_floating_point() else t for t in _troll_batch(tokens=512))
    index, logp = sparsify(old.cuda(), sampled.cuda())
    leaf = new.cuda().requires_grad_(True)
    mask = torch.ones(adv.shape, device="cuda")
    inp = PolicyInputs(
        logp=None, old_logp=None, advantages=adv.cuda(), response_mask=mask, logits=leaf,
        old_topk_index=index, old_topk_logp=logp, responses=sampled.cuda(),
    )  # fmt: skip
    out = troll_objective(inp)
    assert 0 < out.metrics["troll/projected_frac"] < 1 and out.metrics["troll/dual_steps"] == 10
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            token_mean(troll_objective(inp).loss_mat, mask).backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    syncs = [str(w.message) for w in caught if "synchroniz" in str(w.message)]
    assert 1 <= len(syncs) <= 4, syncs


def test_greedy_sampler_on_cuda_equals_generate():
    """Greedy decoding on the GPU reproduces ``model.generate(do_sample=False)`` there (float64, so
    that kernel-order rounding cannot flip an argmax)."""
    model = build_tiny_model("qwen2", vocab_size=64, seed=2).to("cuda", torch.float64)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 64, (8, 7), generator=g)
    mask = torch.ones_like(ids)
    for row in range(8):
        mask[row, : row % 4] = 0  # left padding
    ids, mask = ids.masked_fill(mask == 0, 0).cuda(), mask.cuda()
    ref = model.generate(
        input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=30, pad_token_id=0, eos_token_id=1
    )[:, ids.shape[1] :]
    out = generate(model, ids, mask, max_new_tokens=30, temperature=0.0, eos_token_id=1, pad_token_id=0)
    assert torch.equal(out.responses, ref)


def test_trainer_runs_on_cuda(tb_home):
    cfg, _ = compose(["+method=grpo_troll", *TINY, "backend.device=cuda"])
    tracker = MemoryTracker()
    trainer = LocalTrainer(cfg, tracker, tb_home / "run", label="grpo_troll_cuda")
    assert next(trainer.model.parameters()).is_cuda
    before = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    for metrics in tracker.history.values():
        assert all(math.isfinite(v) for v in metrics.values())
        for key in (
            metric_names.TIMING_GEN,
            metric_names.TIMING_OLD_LOG_PROB,
            metric_names.TIMING_UPDATE_ACTOR,
            metric_names.PG_LOSS,
        ):
            assert key in metrics
