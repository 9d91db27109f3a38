"""Same cell, same numbers: verl's first update equals the built-in backend's loss path on verl's batch.

For GRPO (verl's own vanilla loss and GRPO estimator), GRPO + TROLL and PPO + exact-KL TRM-Max + EGAE
(the trustbench plugin loss, with the sparse old distribution from verl's engine), the stage's verl
run saved every actor micro-batch it trained on (``runners.backends.verl.plugins.batch_dump``). Iteration 1
starts from the exported model directory, so the test loads that model and recomputes, on exactly
those tensors (prompts, responses, verl's old log-probs, sparse old distribution, rollout log-probs
and advantages, verl's global token and sequence counts), the built-in backend's loss path:
``runners.backends.local.policy.segment_logits`` for the current logits and
``runners.backends.local.actor.micro_batch_loss`` with ``runners.algorithms.policy_loss.PolicyLoss``
of the cell's ``Method``. The loss summed over the micro-batches and the gradient norm of its
backward must equal verl's ``actor/pg_loss`` and ``actor/grad_norm`` of step 1 within 1e-4 relative.
A batch whose advantages are all zero would make the check vacuous: the test requires a non-zero
gradient.

The post-update diagnostics too: iteration 2's last update left the weights of verl's final
checkpoint, so the built-in backend's ``post_update_metrics`` with that model on iteration 2's
dumped batch (its pi_old top-K and old log-probs) must give verl's ``actor/post_update_kl``,
``actor/post_update_kl_max``, ``actor/post_update_kl_frac_above_<eps>`` and ``gtpo/conflict_prob_delta`` of step 2.

The Roofline points too: verl's logged arithmetic intensity per phase is the built-in FLOP and byte
counts of the lengths in the dumped step-1 batch.

Run: ``pytest -m verl_cpu tests/verl/test_cpu_cross_backend.py`` (uses the stage's runs).
"""

from __future__ import annotations

import pytest

from tests.verl.cpu_stage import STAGE_TEST_TIMEOUT_S

pytestmark = [pytest.mark.verl, pytest.mark.verl_cpu, pytest.mark.slow, pytest.mark.timeout(STAGE_TEST_TIMEOUT_S)]

REL = 1e-4


def _pad(rows, width: int, fill, *, left: bool = False):
    import torch

    trailing = tuple(rows[0].shape[1:])
    out = torch.full((len(rows), width, *trailing), fill, dtype=rows[0].dtype)
    for i, row in enumerate(rows):
        n = row.shape[0]
        if left:
            out[i, width - n :] = row
        else:
            out[i, :n] = row
    return out


def local_layout(fields: dict, pad_id: int) -> dict:
    """verl's jagged micro-batch in the built-in backend's layout: [B, C + R] with the prompts
    left-padded to C and the responses right-padded to R (the segment starts at column C)."""
    import torch

    prompts, responses = fields["prompts"], fields["responses"]
    context = max(p.shape[0] for p in prompts)
    width = max(r.shape[0] for r in responses)
    ids = torch.cat([_pad(prompts, context, pad_id, left=True), _pad(responses, width, pad_id)], dim=1)
    attention = torch.cat(
        [
            _pad([torch.ones_like(p) for p in prompts], context, 0, left=True),
            _pad([torch.ones_like(r) for r in responses], width, 0),
        ],
        dim=1,
    )
    out = {"input_ids": ids, "attention_mask": attention, "context": context, "width": width}
    out["responses"] = _pad(responses, width, pad_id).long()
    out["response_mask"] = _pad([m.float() for m in fields["response_mask"]], width, 0.0)
    for key in ("old_log_probs", "advantages", "rollout_log_probs"):
        if key in fields:
            out[key] = _pad([v.float() for v in fields[key]], width, 0.0)
    if "old_topk_index" in fields:
        out["old_topk_index"] = _pad([v.long() for v in fields["old_topk_index"]], width, 0)
        out["old_topk_logp"] = _pad([v.float() for v in fields["old_topk_logp"]], width, float("-inf"))
    return out


def builtin_recompute(cell) -> tuple[float, float, float, int]:
    """(loss, gradient norm, verl's own loss sum, micro-batches) of iteration 1 on the built-in path."""
    import torch

    from runners.algorithms.method import Method
    from runners.algorithms.policy_loss import PolicyLoss
    from runners.backends.local.actor import OldPass, micro_batch_loss
    from runners.backends.local.policy import segment_logits
    from runners.backends.verl.cpu.model_export import export_model
    from runners.models.loader import load_pretrained_dir
    from tests.backends._batch import rollout_batch

    records = [torch.load(path, weights_only=False) for path in sorted(cell.dump_dir.glob("update_*.pt"))]
    step1 = [r for r in records if r["meta"].get("global_steps") == 1]
    assert step1, f"no micro-batch of iteration 1 dumped in {cell.dump_dir}"
    model, tokenizer = load_pretrained_dir(export_model(cell.cfg.model), dtype="float32")
    model.train()
    model.zero_grad(set_to_none=True)
    loss_fn = PolicyLoss(Method.from_config(cell.cfg))
    total = 0.0
    for record in step1:
        batch = local_layout(record["fields"], tokenizer.pad_token_id)
        meta = record["meta"]
        dp = float(meta.get("dp_size", 1))
        logits = segment_logits(
            model, batch["input_ids"], batch["attention_mask"], batch["context"], float(meta.get("temperature", 1.0))
        )
        rows = torch.arange(logits.shape[0])
        data = rollout_batch(
            responses=batch["responses"],
            rollout_logp=batch.get("rollout_log_probs", batch["old_log_probs"]),
            group_index=torch.zeros(logits.shape[0], dtype=torch.long),
        )
        old = OldPass(
            old_logp=batch["old_log_probs"],
            old_topk_index=batch.get("old_topk_index"),
            old_topk_logp=batch.get("old_topk_logp"),
        )
        out = micro_batch_loss(
            loss_fn,
            logits,
            data,
            old,
            batch["advantages"],
            batch["response_mask"],
            rows,
            num_tokens=torch.tensor(float(meta["batch_num_tokens"]) / dp),
            num_seqs=torch.tensor(float(meta["global_batch_size"]) / dp),
        )
        out.loss.backward()
        total += float(out.loss.detach())
    grads = [p.grad.detach().double().reshape(-1) for p in model.parameters() if p.grad is not None]
    norm = float(torch.linalg.vector_norm(torch.cat(grads)))
    return total, norm, sum(r["loss"] for r in step1), len(step1)


@pytest.mark.parametrize("name", ["grpo", "troll", "trm_max_egae"])
def test_verl_update_equals_builtin_loss_path(cpu_stage, name):
    """verl's step-1 ``actor/pg_loss`` and ``actor/grad_norm`` = the built-in path on verl's own batch."""
    cell = cpu_stage.verl(name)
    run_id = cell.result["run_id"]
    verl_loss = dict(cpu_stage.history(run_id, "actor/pg_loss"))[1]
    verl_norm = dict(cpu_stage.history(run_id, "actor/grad_norm"))[1]
    loss, norm, dumped, micro = builtin_recompute(cell)
    assert norm > 1e-3, f"vacuous: iteration 1 of {name} has no gradient (all advantages zero?)"
    assert dumped == pytest.approx(verl_loss, rel=REL, abs=1e-7)  # the dump is the batch verl logged
    # on-policy step 1 the ratio is 1 and GRPO's advantages nearly cancel: the loss, a float32 token mean
    # of O(1) terms, can be ~1e-9, where only float32's floor (abs 1e-7, as for the dump) is meaningful
    assert loss == pytest.approx(verl_loss, rel=REL, abs=1e-7), (name, micro, loss, verl_loss)
    assert norm == pytest.approx(verl_norm, rel=REL), (name, micro, norm, verl_norm)


def _records(cell, step: int) -> list[dict]:
    import torch

    records = [torch.load(path, weights_only=False) for path in sorted(cell.dump_dir.glob("update_*.pt"))]
    return [r for r in records if r["meta"].get("global_steps") == step]


def _final_weights(cell):
    """The actor after the last update: verl's final checkpoint (FSDP2 state dict) in the exported model."""
    import torch

    from runners.backends.verl.cpu.model_export import export_model
    from runners.models.loader import load_pretrained_dir

    step = int((cell.run_dir / "verl" / "checkpoints" / "latest_checkpointed_iteration.txt").read_text())
    path = cell.run_dir / "verl" / "checkpoints" / f"global_step_{step}" / "actor" / "model_world_size_1_rank_0.pt"
    state = torch.load(path, weights_only=False)
    state = {k: (v.to_local() if hasattr(v, "to_local") else v) for k, v in state.items()}
    model, tokenizer = load_pretrained_dir(export_model(cell.cfg.model), dtype="float32")
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("lm_head" in k for k in missing), (missing, unexpected)
    return step, model.eval(), tokenizer


@pytest.mark.parametrize("name", ["grpo", "troll"])
def test_post_update_diagnostics_equal_builtin(cpu_stage, name):
    """verl's step-2 post-update KL and conflict-token change = the built-in diagnostics on verl's batch."""
    import torch

    from runners import metric_names
    from runners.backends.local.actor import OldPass
    from runners.backends.local.diagnostics import post_update_metrics
    from runners.backends.local.policy import segment_logits
    from tests.backends._batch import rollout_batch

    cell = cpu_stage.verl(name)
    step, model, tokenizer = _final_weights(cell)
    records = _records(cell, step)
    assert len(records) == 1, "one micro-batch per update expected (the test joins no micro-batches)"
    fields, meta = records[0]["fields"], records[0]["meta"]
    batch = local_layout(fields, tokenizer.pad_token_id)
    uids = meta["uid"]
    groups = torch.tensor([list(dict.fromkeys(uids)).index(u) for u in uids])
    data = rollout_batch(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        context_length=batch["context"],
        responses=batch["responses"],
        response_mask=batch["response_mask"],
        group_index=groups,
    )
    old = OldPass(
        old_logp=batch["old_log_probs"],
        pi_old_topk_index=batch["old_topk_index"],
        pi_old_topk_logp=batch["old_topk_logp"],
    )
    temperature = float(meta.get("temperature", 1.0))

    def forward(b, rows):
        return segment_logits(model, b.input_ids[rows], b.attention_mask[rows], b.context_length, temperature)

    expected = post_update_metrics(forward, data, old, batch["advantages"], chunk=1024, precision="fp32")
    assert metric_names.POST_UPDATE_KL in expected
    for key, value in expected.items():
        got = dict(cpu_stage.history(cell.result["run_id"], key))[step]
        assert got == pytest.approx(value, rel=REL, abs=1e-7), (key, got, value)
    diagnostics = (
        metric_names.POST_UPDATE_KL,
        metric_names.POST_UPDATE_KL_MAX,
        metric_names.GTPO_CONFLICT_PROB_DELTA,
        *map(metric_names.post_update_kl_frac_above, metric_names.POST_UPDATE_KL_THRESHOLDS),
    )
    at_step = {key for key in diagnostics if step in dict(cpu_stage.history(cell.result["run_id"], key))}
    assert at_step == set(expected)  # verl logged exactly what the built-in path computes for this batch


@pytest.mark.parametrize("name", ["grpo", "troll"])
def test_roofline_points_are_the_builtin_count_of_verls_batch(cpu_stage, name):
    """verl's logged ``perf/<phase>_arithmetic_intensity`` of step 1 = the built-in FLOP and byte counts
    (``runners.perf``) of the prompt and response lengths of every micro-batch verl trained on in step 1
    (the lengths the trainer plugin reads from TransferQueue, here read from the dumps), the model
    exported for the cell, in float32 (CPU mode), one epoch of one mini-batch."""
    from runners import metric_names
    from runners.backends.verl.cpu.model_export import export_model
    from runners.models.loader import load_pretrained_dir
    from runners.perf.flops import TransformerShape
    from runners.perf.roofline import phase_work

    cell = cpu_stage.verl(name)
    model, _ = load_pretrained_dir(export_model(cell.cfg.model), dtype="float32")
    shape = TransformerShape.from_model(model)
    prompts, responses = [], []
    for record in _records(cell, 1):
        fields = record["fields"]
        prompts += [int(p.shape[0]) for p in fields["prompts"]]
        responses += [int(m.sum()) for m in fields["response_mask"]]
    assert len(prompts) == cell.cfg.trainer.prompts_per_step * cell.cfg.trainer.n
    work = phase_work(shape, prompts, responses, old_pass=True, epochs=1, steps=1)
    for phase, (flops, moved) in work.items():
        logged = dict(cpu_stage.history(cell.result["run_id"], metric_names.arithmetic_intensity(phase)))[1]
        assert logged == pytest.approx(flops / moved, rel=1e-9), phase
        assert dict(cpu_stage.history(cell.result["run_id"], metric_names.achieved_tflops(phase)))[1] > 0
