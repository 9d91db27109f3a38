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
from runners.algorithms.troll import project
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
        lq = new.to(device).requires_grad_(True)
        out = project(lq, old.to(device), 0.05)
        (out.exp() * weights.to(device)).sum().backward()
        return out.detach().cpu(), lq.grad.cpu()

    out_cpu, grad_cpu = run("cpu")
    out_gpu, grad_gpu = run("cuda")
    torch.testing.assert_close(out_gpu, out_cpu, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(grad_gpu, grad_cpu, rtol=1e-7, atol=1e-9)


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
