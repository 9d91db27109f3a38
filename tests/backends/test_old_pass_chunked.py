"""The old-log-prob pass from hidden states (``Head``, ``chunked_head``) against the pass from the dense logits.

From ``chunked_head.MIN_VOCAB`` tokens on, the built-in trainer's old pass reads the last hidden
states and the output layer and never holds the [rows, T, V] logits. Here both passes run on the same
tiny random Qwen2 (V = 40,000, above the threshold) for TROLL with diagnostics (its own and the
sampler's top-K stores): every entry must agree with the dense pass (log-probs and entropies within
1e-5 of it and of the float64 log_softmax of h W^T / T; the same kept tokens, up to near-ties at the
top-K boundary, with log-probs within 1e-5), with a stale float32 sampling copy (chunked too) and a
bfloat16 one (its store stays that of its own rounded logits); for Clip, the sampler's store kept for the
post-update KL from the sampler. The
trainer's choice of pass is checked on both sides of the threshold.
"""

from __future__ import annotations

import pytest
import torch

from runners.algorithms.chunked_head import MIN_VOCAB
from runners.algorithms.method import Method
from runners.backends.local.actor import Head, OldPass, old_pass
from runners.backends.local.policy import segment_hidden, segment_logits
from runners.backends.local.rollout import RolloutBatch
from runners.models.tiny import build_tiny_model

from ._batch import rollout_batch

V = 40_000
TEMPERATURE = 0.7


def _data(rows: int = 4, context: int = 5, length: int = 6) -> RolloutBatch:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, V, (rows, context + length), generator=g)
    attn = torch.ones_like(ids)
    attn[0, :2] = 0  # left padding in one row
    return rollout_batch(input_ids=ids, attention_mask=attn, context_length=context, responses=ids[:, context:])


def _passes(model, sampler, data, method, sampler_dense: bool):
    def logits(m):
        return lambda b, rows: segment_logits(
            m, b.input_ids[rows], b.attention_mask[rows], b.context_length, TEMPERATURE
        ).float()

    def head(m):
        def forward(b, rows):
            out = m.get_output_embeddings()
            hidden = segment_hidden(m, b.input_ids[rows], b.attention_mask[rows], b.context_length)
            return Head(hidden, out.weight, out.bias, TEMPERATURE)

        return forward

    kw = dict(method=method, micro_batch_size=2, precision="fp32", diagnostics=True)
    dense = old_pass(logits(model), data, rollout_forward=logits(sampler), **kw)
    sampler_forward = logits(sampler) if sampler_dense else head(sampler)
    chunked = old_pass(head(model), data, rollout_forward=sampler_forward, **kw)
    return dense, chunked


def _same_store(index_d, logp_d, index_c, logp_c, atol: float = 1e-5) -> None:
    """The same kept (token, log-prob) pairs per position, except tokens tied within 1e-4 with the last
    one kept, which float32 sums in another order may swap at the boundary of the top-K."""
    for pos in zip(*torch.nonzero(logp_d[..., 0] > -torch.inf, as_tuple=True)):
        d = {int(i): float(v) for i, v in zip(index_d[pos], logp_d[pos]) if v > -torch.inf}
        c = {int(i): float(v) for i, v in zip(index_c[pos], logp_c[pos]) if v > -torch.inf}
        assert len(d) == len(c) > 1
        for token in d.keys() & c.keys():
            assert abs(d[token] - c[token]) <= atol, (pos, token)
        edge = min(d.values())
        assert all(abs(v - edge) < 1e-4 for t, v in {**d, **c}.items() if (t in d) != (t in c)), pos


def test_the_chunked_old_pass_equals_the_dense_one():
    assert V >= MIN_VOCAB
    model = build_tiny_model("qwen2", vocab_size=V, seed=1, hidden_size=32, num_hidden_layers=1)
    sampler = build_tiny_model("qwen2", vocab_size=V, seed=1, hidden_size=32, num_hidden_layers=1).to(torch.bfloat16)
    with torch.no_grad():  # peaked rows (top token ~0.4-0.9); the store's cut at 1 - delta: test_chunked_head.py
        for m in (model, sampler):
            m.get_output_embeddings().weight.mul_(15.0)
    method = Method.from_params(objective="troll", objective_params={})
    assert method.requires("sparse_old")
    data = _data()
    dense, chunked = _passes(model, sampler, data, method, sampler_dense=True)
    computed = dense.computed().keys()
    assert computed == chunked.computed().keys() >= {"old_logp", "entropy", "old_topk_index", "pi_old_topk_index"}
    with torch.no_grad():  # the float64 reference of log pi_old
        h = segment_hidden(model, data.input_ids, data.attention_mask, data.context_length).double()
        ref = torch.log_softmax(h @ model.get_output_embeddings().weight.double().T / TEMPERATURE, -1)
        ref_logp = ref.gather(-1, data.responses.unsqueeze(-1)).squeeze(-1)
        ref_entropy = -(ref.exp() * ref).sum(-1)
    for got, expected, reference in (
        (chunked.old_logp, dense.old_logp, ref_logp),
        (chunked.entropy, dense.entropy, ref_entropy),
    ):
        torch.testing.assert_close(got.double(), reference, rtol=0, atol=1e-5)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    _same_store(dense.pi_old_topk_index, dense.pi_old_topk_logp, chunked.pi_old_topk_index, chunked.pi_old_topk_logp)
    # the bfloat16 sampler keeps its dense store (its rounded logits are what it sampled from)
    assert torch.equal(chunked.old_topk_index, dense.old_topk_index)
    assert torch.equal(chunked.old_topk_logp, dense.old_topk_logp)
    assert not torch.equal(chunked.old_topk_logp, chunked.pi_old_topk_logp)  # two policies, two stores
    # a float32 sampling copy (stale weights) goes through chunked_head as well
    stale = build_tiny_model("qwen2", vocab_size=V, seed=2, hidden_size=32, num_hidden_layers=1)
    with torch.no_grad():
        stale.get_output_embeddings().weight.mul_(15.0)
    dense, chunked = _passes(model, stale, data, method, sampler_dense=False)
    _same_store(dense.old_topk_index, dense.old_topk_logp, chunked.old_topk_index, chunked.old_topk_logp)
    # Clip needs no store, but with diagnostics the sampler's is kept for the post-update KL from the sampler
    clip = Method.from_params(objective="clip", objective_params={})
    dense, chunked = _passes(model, stale, data, clip, sampler_dense=False)
    assert dense.computed().keys() == chunked.computed().keys() and chunked.old_topk_index is None
    _same_store(
        dense.sampler_topk_index, dense.sampler_topk_logp, chunked.sampler_topk_index, chunked.sampler_topk_logp
    )


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_chunked_reference_pass_equals_float64_log_softmax(precision):
    """The reference model's pass (KL-to-reference term, ``policy_loss.kl_coef``) at large V: ``Head``s
    through ``chunked_head`` two rows at a time (the left-padded row and odd chunk included) give the
    float64 log-softmax of h W^T / T at the sampled tokens within 1e-5, rounded as the dense pass rounds."""
    from types import SimpleNamespace

    from runners.algorithms.numerics import round_logprobs
    from runners.backends.local.heads import response_logprobs

    model = build_tiny_model("qwen2", vocab_size=V, seed=3, hidden_size=32, num_hidden_layers=1)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(15.0)
    data = _data(rows=5)
    seen = []

    def head(b, rows):
        seen.append(rows)
        out = model.get_output_embeddings()
        hidden = segment_hidden(model, b.input_ids[rows], b.attention_mask[rows], b.context_length)
        return Head(hidden, out.weight, out.bias, TEMPERATURE)

    settings = SimpleNamespace(micro_batch_size=2, logprob_precision=precision)
    got = response_logprobs(head, data, chunked=True, settings=settings)
    assert seen == [slice(0, 2), slice(2, 4), slice(4, 6)]
    with torch.no_grad():
        h = segment_hidden(model, data.input_ids, data.attention_mask, data.context_length).double()
        ref = torch.log_softmax(h @ model.get_output_embeddings().weight.double().T / TEMPERATURE, -1)
        ref = ref.gather(-1, data.responses.unsqueeze(-1)).squeeze(-1)
    assert got.dtype == torch.float32 and got.shape == ref.shape
    if precision == "fp32":
        torch.testing.assert_close(got.double(), ref, rtol=0, atol=1e-5)
    else:  # rounded to bfloat16's grid as the dense pass rounds (a unit of ~4e-3 near log-probs of -1..-2)
        assert torch.equal(got, round_logprobs(got, precision))
        torch.testing.assert_close(got.double(), ref, rtol=1e-2, atol=0)
    assert (ref < -1e-3).any()  # not a trivially peaked case


@pytest.mark.parametrize(("vocab", "chunked"), [(MIN_VOCAB - 1, False), (MIN_VOCAB, True)])
def test_the_trainer_takes_the_chunked_pass_from_min_vocab_on(monkeypatch, vocab, chunked):
    from runners.backends.local import trainer as trainer_module

    seen = []

    def old_pass_spy(forward, batch, **kw):
        seen.append(forward(batch, slice(0, 1)))
        return OldPass()

    monkeypatch.setattr(trainer_module, "old_pass", old_pass_spy)
    stub = trainer_module.LocalTrainer.__new__(trainer_module.LocalTrainer)
    stub.model = build_tiny_model("qwen2", vocab_size=vocab, seed=0, hidden_size=16, num_hidden_layers=1)
    stub._sampler = stub.model
    stub.method = Method.from_params(objective="clip", objective_params={})

    class _Cfg:
        class trainer:  # noqa: N801 - the config's attribute names
            micro_batch_size = 2
            logprob_precision = "fp32"
            post_update_diagnostics = False

        class rollout:  # noqa: N801
            temperature = 1.0

    stub.cfg = _Cfg
    stub._old_pass(_data(rows=2, context=3, length=2))
    assert isinstance(seen[0], Head) is chunked
