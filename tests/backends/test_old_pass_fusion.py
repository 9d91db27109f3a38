"""The built-in trainer skips its old-log-prob pass only where the update's own forward gives the same numbers.

Reference: the same cell with the separate pass forced (``LocalTrainer._old_from_update`` patched to
None), from the same seed, on the CPU. Where the update is one on-policy epoch of one mini-batch, the
fused trainer must never run the pass and still log bitwise the same metrics (losses, entropy, clip
fractions, TROLL/TRM/GTPO metrics, post-update KL, rollout_corr/*), end with the same weights and
leave the same gradients (the pass's no-grad forward and the update's forward give the same floats
here), for methods that read every entry of the pass (TROLL's and exact TRM's sparse old
distribution, GTPO's entropy, a KL reference, a critic), micro-batched or not, with bf16-rounded
log-probs. Everywhere else (several epochs or mini-batches, a stale or bf16 sampler, a batch-entropy
controller, a rollout correction, dropout) the separate pass must run.
"""

from __future__ import annotations

import pytest
import torch

from runners.backends.local.actor import OldFromUpdate, OldPass, UpdateSettings, update_actor
from runners.backends.local.packed import dropout_free
from runners.backends.local.trainer import LocalTrainer
from runners.config import compose

from ._batch import rollout_batch
from ._tiny import TINY

ON_POLICY = [
    *TINY,
    "trainer.mini_batch_prompts=2",
    "trainer.ppo_epochs=1",
    "backend.num_threads=1",
    "backend.device=cpu",
]
NOT_COMPARED = ("timing_s/", "timing_cpu_s/", "perf/")


class NullTracker:
    def log_metrics(self, metrics, step):
        pass

    def flush(self, wait=True):
        pass


def _trainer(overrides, path, monkeypatch, *, separate: bool):
    cfg, _ = compose([*ON_POLICY, *overrides])
    trainer = LocalTrainer(cfg, NullTracker(), path)
    if trainer.method.requires("h_ini"):  # what train() measures before the first step
        trainer.h_ini = trainer._initial_entropy(trainer.method.h_ini_prompts)
    calls = []
    real = trainer._old_pass

    def counting(batch):
        calls.append(1)
        return real(batch)

    monkeypatch.setattr(trainer, "_old_pass", counting)
    if separate:
        monkeypatch.setattr(trainer, "_old_from_update", lambda: None)
    return trainer, calls


def _run(trainer, steps=2):
    history = []
    for step in range(steps):
        metrics = trainer.step(step)
        history.append({k: v for k, v in metrics.items() if not k.startswith(NOT_COMPARED)})
    return history


CELLS = {
    "grpo": [],
    "grpo_troll": ["+method=grpo_troll"],
    "grpo_trm": ["+method=grpo_trm"],
    "gtpo": ["algorithm=gtpo", "objective.h_ini_prompts=4"],
    "ppo_critic": ["algorithm=ppo"],
    "grpo_kl_micro_bf16": ["trainer.kl_coef=0.05", "trainer.micro_batch_size=4", "trainer.logprob_precision=bf16"],
}
# SmolLM2's vocabulary: every pass goes through chunked_head, and the fused update takes the old pass's
# entries from its loss's own pass (TROLL's loss gathering at that pass's own store; the exact-KL TRM
# masks from a no-grad pass first, as their loss sums in float64 and the old pass does not)
V49K = ["model=tiny_llama_v49k"]
CELLS.update(
    {
        "grpo_v49k": V49K,
        "grpo_v49k_no_diagnostics": [*V49K, "trainer.post_update_diagnostics=false"],
        "grpo_troll_v49k": [*V49K, "+method=grpo_troll"],
        "grpo_troll_v49k_no_diagnostics": [*V49K, "+method=grpo_troll", "trainer.post_update_diagnostics=false"],
        "grpo_trm_v49k": [*V49K, "+method=grpo_trm"],
        "gtpo_v49k": [*V49K, "algorithm=gtpo", "objective.h_ini_prompts=4"],
        "grpo_kl_micro_bf16_v49k": [*V49K, *CELLS["grpo_kl_micro_bf16"]],
    }
)


@pytest.mark.parametrize("cell", list(CELLS))
def test_fused_pass_gives_the_separate_pass_numbers(cell, tb_home, monkeypatch):
    fused, fused_calls = _trainer(CELLS[cell], tb_home / "fused", monkeypatch, separate=False)
    separate, separate_calls = _trainer(CELLS[cell], tb_home / "separate", monkeypatch, separate=True)
    got, expected = _run(fused), _run(separate)
    assert fused_calls == [] and len(separate_calls) == 2
    for step, (a, b) in enumerate(zip(got, expected)):
        assert set(a) == set(b), f"step {step}: metric names differ: {set(a) ^ set(b)}"
        for key in b:
            assert a[key] == b[key], f"step {step}: {key}"
    for (name, p), q in zip(fused.model.named_parameters(), separate.model.parameters()):
        assert torch.equal(p, q), f"weights {name}"
        assert torch.equal(p.grad, q.grad), f"gradient {name}"


@pytest.mark.parametrize(("cell", "saved"), [("grpo_v49k", 1), ("grpo_troll_v49k", 1), ("grpo_trm_v49k", 0)])
def test_the_fused_update_runs_the_output_layer_once_per_micro_batch(cell, saved, tb_home, monkeypatch):
    """The loss's own chunked_head pass gives the old pass's entries (TROLL's loss gathers at that pass's
    own top-K store): the fused step makes the separate step's chunked_head calls less the old pass's
    one (here one chunk of rows). The exact-KL TRM masks still run a no-grad pass first."""
    import runners.algorithms.chunked_head as module

    real = module.chunked_head
    counts = {"fused": 0, "separate": 0}
    for name in counts:
        trainer, _ = _trainer(CELLS[cell], tb_home / name, monkeypatch, separate=name == "separate")

        def counting(*args, _name=name, **kwargs):
            counts[_name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, "chunked_head", counting)
        trainer.step(0)
        monkeypatch.setattr(module, "chunked_head", real)
    assert counts["separate"] > 0
    assert counts["fused"] == counts["separate"] - saved


@pytest.mark.parametrize(
    "overrides",
    [
        ["trainer.ppo_epochs=2"],
        ["trainer.mini_batch_prompts=1"],
        ["rollout.staleness=1"],
        ["rollout.dtype=bfloat16"],
        ["entropy_control=repo_r"],
        ["rollout_correction=token_tis"],
    ],
    ids=lambda o: o[0],
)
def test_the_separate_pass_runs_where_pi_old_is_not_the_updates_forward(overrides, tb_home, monkeypatch):
    trainer, calls = _trainer(overrides, tb_home / "run", monkeypatch, separate=False)
    trainer.step(0)
    trainer.step(1)  # a stale sampler is a copy only once there is an older policy
    assert len(calls) == 2


def test_dropout_rules_the_fusion_out():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Dropout(0.0))
    assert dropout_free(model)
    model[1].p = 0.1
    assert not dropout_free(model)
    plain = torch.nn.Linear(3, 3)
    plain.config = type("Config", (), {})()
    plain.config.attention_dropout = 0.1
    assert not dropout_free(plain)
    plain.config.attention_dropout = 0.0
    assert dropout_free(plain)


def test_update_refuses_to_fill_the_old_pass_after_an_optimiser_step():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="one epoch of one mini-batch"):
        update_actor(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            None,
            None,
            rollout_batch(),
            OldPass(),
            None,
            torch.ones(2, 2),
            settings=UpdateSettings(2, 1.0, 0, 1.0, "fp32"),
            shuffle=torch.Generator(),
            fill_old=OldFromUpdate(None, False),
        )


def test_the_old_pass_entropy_is_the_guarded_entropy():
    from runners.algorithms.numerics import entropy_from_logits
    from runners.backends.local.actor import pi_old_entropy

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 1000, generator=g) * 4
    assert torch.equal(pi_old_entropy(logits), entropy_from_logits(logits))  # the same arithmetic, bitwise
    masked = logits.clone()
    masked[0, 1, :990] = float("-inf")  # a filtered vocabulary: the guarded version's case
    masked[1, 2, :] = float("-inf")  # no distribution at all: entropy 0
    assert torch.equal(pi_old_entropy(masked), entropy_from_logits(masked))
    assert not torch.isnan(pi_old_entropy(masked)).any()
