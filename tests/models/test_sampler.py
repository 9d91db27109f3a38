"""The KV-cache sampler against independent references.

- transformers' own ``model.generate`` (greedy, and sampling token for token from the same RNG);
- a full (cache-free) forward pass: the reported logp must be its log-softmax at the sampled tokens;
- the model's softmax for the first token (chi-square test on 4,000 draws);
- one long greedy generation for continued (T-PPO windowed) responses;
- hand-written cases for EOS/padding bookkeeping and re-left-padding.
"""

from __future__ import annotations

import pytest
import torch

from runners.models.decoders import supports_fast_decode
from runners.models.sampler import draw, filter_top_p, generate, join_left_padded, left_pad, sample_next
from runners.models.tiny import build_tiny_model

V = 64
PAD, EOS = 0, 1


def left_padded_prompts(batch: int = 8, width: int = 7, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random prompts of lengths width, width-1, ..., left-padded with PAD (ids 3..V-1 inside)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, V, (batch, width), generator=g)
    mask = torch.ones(batch, width, dtype=torch.long)
    for row in range(batch):
        mask[row, : row % 4] = 0
    return ids.masked_fill(mask == 0, PAD), mask


def grouped_prompts() -> tuple[torch.Tensor, torch.Tensor]:
    """8 rows repeating 3 prompts (as GRPO's n samples per prompt do), rows of a prompt not adjacent."""
    ids, mask = left_padded_prompts()
    rows = torch.tensor([0, 1, 0, 3, 1, 0, 3, 3])
    return ids[rows], mask[rows]


def prompt_batch(prompts: str) -> tuple[torch.Tensor, torch.Tensor]:
    return left_padded_prompts() if prompts == "distinct" else grouped_prompts()


def count_prefill_rows(model) -> list[int]:
    """Rows of each forward over more than one position (a prefill), recorded by a hook on the embedding."""
    rows: list[int] = []

    def hook(module, args, out):
        if args[0].dim() == 2 and args[0].shape[1] > 1:
            rows.append(args[0].shape[0])

    model.get_input_embeddings().register_forward_hook(hook)
    return rows


@pytest.fixture
def hf_draws_like_the_sampler(monkeypatch):
    """``generate(do_sample=True)`` samples with ``torch.multinomial(probs, num_samples=1)``; the sampler
    draws from the same probabilities by inverse CDF (``draw``), which consumes the RNG differently.
    With multinomial replaced by ``draw`` on the global RNG, the two must pick the same tokens."""

    def multinomial(probs, num_samples, *args, **kwargs):
        assert num_samples == 1 and not args and not kwargs.get("generator")
        return draw(probs, None)[:, None]

    monkeypatch.setattr(torch, "multinomial", multinomial)


@pytest.fixture(scope="module")
def model():
    return build_tiny_model("qwen2", vocab_size=V, seed=1)


def full_forward_logits(model, prompt_ids, prompt_mask, responses, response_mask) -> torch.Tensor:
    """[B,R,V] float32 logits predicting each response token, from one forward without a cache."""
    ids = torch.cat([prompt_ids, responses], dim=1)
    mask = torch.cat([prompt_mask, response_mask.long()], dim=1)
    position = (mask.cumsum(dim=1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position).logits.float()
    p = prompt_ids.shape[1]
    return logits[:, p - 1 : -1]


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("prompts", ["distinct", "groups"])
def test_greedy_equals_generate(arch, attn, padded, prompts):
    """Greedy decoding reproduces ``model.generate(do_sample=False)`` exactly; repeated prompts are prefilled once."""
    model = build_tiny_model(arch, vocab_size=V, seed=2)
    model.set_attn_implementation(attn)
    ids, mask = prompt_batch(prompts)
    if not padded:
        mask = torch.ones_like(mask)
    ref = model.generate(
        input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=30, pad_token_id=PAD, eos_token_id=EOS
    )[:, ids.shape[1] :]
    prefills = count_prefill_rows(model)
    out = generate(model, ids, mask, max_new_tokens=30, temperature=0.0, eos_token_id=EOS, pad_token_id=PAD)
    assert torch.equal(out.responses, ref)
    assert prefills == [8 if prompts == "distinct" else 3]


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama"])
@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9), (1.3, 0.5)])
@pytest.mark.parametrize("prompts", ["distinct", "groups"])
def test_sampling_equals_generate_token_for_token(arch, fast, temperature, top_p, prompts, hf_draws_like_the_sampler):
    """From the same global RNG state, sampling draws the same tokens as ``generate(do_sample=True)``
    (its multinomial replaced by ``draw``), through the lean decode step (``fast``) and through the
    model's own forward, with repeated prompts prefilled once."""
    model = build_tiny_model(arch, vocab_size=V, seed=3)
    assert supports_fast_decode(model)
    ids, mask = prompt_batch(prompts)
    kwargs = {"max_new_tokens": 40, "pad_token_id": PAD, "eos_token_id": EOS}
    torch.manual_seed(11)
    ref = model.generate(
        input_ids=ids, attention_mask=mask, do_sample=True, top_k=0, top_p=top_p, temperature=temperature, **kwargs
    )[:, ids.shape[1] :]
    torch.manual_seed(11)
    out = generate(model, ids, mask, temperature=temperature, top_p=top_p, compact=False, fast=fast, **kwargs)
    assert torch.equal(out.responses, ref)


def test_unfused_projections_match_generate(monkeypatch):
    """Models too large for fused weight copies run separate q/k/v and gate/up matmuls."""
    import runners.models.decoders as decoders

    monkeypatch.setattr(decoders, "FUSE_MAX_ELEMENTS", 0)
    model = build_tiny_model("qwen2", vocab_size=V, seed=8)  # q/k/v biases exercised
    ids, mask = left_padded_prompts()
    kwargs = {"max_new_tokens": 30, "pad_token_id": PAD, "eos_token_id": EOS}
    ref = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, **kwargs)[:, ids.shape[1] :]
    assert torch.equal(generate(model, ids, mask, temperature=0.0, **kwargs).responses, ref)


@pytest.mark.parametrize("vocab", [V, 3 * 1024 + 5])
def test_fast_and_generic_decoding_agree_with_compaction(vocab):
    """The lean decode step against the model's own forward, rows dropped mid-generation; above 1,024
    tokens its logits are computed in column blocks into one buffer reused step after step."""
    model = build_tiny_model("qwen3", vocab_size=vocab, seed=4)
    ids, mask = left_padded_prompts(batch=12, seed=12)
    kwargs = {"max_new_tokens": 40, "eos_token_id": [EOS, 2, 3, 4], "pad_token_id": PAD}
    fast = generate(model, ids, mask, generator=torch.Generator().manual_seed(0), fast=True, **kwargs)
    generic = generate(model, ids, mask, generator=torch.Generator().manual_seed(0), fast=False, **kwargs)
    assert torch.equal(fast.responses, generic.responses) and torch.equal(fast.finished, generic.finished)
    torch.testing.assert_close(fast.logp, generic.logp, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention", ["bmm", "sdpa"])
@pytest.mark.parametrize("prompts", ["distinct", "groups"])
def test_both_decode_attention_kernels_sample_what_generate_samples(
    attention, prompts, monkeypatch, hf_draws_like_the_sampler
):
    """The lean decoder's CPU attention (batched matmuls over a transposed key cache) and the one it runs
    elsewhere (SDPA, as on CUDA), each forced on CPU, with padded prompts and grouped-query heads (qwen3:
    4 query heads over 2): the same tokens as ``generate(do_sample=True)``, and with compaction the
    log-prob of every sampled token as a cache-free forward gives it."""
    import runners.models.decoders as decoders

    real, kinds = decoders.make_decoder, []
    monkeypatch.setattr(decoders, "make_decoder", lambda *a, **kw: real(*a, **kw, attention=attention))
    step = decoders.LlamaFamilyDecoder.step
    monkeypatch.setattr(
        decoders.LlamaFamilyDecoder, "step", lambda self, *a: kinds.append(self.attention) or step(self, *a)
    )
    model = build_tiny_model("qwen3", vocab_size=V, seed=3)
    assert model.config.num_attention_heads > model.config.num_key_value_heads
    ids, mask = prompt_batch(prompts)
    kwargs = {"max_new_tokens": 40, "pad_token_id": PAD, "eos_token_id": EOS}
    torch.manual_seed(5)
    ref = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, top_k=0, **kwargs)[:, ids.shape[1] :]
    torch.manual_seed(5)
    assert torch.equal(generate(model, ids, mask, compact=False, **kwargs).responses, ref)
    assert kinds and set(kinds) == {attention}
    # sampled with compaction (rows finishing at different steps on any of 6 EOS ids): each token's
    # log-prob is the cache-free forward's
    kwargs["eos_token_id"] = [EOS, 2, 3, 4, 5, 6]
    out = generate(model, ids, mask, compact=True, generator=torch.Generator().manual_seed(2), **kwargs)
    lengths = out.response_mask.sum(-1)
    assert int((2 * lengths < lengths.max()).sum()) >= len(lengths) // 2  # compaction ran
    logits = full_forward_logits(model, ids, mask, out.responses, out.response_mask)
    expected = torch.log_softmax(logits.double(), dim=-1).gather(-1, out.responses[..., None]).squeeze(-1)
    real = out.response_mask.bool()
    torch.testing.assert_close(out.logp[real].double(), expected[real], atol=1e-5, rtol=0)


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=2, n_positions=128)
    return GPT2LMHeadModel(config).eval()


def tiny_sliding_qwen2():
    # window 6 < prompt + response, sliding layers from layer 1 on
    return build_tiny_model(
        "qwen2", vocab_size=V, seed=5, use_sliding_window=True, sliding_window=6, max_window_layers=1
    )


@pytest.mark.parametrize("make", [tiny_gpt2, tiny_sliding_qwen2], ids=["gpt2", "qwen2-sliding-window"])
def test_other_architectures_take_the_generic_path(make):
    """Models outside the lean path (another family, sliding-window layers) still match ``generate``."""
    model = make()
    assert not supports_fast_decode(model)
    ids, mask = left_padded_prompts()
    kwargs = {"max_new_tokens": 20, "pad_token_id": PAD, "eos_token_id": EOS}
    ref = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, **kwargs)[:, ids.shape[1] :]
    out = generate(model, ids, mask, temperature=0.0, **kwargs)
    assert torch.equal(out.responses, ref)
    logits = full_forward_logits(model, ids, mask, out.responses, out.response_mask)
    ref_logp = torch.log_softmax(logits, dim=-1).gather(-1, out.responses[..., None]).squeeze(-1)
    real = out.response_mask.bool()
    torch.testing.assert_close(out.logp[real], ref_logp[real], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("temperature,top_p", [(0.0, 1.0), (1.0, 1.0), (0.7, 0.9)])
def test_sampled_logp_is_float64_accurate_at_qwen_vocabulary(temperature, top_p):
    """A peaked [64, 151,936] float32 row set (the rollout's case with a real vocabulary): the sampler's
    log-prob of each drawn token is within 1e-5 of float64 log_softmax of the same scores, as the
    trainer's is, so on-policy rollout and trainer log-probs agree (ATen's CPU log_softmax in float32
    is off by ~1e-4 here)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 151936, generator=g) * 2
    logits[:, :5] += torch.tensor([12.0, 10.0, 9.0, 8.0, 7.0])
    token, logp = sample_next(logits, temperature=temperature, top_p=top_p, generator=g)
    scores = logits / temperature if temperature else logits  # the sampler's float32 scores
    if top_p < 1.0:
        scores = filter_top_p(scores, top_p)
    exact = torch.log_softmax(scores.double(), -1).gather(-1, token[:, None]).squeeze(-1)
    assert logp.dtype == torch.float32
    torch.testing.assert_close(logp.double(), exact, rtol=0, atol=1e-5)


@pytest.mark.parametrize("compact", [True, False])
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.6, 0.8)])
def test_logp_equals_full_forward(model, compact, temperature, top_p):
    """logp = log_softmax(top_p(logits / T)) of a cache-free forward at the sampled tokens.

    Several EOS ids make rows finish at different steps, so ``compact=True`` really drops rows
    from the KV cache mid-generation.
    """
    ids, mask = left_padded_prompts(batch=12, seed=5)
    eos = [EOS, 2, 3, 4, 5]
    out = generate(
        model,
        ids,
        mask,
        max_new_tokens=48,
        temperature=temperature,
        top_p=top_p,
        eos_token_id=eos,
        pad_token_id=PAD,
        generator=torch.Generator().manual_seed(0),
        compact=compact,
    )
    lengths = out.response_mask.sum(dim=1)
    assert lengths.min() < lengths.max() // 2, "the case must exercise rows finishing early"
    logits = full_forward_logits(model, ids, mask, out.responses, out.response_mask) / temperature
    if top_p < 1.0:
        logits = filter_top_p(logits.flatten(0, 1), top_p).view_as(logits)
    ref = torch.log_softmax(logits, dim=-1).gather(-1, out.responses[..., None]).squeeze(-1)
    real = out.response_mask.bool()
    torch.testing.assert_close(out.logp[real], ref[real], atol=1e-4, rtol=1e-4)
    assert torch.all(out.logp[~real] == 0)
    assert torch.isfinite(ref[real]).all(), "a sampled token lies outside the top-p nucleus"


def test_greedy_logp_is_untempered_model_logprob(model):
    ids, mask = left_padded_prompts()
    out = generate(model, ids, mask, max_new_tokens=20, temperature=0.0, eos_token_id=None, pad_token_id=PAD)
    logits = full_forward_logits(model, ids, mask, out.responses, out.response_mask)
    assert torch.equal(out.responses, logits.argmax(dim=-1))
    ref = torch.log_softmax(logits, dim=-1).gather(-1, out.responses[..., None]).squeeze(-1)
    torch.testing.assert_close(out.logp, ref, atol=1e-4, rtol=1e-4)


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square p-value of token counts [V] against probabilities [V] (cells < 5 pooled)."""
    from scipy.stats import chisquare

    expected = probs.double() * counts.sum() / probs.double().sum()
    small = expected < 5
    obs, exp = counts[~small].double(), expected[~small]
    if small.any():
        obs = torch.cat([obs, counts[small].double().sum(0, keepdim=True)])
        exp = torch.cat([exp, expected[small].sum(0, keepdim=True)])
    return float(chisquare(obs.numpy(), exp.numpy()).pvalue)


# draw's search: one level (V <= block), two levels with a short last block (1,000 = 15 x 64 + 40), and
# two levels over whole blocks, one of them all zeros (the last 50 entries hold blocks 19 and half of 18)
BLOCKS = [1024, 64, 25]


@pytest.mark.parametrize("block", BLOCKS)
def test_draw_follows_its_probabilities_and_never_draws_a_zero(block):
    """20,000 draws from rows of a 1,000-token distribution with five heavy tokens, a light tail and
    zeros inside it and at its end: the counts fit (chi-square over the heavy tokens and the tail) and
    no zero-probability token comes up; rows need not be normalised."""
    V, n = 1000, 20_000
    probs = torch.full((V,), 0.1 / 900, dtype=torch.float32)
    probs[:5] = torch.tensor([0.3, 0.25, 0.15, 0.1, 0.1])
    zero = torch.zeros(V, dtype=torch.bool)
    zero[5:100:7], zero[-50:] = True, True
    probs[zero] = 0.0
    scale = 3.0  # unnormalised rows
    g = [torch.Generator().manual_seed(s) for s in range(10)]
    tokens = torch.cat([draw(probs.expand(2000, V) * scale, g[s], block=block) for s in range(10)])
    assert tokens.shape == (n,) and tokens.dtype == torch.long
    assert not zero[tokens].any()
    counts = torch.bincount(tokens, minlength=V)
    binned = torch.cat([counts[:5], counts[5:].sum()[None]])
    expected = torch.cat([probs[:5], probs[5:].sum()[None]])
    assert chi_square_pvalue(binned, expected / expected.sum()) > 1e-3


@pytest.mark.parametrize("block", [8, 2, 4])
def test_draw_at_a_uniform_number_of_one_picks_the_last_token_that_has_probability(monkeypatch, block):
    """torch's uniform numbers lie in [0, 1), but the draw does not rely on it: even at u = 1 (u times
    the row's total equal to the total) it stays on the last token of nonzero probability instead of
    running onto trailing zeros or past the row; with two levels also past an all-zero last block
    (block 2) or a short one (block 4)."""
    probs = torch.tensor([[0.5, 0.0, 0.25, 0.25, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]])
    monkeypatch.setattr(torch, "rand", lambda *a, **kw: torch.ones(a[0], dtype=torch.float64))
    assert draw(probs, None, block=block).tolist() == [3, 1]


@pytest.mark.parametrize("block", [2, 3, 4])
def test_the_two_level_draw_cuts_the_unit_interval_as_the_one_level_draw(monkeypatch, block):
    """At each uniform number u in a fine grid the two-level search picks the token whose CDF interval
    holds u (the one-level search's pick), zeros and a short last block included."""
    probs = torch.tensor(
        [[0.125, 0.0, 0.25, 0.0, 0.0, 0.375, 0.25, 0.0, 0.0, 0.0], [0.25, 0.0, 0.25, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5]]
    )
    grid = torch.linspace(0.0, 1.0, 401, dtype=torch.float64)[:-1]
    for u in grid:
        monkeypatch.setattr(torch, "rand", lambda *a, _u=u, **kw: torch.full(a[0], float(_u), dtype=torch.float64))
        assert draw(probs, None, block=block).tolist() == draw(probs, None, block=16).tolist(), float(u)


@pytest.mark.parametrize("temperature", [1.0, 0.1])
def test_first_token_follows_model_distribution(model, temperature):
    """4,000 first tokens fit softmax(logits / T) (chi-square p > 1e-3) and not the other temperature's."""
    n = 4000
    ids = torch.randint(3, V, (1, 6), generator=torch.Generator().manual_seed(7)).expand(n, 6)
    out = generate(
        model,
        ids,
        torch.ones_like(ids),
        max_new_tokens=1,
        temperature=temperature,
        eos_token_id=None,
        pad_token_id=PAD,
        generator=torch.Generator().manual_seed(1),
    )
    with torch.no_grad():
        logits = model(input_ids=ids[:1]).logits[0, -1].float()
    counts = torch.bincount(out.responses[:, 0], minlength=V)
    assert chi_square_pvalue(counts, (logits / temperature).softmax(-1)) > 1e-3
    other = 0.1 if temperature == 1.0 else 1.0  # the test has the power to see a wrong temperature
    assert chi_square_pvalue(counts, (logits / other).softmax(-1)) < 1e-6


def test_top_p_never_samples_outside_nucleus(model):
    n = 2000
    ids = torch.randint(3, V, (1, 6), generator=torch.Generator().manual_seed(8)).expand(n, 6)
    out = generate(
        model,
        ids,
        torch.ones_like(ids),
        max_new_tokens=1,
        top_p=0.3,
        eos_token_id=None,
        pad_token_id=PAD,
        generator=torch.Generator().manual_seed(2),
    )
    with torch.no_grad():
        probs = model(input_ids=ids[:1]).logits[0, -1].float().softmax(-1)
    order = probs.argsort(descending=True)
    # nucleus by hand: the shortest prefix of the sorted probabilities reaching 0.3
    k = int((probs[order].cumsum(0) < 0.3).sum()) + 1
    assert set(out.responses[:, 0].tolist()) <= set(order[:k].tolist())


def test_eos_padding_and_finished_flags(model):
    """After a row's first EOS: pad tokens, mask 0, logp 0; ``finished`` iff an EOS was emitted."""
    ids, mask = left_padded_prompts(batch=16, seed=9)
    eos = [EOS, 2, 3, 4]
    out = generate(
        model,
        ids,
        mask,
        max_new_tokens=30,
        eos_token_id=eos,
        pad_token_id=PAD,
        generator=torch.Generator().manual_seed(3),
    )
    assert 0 < int(out.finished.sum()) < 16, "the case must contain finished and unfinished rows"
    for row in range(16):
        tokens = out.responses[row].tolist()
        hits = [t for t, tok in enumerate(tokens) if tok in eos]
        end = hits[0] + 1 if hits else len(tokens)
        assert out.finished[row].item() == bool(hits)
        assert out.response_mask[row, :end].all() and not out.response_mask[row, end:].any()
        assert all(tok == PAD for tok in tokens[end:])
        assert torch.all(out.logp[row, end:] == 0) and torch.all(out.logp[row, :end] < 0)
    assert out.response_mask.dtype == mask.dtype and out.logp.dtype == torch.float32


def test_stops_when_every_row_finished(model):
    ids, mask = left_padded_prompts()
    out = generate(model, ids, mask, max_new_tokens=50, eos_token_id=list(range(V)), pad_token_id=PAD)
    assert out.responses.shape == (8, 1) and out.finished.all()
    out = generate(model, ids, mask, max_new_tokens=50, eos_token_id=None, pad_token_id=PAD)
    assert out.responses.shape == (8, 50) and not out.finished.any() and out.response_mask.all()


@pytest.mark.parametrize("compact", [True, False])
def test_deterministic_given_generator(model, compact):
    ids, mask = left_padded_prompts(batch=12)
    kwargs = {"max_new_tokens": 40, "eos_token_id": [EOS, 2, 3], "pad_token_id": PAD, "compact": compact}
    a = generate(model, ids, mask, generator=torch.Generator().manual_seed(4), **kwargs)
    torch.manual_seed(123)  # the global RNG must not matter
    b = generate(model, ids, mask, generator=torch.Generator().manual_seed(4), **kwargs)
    c = generate(model, ids, mask, generator=torch.Generator().manual_seed(5), **kwargs)
    for field in ("responses", "response_mask", "logp", "finished"):
        assert torch.equal(getattr(a, field), getattr(b, field))
    assert not torch.equal(a.responses, c.responses)


def test_compaction_does_not_change_greedy_output(model):
    ids, mask = left_padded_prompts(batch=12)
    kwargs = {"max_new_tokens": 40, "temperature": 0.0, "eos_token_id": [EOS, 2, 3, 4, 5, 6], "pad_token_id": PAD}
    a = generate(model, ids, mask, compact=True, **kwargs)
    b = generate(model, ids, mask, compact=False, **kwargs)
    assert torch.equal(a.responses, b.responses) and torch.equal(a.finished, b.finished)
    torch.testing.assert_close(a.logp, b.logp, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_continuation_equals_one_long_generation(arch):
    """Greedy: 12 tokens, then 18 more from prompt+partial response = 30 tokens in one go."""
    model = build_tiny_model(arch, vocab_size=V, seed=6)
    ids, mask = left_padded_prompts(seed=10)
    kwargs = {"temperature": 0.0, "eos_token_id": None, "pad_token_id": PAD}
    whole = generate(model, ids, mask, max_new_tokens=30, **kwargs)
    first = generate(model, ids, mask, max_new_tokens=12, **kwargs)
    ids2, mask2 = join_left_padded(ids, mask, first.responses, first.response_mask, pad_token_id=PAD)
    second = generate(model, ids2, mask2, max_new_tokens=18, **kwargs)
    assert torch.equal(torch.cat([first.responses, second.responses], dim=1), whole.responses)
    torch.testing.assert_close(torch.cat([first.logp, second.logp], dim=1), whole.logp, atol=1e-4, rtol=1e-4)


def test_join_left_padded_by_hand():
    prompt = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])
    prompt_mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    response = torch.tensor([[11, 12, 0], [13, 0, 0]])
    response_mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    ids, mask = join_left_padded(prompt, prompt_mask, response, response_mask, pad_token_id=0)
    assert ids.tolist() == [[0, 0, 0, 5, 6, 11, 12], [0, 0, 7, 8, 9, 10, 13]]
    assert mask.tolist() == [[0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1, 1]]


@pytest.mark.parametrize(
    "change,match",
    [
        ({"mask_fn": lambda m: m.flip(1)}, "left-padded"),
        ({"mask_fn": lambda m: m * 0}, "at least one prompt token"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
    ],
)
def test_bad_arguments_raise(model, change, match):
    ids, mask = left_padded_prompts()
    mask = change.pop("mask_fn", lambda m: m)(mask)
    kwargs = {"max_new_tokens": 4, "eos_token_id": EOS, "pad_token_id": PAD, **change}
    with pytest.raises(ValueError, match=match):
        generate(model, ids, mask, **kwargs)


def test_left_pad_matches_torch_pad_sequence():
    """left_pad lays token lists out as torch's own left padding does, with the mask on real tokens."""
    seqs = [[5, 6, 7], [8], [], [1, 2, 3, 4]]
    ids, mask = left_pad(seqs, pad_token_id=0)
    ref = torch.nn.utils.rnn.pad_sequence(
        [torch.tensor(s, dtype=torch.long) for s in seqs], batch_first=True, padding_value=0, padding_side="left"
    )
    assert torch.equal(ids, ref)
    assert mask.sum(-1).tolist() == [len(s) for s in seqs]
    assert torch.equal(mask, (torch.arange(4)[None, :] >= 4 - torch.tensor([len(s) for s in seqs])[:, None]).long())
