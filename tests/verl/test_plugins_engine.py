"""The engine hook and the actor loss on verl-shaped micro-batches, through verl's own engine code.

A tiny Qwen2 (float64, CPU) runs inside verl 0.9.1's ``FSDPEngineWithLMHead.prepare_model_inputs``
/ ``prepare_model_outputs`` (the body of ``forward_step`` without the device move and FSDP wrap),
with ``TrustbenchOutputsMixin`` installed, on a NO_PADDING TensorDict like the TransferQueue
delivers (nested prompts, responses, input_ids). Checked against independent computations:

- old pass: ``old_topk_index/logp`` equal ``runners.algorithms.troll.sparsify`` of each sequence's
  logits from a separate forward (both remove-padding and padded engine paths);
- update pass: ``trustbench_ppo_loss`` (verl's ``ppo_loss`` + the trustbench inputs) gives the loss
  and parameter gradients of the real ``LocalTrainer._update_actor`` run on the same model;
- the stored sparse form is <= 1/1000 of a dense fp32 row at the papers' vocabulary (V=151936).

Run: ``pytest tests/verl/test_plugins_engine.py``.
"""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from runners.algorithms import ESTIMATORS
from runners.algorithms.numerics import token_logprobs
from runners.algorithms.troll_sparse import dense_storage_bytes, sparse_storage_bytes, sparsify
from runners.algorithms.types import AdvantageInputs

from ._local_reference import Method, Problem, local_update

pytestmark = pytest.mark.verl
pytest.importorskip("verl.workers.engine.fsdp.transformer_impl")

VOCAB = 24
TEMPERATURE = 0.75  # exact in float32, as verl stores it
PROMPTS = [3, 5, 2, 4]
RESPONSES = [4, 2, 5, 3]
UIDS = ["a", "a", "b", "b"]
SPARSE = {"k": 6, "delta": 1e-5, "p_default": 1e-12, "chunk_size": 3}
# the same storage as a method's parameters (TROLL's trainer keys and solver arguments)
SPARSE_PARAMS = {"top_k": 6, "tail_mass": 1e-5, "p_default": 1e-12, "chunk_size": 3}


def _model(seed: int):
    from runners.models.tiny import build_tiny_model

    return build_tiny_model("qwen2", vocab_size=VOCAB, seed=seed, num_hidden_layers=2).double()


def _engine(module):
    import verl.utils.torch_functional as verl_F
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    from runners.backends.verl.plugins.sparse_old import install_trustbench_outputs

    engine = object.__new__(FSDPEngineWithLMHead)
    engine.pad_to_length = False
    engine.use_ulysses_sp = False
    engine.ulysses_sequence_parallel_size = 1
    engine.engine_config = SimpleNamespace(
        entropy_checkpointing=False, entropy_from_logits_with_chunking=False, entropy_from_logits_chunk_size=2048
    )
    engine.compute_entropy_from_logits = verl_F.entropy_from_logits
    engine.module = module
    return install_trustbench_outputs(engine)


def _sequences(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, VOCAB, (p,), generator=gen) for p in PROMPTS]
    responses = [torch.randint(0, VOCAB, (r,), generator=gen) for r in RESPONSES]
    return prompts, responses


def _nested(parts):
    return torch.nested.as_nested_tensor(list(parts), layout=torch.jagged)


def _batch(prompts, responses, *, remove_padding: bool, **fields):
    """A verl NO_PADDING micro-batch (what the TransferQueue hands a worker)."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    tensors = {
        "input_ids": _nested(torch.cat([p, r]) for p, r in zip(prompts, responses)),
        "position_ids": _nested(torch.arange(len(p) + len(r)) for p, r in zip(prompts, responses)),
        "prompts": _nested(prompts),
        "responses": _nested(responses),
        "response_mask": _nested(torch.ones(len(r), dtype=torch.int64) for r in responses),
        **{k: v for k, v in fields.items() if isinstance(v, torch.Tensor)},
    }
    td = TensorDict(tensors, batch_size=[len(prompts)])
    tu.assign_non_tensor(
        td,
        temperature=TEMPERATURE,
        use_remove_padding=remove_padding,
        use_fused_kernels=False,
        uid=list(UIDS),
        **{k: v for k, v in fields.items() if not isinstance(v, torch.Tensor)},
    )
    return td


def _forward(engine, td, loss_fn=None):
    """verl's forward_step body: prepare inputs, run the module, prepare outputs."""
    model_inputs, output_args = engine.prepare_model_inputs(td)
    raw = engine.module(**model_inputs, use_cache=False)
    return engine.prepare_model_outputs(raw, output_args, td, loss_fn)


def _response_logits(model, prompts, responses, rows=None) -> torch.Tensor:
    """[B, T, V] logits of each response token from a separate forward per sequence (padding 0)."""
    rows = range(len(prompts)) if rows is None else rows.tolist()
    width = max(len(r) for r in responses)
    out = []
    for i in rows:
        p, r = prompts[i], responses[i]
        logits = model(input_ids=torch.cat([p, r])[None]).logits[0, len(p) - 1 : len(p) - 1 + len(r)] / TEMPERATURE
        out.append(torch.nn.functional.pad(logits, (0, 0, 0, width - len(r))))
    return torch.stack(out)


def _padded(parts, fill=0):
    width = max(len(x) for x in parts)
    return torch.stack([torch.nn.functional.pad(torch.as_tensor(x), (0, width - len(x)), value=fill) for x in parts])


@pytest.mark.parametrize("remove_padding", [True, False])
def test_old_pass_stores_sparsify_of_each_response(remove_padding):
    """old_topk_index/logp from the engine hook equal sparsify() of independently computed logits (the
    kept tokens' true log-probs, ``renormalize=False``, as the built-in trainer stores them);
    verl's own log_probs are untouched and consistent with the stored top-K's last slot."""
    from verl.workers.utils.padding import response_from_nested

    from runners.backends.verl.plugins.sparse_old import OLD_TOPK_INDEX, OLD_TOPK_LOGP, SPARSIFY_KEY

    prompts, responses = _sequences()
    old_model = _model(1)
    engine = _engine(old_model)
    td = _batch(prompts, responses, remove_padding=remove_padding, calculate_entropy=True, **{SPARSIFY_KEY: SPARSE})
    with torch.no_grad():
        out = _forward(engine, td)
        ref_logits = _response_logits(old_model, prompts, responses)
    mask = _padded([torch.ones(len(r)) for r in responses])
    ref_idx, ref_lp = sparsify(
        ref_logits, _padded(responses), k=6, delta=1e-5, p_default=1e-12, chunk_size=1024, renormalize=False
    )
    idx = torch.nested.to_padded_tensor(out[OLD_TOPK_INDEX], 0).long()
    lp = torch.nested.to_padded_tensor(out[OLD_TOPK_LOGP], float("-inf"))
    real = mask > 0
    assert torch.equal(idx[real], ref_idx[real].long())
    torch.testing.assert_close(lp[real], ref_lp[real], rtol=1e-6, atol=1e-6)
    old_lp = torch.nested.to_padded_tensor(response_from_nested(out["log_probs"], td["response_mask"]), 0.0)
    torch.testing.assert_close(old_lp[real], token_logprobs(ref_logits, _padded(responses))[real], rtol=1e-9, atol=1e-9)
    assert out[OLD_TOPK_INDEX].values().dtype == torch.int32 and out[OLD_TOPK_LOGP].values().dtype == torch.float32


def test_old_pass_through_verl_dynamic_micro_batches():
    """verl's token-budget micro-batching (reordered sequences) and its output reassembly
    (``postprocess_batch_func``) return each sequence's top-K in the original batch order."""
    from verl.workers.engine.utils import postprocess_batch_func, prepare_micro_batches

    from runners.backends.verl.plugins.sparse_old import OLD_TOPK_INDEX, OLD_TOPK_LOGP, SPARSIFY_KEY

    prompts, responses = _sequences(seed=4)
    model = _model(1)
    extra = {SPARSIFY_KEY: SPARSE, "use_dynamic_bsz": True, "max_token_len_per_gpu": 12}
    td = _batch(prompts, responses, remove_padding=True, calculate_entropy=False, **extra)
    micro_batches, indices = prepare_micro_batches(td, dp_group=None, same_micro_num_in_dp=False)
    assert len(micro_batches) > 1 and list(np.concatenate(indices)) != list(range(4))
    with torch.no_grad():
        outputs = [{"model_output": _forward(_engine(model), mb), "loss": 0.0, "metrics": {}} for mb in micro_batches]
        whole = postprocess_batch_func(outputs, indices, td)["model_output"]
        ref_logits = _response_logits(model, prompts, responses)
    ref_idx, ref_lp = sparsify(ref_logits, _padded(responses), k=6, delta=1e-5, p_default=1e-12, renormalize=False)
    for i, length in enumerate(RESPONSES):
        assert torch.equal(whole[OLD_TOPK_INDEX].unbind()[i].long(), ref_idx[i, :length].long())
        torch.testing.assert_close(whole[OLD_TOPK_LOGP].unbind()[i], ref_lp[i, :length], rtol=1e-6, atol=1e-6)


def test_hook_is_inert_without_flags():
    """Without the trustbench flags the engine's outputs are exactly verl's."""
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    prompts, responses = _sequences()
    model = _model(0)
    td = _batch(prompts, responses, remove_padding=True, calculate_entropy=True)
    with torch.no_grad():
        ours = _forward(_engine(model), td)
        plain = object.__new__(FSDPEngineWithLMHead)
        plain.__dict__.update(_engine(model).__dict__)
        theirs = _forward(plain, td)
    assert set(ours) == set(theirs) == {"log_probs", "entropy"}
    for key in ours:
        assert torch.equal(ours[key].values(), theirs[key].values())


# thresholds inside the spread of the test batch (checked through the metrics below); the exact-KL
# cases keep the whole small vocabulary (k = V) so the stored support is the full distribution.
# TROLL polishes eta* to machine precision: the engine's packed forward and the reference's
# per-sequence forward differ in the last bits, which can move the bracketing search's argmin
# among nearly equal dual values (its stop width is 1e-5 in log eta).
CASES = {
    "troll_trm_max": (
        "trustbench_troll",
        Method(
            "troll",
            {"eps": 0.005, "polish_steps": 4, **SPARSE_PARAMS, "top_k": VOCAB},
            mask="trm_max",
            mask_params={"delta": 0.012},
        ),
    ),
    "troll_seq": (
        "trustbench_troll_seq",
        Method("troll", {"eps": 0.005, "polish_steps": 4, **SPARSE_PARAMS, "sequence": True}),
    ),
    "clip_trm_avg": (
        "trustbench_clip",
        Method("clip", mask="trm_avg", mask_params={"delta_avg": 0.009, "top_k": VOCAB}),
    ),
    "gtpo_repo_r": (
        "trustbench_gtpo",
        Method(
            "gtpo",
            {"gamma": 0.1},
            entropy_control="repo_r",
            entropy_control_params={"zeta0": 0.02},
            loss_agg="seq-mean-token-mean",
        ),
    ),
    "gspo_ser": ("trustbench_gspo", Method("gspo", mask="ser", mask_params={"delta_ser": 0.1})),
}


@pytest.mark.parametrize(
    ("case", "remove_padding"),
    [(case, True) for case in CASES] + [("troll_trm_max", False), ("gtpo_repo_r", False)],
)
def test_update_pass_equals_local_trainer(case, remove_padding):
    """Old pass then update pass through verl's engine code and ppo_loss with the trustbench hooks:
    loss and every parameter gradient equal LocalTrainer._update_actor on the same model and data."""
    from verl.workers.config.actor import ActorConfig
    from verl.workers.utils.padding import response_from_nested, response_to_nested

    from runners.backends.verl.plugins import register  # noqa: F401
    from runners.backends.verl.plugins.config import TrustbenchPolicyLossConfig
    from runners.backends.verl.plugins.losses import RUNTIME_KEY
    from runners.backends.verl.plugins.ppo_loss import trustbench_ppo_loss
    from runners.backends.verl.plugins.sparse_old import (
        KEEP_LOGITS_KEY,
        OLD_TOPK_INDEX,
        OLD_TOPK_LOGP,
        SPARSIFY_KEY,
    )

    loss_mode, method = CASES[case]
    sparse = method.objective == "troll" or method.mask.startswith("trm_")
    grad_entropy = method.objective == "gtpo"
    prompts, responses = _sequences(seed=2)
    old_model, model = _model(1), _model(3)
    with torch.no_grad():  # make the current policy a moderate drift of the old one
        for p_old, p in zip(old_model.parameters(), model.parameters()):
            p.copy_(p_old + 0.3 * (p - p_old))

    # old-log-prob pass through the engine hook
    flags = {SPARSIFY_KEY: method.sparse} if sparse else {}
    td = _batch(prompts, responses, remove_padding=remove_padding, calculate_entropy=True, **flags)
    with torch.no_grad():
        old_out = _forward(_engine(old_model), td)
    mask_nt = td["response_mask"]
    old_logp_nt = response_from_nested(old_out["log_probs"], mask_nt)

    # advantages (GRPO on fixed rewards) and the reference problem
    mask = _padded([torch.ones(len(r)) for r in responses]).double()
    rewards = torch.zeros_like(mask)
    rewards[torch.arange(4), torch.tensor(RESPONSES) - 1] = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    groups = torch.tensor([0, 0, 1, 1])
    adv, _ = ESTIMATORS.get("grpo")(AdvantageInputs(rewards, mask, group_index=groups))
    adv = adv.double()
    ctl_state = method.controller().state_dict()
    h_ini = 0.5 if method.objective == "gtpo" else None
    with torch.no_grad():
        old_logits = _response_logits(old_model, prompts, responses)
    prob = Problem(
        logits=None,
        old_logits=old_logits,
        responses=_padded(responses).long(),
        mask=mask,
        groups=groups,
        uids=np.array(UIDS, dtype=object),
        advantages=adv,
        old_logp=torch.nested.to_padded_tensor(old_logp_nt, 0.0),
    )
    if sparse:
        prob.old_topk_index = torch.nested.to_padded_tensor(old_out[OLD_TOPK_INDEX], 0).long()
        prob.old_topk_logp = torch.nested.to_padded_tensor(old_out[OLD_TOPK_LOGP], float("-inf"))
    ref_loss, _, _ = local_update(
        method,
        prob,
        method.controller(),
        h_ini=h_ini,
        model=model,
        forward=lambda rows: _response_logits(model, prompts, responses, rows),
    )
    ref_grads = [p.grad.detach().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)

    # update pass: verl's engine code + trustbench_ppo_loss (verl's ppo_loss inside)
    fields = {
        "old_log_probs": old_logp_nt,
        "advantages": response_to_nested(adv, mask_nt),
        "rollout_log_probs": old_logp_nt,  # on-policy, as local_update assumes
        KEEP_LOGITS_KEY: sparse,
        RUNTIME_KEY: {"entropy_control_state": ctl_state, "h_ini": h_ini},
        "calculate_entropy": grad_entropy,
        "dp_size": 1,
        "batch_num_tokens": int(mask.sum()),
        "global_batch_size": 4,
    }
    if sparse:
        fields[OLD_TOPK_INDEX] = old_out[OLD_TOPK_INDEX]
        fields[OLD_TOPK_LOGP] = old_out[OLD_TOPK_LOGP]
    td = _batch(prompts, responses, remove_padding=remove_padding, **fields)
    policy_loss = TrustbenchPolicyLossConfig(
        loss_mode=loss_mode,
        objective_params=dict(method.objective_params),
        mask=method.mask,
        mask_params=dict(method.mask_params),
        entropy_control=method.entropy_control,
        entropy_control_params=dict(method.entropy_control_params),
    )
    config = ActorConfig(
        strategy="fsdp",
        rollout_n=4,
        ppo_micro_batch_size_per_gpu=4,
        loss_agg_mode=method.loss_agg,
        policy_loss=policy_loss,
    )
    loss_fn = partial(trustbench_ppo_loss, config=config)
    model.train()
    model_output = _forward(_engine(model), td, loss_fn)
    loss, metrics = loss_fn(model_output=model_output, data=td)
    loss.backward()
    assert loss.detach().item() == pytest.approx(ref_loss, rel=1e-7, abs=1e-10)
    for p, ref in zip(model.parameters(), ref_grads):
        torch.testing.assert_close(p.grad, ref, rtol=1e-6, atol=1e-10)
    assert sum(float(g.abs().sum()) for g in ref_grads) > 0
    assert "actor/pg_loss" in metrics
    if method.mask != "none":
        assert 0 < np.mean(metrics["trm/accept_rate"].values) < 1
    if method.objective == "troll":
        assert 0 < np.mean(metrics["troll/projected_frac"].values) < 1


def test_stored_old_distribution_within_budget():
    """Stored top-K (K=64) per response token vs a dense fp32 row: <= 1/1000 at V=151936
    (TROLL, arXiv 2510.03817, eq. 23's vocabulary), from the tensors the hook returns; chunking changes nothing."""
    from runners.backends.verl.plugins.sparse_old import expand_rows, sparsify_rows

    vocab, n = 151936, 4
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(n + 1, vocab, generator=gen) * 3
    rows = expand_rows(torch.tensor([0, 2]), torch.tensor([2, 2]))
    sampled = torch.randint(0, vocab, (n,), generator=gen)
    idx, lp = sparsify_rows(logits, rows, sampled, k=64, delta=1e-5, p_default=1e-12, chunk_size=1)
    per_token = (idx.nbytes + lp.nbytes) / n
    assert per_token == sparse_storage_bytes(1, 1, 65) == 520
    assert per_token / dense_storage_bytes(1, 1, vocab) <= 1e-3
    idx2, lp2 = sparsify_rows(logits, rows, sampled, k=64, delta=1e-5, p_default=1e-12, chunk_size=1024)
    assert torch.equal(idx, idx2) and torch.equal(lp, lp2)
    assert torch.equal(rows, torch.tensor([0, 1, 2, 3]))


def test_unchanged_policy_is_accepted_at_a_real_vocabulary_size():
    """V = 4096, K = 64 (top-64 keeps a fraction of the mass): the engine stores the kept tokens' true
    log-probs and the plugin's exact-KL TRM-Max reads KL 0 and accepts every sequence for an unchanged
    policy (stored renormalised log-probs read -log(kept mass) and rejected all)."""
    from verl.workers.config.actor import ActorConfig
    from verl.workers.utils.padding import response_from_nested, response_to_nested

    from runners.backends.verl.plugins import register  # noqa: F401
    from runners.backends.verl.plugins.config import TrustbenchPolicyLossConfig
    from runners.backends.verl.plugins.losses import RUNTIME_KEY
    from runners.backends.verl.plugins.ppo_loss import trustbench_ppo_loss
    from runners.backends.verl.plugins.sparse_old import (
        KEEP_LOGITS_KEY,
        OLD_TOPK_INDEX,
        OLD_TOPK_LOGP,
        SPARSIFY_KEY,
    )
    from runners.models.tiny import build_tiny_model

    vocab = 4096
    model = build_tiny_model("qwen2", vocab_size=vocab, seed=4, num_hidden_layers=2).double()
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, vocab, (p,), generator=gen) for p in PROMPTS]
    responses = [torch.randint(0, vocab, (r,), generator=gen) for r in RESPONSES]
    sparse = {"k": 64, "delta": 1e-5, "p_default": 1e-12, "chunk_size": 1024}
    td_old = _batch(prompts, responses, remove_padding=True, calculate_entropy=False, **{SPARSIFY_KEY: sparse})
    with torch.no_grad():
        old_out = _forward(_engine(model), td_old)
    mass = torch.nested.to_padded_tensor(old_out[OLD_TOPK_LOGP], float("-inf")).double().exp().sum(-1)
    assert float(mass[mass > 0].max()) < 0.9
    mask_nt = td_old["response_mask"]
    old_logp_nt = response_from_nested(old_out["log_probs"], mask_nt)
    mask = _padded([torch.ones(len(r)) for r in responses]).double()
    fields = {
        "old_log_probs": old_logp_nt,
        "advantages": response_to_nested(torch.randn(mask.shape, dtype=torch.float64) * mask, mask_nt),
        OLD_TOPK_INDEX: old_out[OLD_TOPK_INDEX],
        OLD_TOPK_LOGP: old_out[OLD_TOPK_LOGP],
        KEEP_LOGITS_KEY: True,
        RUNTIME_KEY: {},
        "dp_size": 1,
        "batch_num_tokens": int(mask.sum()),
        "global_batch_size": 4,
    }
    td = _batch(prompts, responses, remove_padding=True, **fields)
    policy_loss = TrustbenchPolicyLossConfig(
        loss_mode="trustbench_clip", mask="trm_max", mask_params={"delta": 0.05, "top_k": 64}
    )
    config = ActorConfig(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=4, policy_loss=policy_loss)
    loss_fn = partial(trustbench_ppo_loss, config=config)
    _, metrics = loss_fn(model_output=_forward(_engine(model), td, loss_fn), data=td)
    assert np.mean(metrics["trm/accept_rate"].values) == 1.0
    assert max(metrics["trm/max_kl"].values) < 1e-5


@pytest.mark.parametrize("mask", ["trm_max_k2", "ser"])
def test_sample_masks_refuse_a_batch_without_rollout_log_probs(mask):
    """A method that declares ``rollout_logp`` (the sample-based masks) raises naming verl's
    ``rollout_log_probs`` when the batch lacks them, instead of comparing with pi_old; the same batch
    with them gives a finite loss."""
    from verl.workers.config.actor import ActorConfig
    from verl.workers.utils.padding import response_from_nested, response_to_nested

    from runners.backends.verl.plugins import register  # noqa: F401
    from runners.backends.verl.plugins.config import TrustbenchPolicyLossConfig
    from runners.backends.verl.plugins.losses import RUNTIME_KEY
    from runners.backends.verl.plugins.ppo_loss import trustbench_ppo_loss

    model = _model(1)
    prompts, responses = _sequences(seed=2)
    td_old = _batch(prompts, responses, remove_padding=True)
    with torch.no_grad():
        old_out = _forward(_engine(model), td_old)
    mask_nt = td_old["response_mask"]
    old_logp_nt = response_from_nested(old_out["log_probs"], mask_nt)
    shape = _padded([torch.ones(len(r)) for r in responses]).shape
    fields = {
        "old_log_probs": old_logp_nt,
        "advantages": response_to_nested(torch.ones(shape, dtype=torch.float64), mask_nt),
        RUNTIME_KEY: {},
        "dp_size": 1,
        "batch_num_tokens": sum(RESPONSES),
        "global_batch_size": 4,
    }
    policy_loss = TrustbenchPolicyLossConfig(loss_mode="trustbench_clip", mask=mask)
    config = ActorConfig(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=4, policy_loss=policy_loss)
    loss_fn = partial(trustbench_ppo_loss, config=config)
    td = _batch(prompts, responses, remove_padding=True, **fields)
    with pytest.raises(ValueError, match=f"mask={mask}.*rollout_log_probs"):
        loss_fn(model_output=_forward(_engine(model), td, loss_fn), data=td)
    td = _batch(prompts, responses, remove_padding=True, rollout_log_probs=old_logp_nt, **fields)
    loss, _ = loss_fn(model_output=_forward(_engine(model), td, loss_fn), data=td)
    assert torch.isfinite(loss)
