"""Batched KV-cache sampling for any Hugging Face causal LM (the local backend's rollout engine).

Design: one prefill forward over the left-padded prompts, then one single-token step per generated
position; every per-step operation is a batched tensor op (no Python work per row). The step is
done by a decoder from ``runners.models.decoders``: for Llama / Qwen2 / Qwen3 models with SDPA (the
embedded default, SmolLM2, Qwen2.5/3, Llama 3.x, the tiny test models) a lean forward over a
preallocated KV cache with fused projections; for anything else the model's own forward with a
``DynamicCache``. Profiling showed generate's time going to Python overhead, not arithmetic: its
per-step machinery (logits processors, stopping criteria, ``prepare_inputs_for_generation``, a
fresh 4-D mask) and the HF module stack itself. Here the decode-step mask is a view of one
preallocated boolean buffer, outputs are preallocated, and rows that have finished are dropped from
the batch and the cache once they are at least half of it (``compact=True``). Each distinct prompt
is prefilled once and its cache rows copied to the rows that repeat it (GRPO's n samples per
prompt). Sampling draws from the same probabilities as ``generate`` (temperature, then top-p) by
inverse CDF (``draw``: one uniform number per row, where ``torch.multinomial`` draws one per
vocabulary entry), so with ``compact=False``, the global RNG and ``generate``'s multinomial replaced
by ``draw`` it reproduces ``generate(do_sample=True)`` token for token; with a ``torch.Generator`` it
is deterministic.

Continuing unfinished responses (T-PPO truncated windows, arXiv 2506.15050 section 3): a prompt may already
hold a partial response. Join each row's prompt and partial response with
``join_left_padded(prompt_ids, prompt_mask, responses, response_mask, pad_token_id)`` and call
``generate`` on the result with the window length as ``max_new_tokens``; in greedy mode this equals
one long generation (tests/models/test_sampler.py checks it). Pass only the rows that did not finish.

    from runners.models.sampler import generate
    out = generate(model, input_ids, attention_mask, max_new_tokens=64, eos_token_id=tok.eos_token_id,
                   pad_token_id=tok.pad_token_id, generator=make_generator(model.device, 0))
    out.responses, out.response_mask, out.logp, out.finished

Benchmark against ``model.generate``: ``python tests/benchmarks/bench_sampler.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from runners.algorithms.numerics import token_logprobs
from runners.algorithms.workspace import Workspace


@dataclass
class GenerationOutput:
    """Sampled responses, right-padded; R <= max_new_tokens (generation stops once every row finished)."""

    # [B,R] long, sampled token ids, ``pad_token_id`` after a row's EOS
    responses: Tensor
    # [B,R] 1 on generated tokens (the EOS token included), 0 on padding; dtype of the attention mask
    response_mask: Tensor
    # [B,R] float32, log-prob of each token under the sampling distribution (0 on padding)
    logp: Tensor
    # [B] bool, True where the row emitted EOS, False where the token budget stopped it
    finished: Tensor


def _eos_tensor(eos_token_id: int | Sequence[int] | None, device: torch.device) -> Tensor | None:
    if eos_token_id is None:
        return None
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    return torch.tensor(ids, dtype=torch.long, device=device)


def filter_top_p(logits: Tensor, top_p: float) -> Tensor:
    """Nucleus filter: keep the smallest set of tokens whose probability reaches ``top_p``.

    logits [N,V] -> [N,V] with dropped entries set to -inf (the most likely token is always kept).
    """
    sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    drop_sorted = cumulative <= 1.0 - top_p
    drop_sorted[..., -1] = False
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def first_of_equal_rows(ids: Tensor, mask: Tensor) -> Tensor:
    """For each row of ``ids`` [B, C] under ``mask`` [B, C], the first row with the same real tokens at the
    same places (itself when none before it) -> [B] long. Tokens under a 0 mask are ignored."""
    rows = ids.shape[0]
    if rows <= 1 or ids.shape[1] == 0:
        return torch.arange(rows, device=ids.device)
    key = torch.where(mask.bool(), ids, -1)
    _, inverse = torch.unique(key, dim=0, return_inverse=True)
    first = torch.full((rows,), rows, dtype=torch.long, device=ids.device)
    first = first.scatter_reduce(0, inverse, torch.arange(rows, device=ids.device), reduce="amin")
    return first[inverse]


def make_generator(device: torch.device | str, seed: int) -> torch.Generator:
    """A seeded generator on ``device``: the one to pass to ``generate`` for a model on that device
    (``torch.rand`` refuses a generator on another device than the one it draws on)."""
    return torch.Generator(device=torch.device(device)).manual_seed(int(seed))


def check_generator_device(generator: torch.Generator | None, tensor: Tensor) -> None:
    """Raise a clear error when ``generator`` lives on another device type than ``tensor``."""
    if generator is not None and torch.device(generator.device).type != tensor.device.type:
        raise ValueError(
            f"sampling generator on {generator.device} but the model's probabilities on {tensor.device}: "
            f"create it with runners.models.sampler.make_generator({tensor.device.type!r}, seed)"
        )


def sample_next(
    logits: Tensor,
    *,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
    workspace: Workspace | None = None,
) -> tuple[Tensor, Tensor]:
    """Draw one token per row: logits [N,V] float32 -> (token [N] long, logp [N] float32).

    ``temperature == 0`` is greedy; its logp is then the untempered model log-prob of the argmax
    (a point mass would always give 0). Otherwise logp is under softmax(top_p(logits / temperature)).
    logp is the trainer's ``token_logprobs`` (x[y] - logsumexp(x)), not ``log_softmax``: ATen's CPU
    float32 log_softmax drifts with V (1.4e-4 at 151,936), which would show as a training-inference
    mismatch between the rollout and the trainer on the same policy.
    The [N,V] temporaries (scores, probabilities, logsumexp's) go into ``workspace``'s buffers
    (``generate`` passes one, reused step after step); None: a fresh one, fresh tensors.
    """
    ws = workspace if workspace is not None else Workspace()  # a fresh one: fresh tensors, the same values
    if temperature == 0.0:
        token = logits.argmax(dim=-1)
        return token, token_logprobs(logits, token, workspace=ws)
    scores = torch.div(logits, temperature, out=ws.like("scores", logits)) if temperature != 1.0 else logits
    if top_p < 1.0:
        scores = filter_top_p(scores, top_p)
    probs = torch.ops.aten._softmax.out(scores, -1, False, out=ws.like("probs", scores))  # ATen's softmax kernel
    check_generator_device(generator, probs)
    token = draw(probs, generator)
    return token, token_logprobs(scores, token, workspace=ws)


DRAW_BLOCK = 1024  # vocabulary entries per block of ``draw``'s two-level search


def draw(probs: Tensor, generator: torch.Generator | None, *, block: int = DRAW_BLOCK) -> Tensor:
    """One token per row of ``probs`` [N,V] (non-negative, rows need not sum to 1) -> [N] long.

    Inverse-CDF sampling: cumulative sums in float64, one uniform number per row scaled to the row's
    total, a binary search. The distribution is ``torch.multinomial``'s for one sample; the cost is
    not: multinomial draws an exponential number per vocabulary entry (84 ms for 64 x 49,152 on one
    CPU thread, against 10 ms here). A token of probability 0 (top-p's cut) is never drawn: its
    interval of the CDF is empty, and the uniform number is kept below the row's total (torch's lie in
    [0, 1) already; this does not rely on it), so trailing zeros are never reached.

    Above ``block`` entries the search has two levels: the sums of ``block``-entry blocks (float32,
    pairwise: relative error ~1e-7, that of the float32 probabilities themselves), their float64
    cumulative sums and a search among them, then the float64 cumulative sums of the chosen block
    alone and a search inside it at the same fraction of the block (kept below its total, as above).
    The float64 cumulative sum over all V entries, with its float64 copy of ``probs``, cost 25 ms per
    draw for 64 x 49,152 (SmolLM2's vocabulary) on one CPU thread
    (``tests/benchmarks/bench_sampler.py --draw``).
    """
    rows, vocab = probs.shape
    if vocab <= block:
        cdf = probs.cumsum(dim=-1, dtype=torch.float64)
        return _search(cdf, _uniform(probs, generator) * cdf[:, -1:])
    full = vocab // block * block
    sums = probs[:, :full].reshape(rows, -1, block).sum(-1)
    if full < vocab:
        sums = torch.cat([sums, probs[:, full:].sum(-1, keepdim=True)], dim=-1)
    sums = sums.double()
    cdf = sums.cumsum(dim=-1)
    u = _uniform(probs, generator) * cdf[:, -1:]
    chosen = _search(cdf, u)[:, None]  # [N,1]
    before = torch.where(chosen > 0, cdf.gather(1, (chosen - 1).clamp(min=0)), torch.zeros_like(u))
    share = ((u - before) / sums.gather(1, chosen)).clamp_(0.0, 1.0)  # where in the chosen block
    cols = chosen * block + torch.arange(block, device=probs.device)  # the chosen block's entries
    inside = probs.gather(1, cols.clamp(max=vocab - 1)).double().masked_fill_(cols >= vocab, 0.0).cumsum(dim=-1)
    return chosen.squeeze(-1) * block + _search(inside, share * inside[:, -1:])


def _uniform(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """[N,1] float64 uniform numbers in [0, 1), one per row of ``probs``."""
    return torch.rand((probs.shape[0], 1), generator=generator, dtype=torch.float64, device=probs.device)


def _search(cdf: Tensor, u: Tensor) -> Tensor:
    """[N] the index of the interval of cumulative sums ``cdf`` [N,K] that holds ``u`` [N,1] (in [0, the
    row's total]), with ``u`` kept strictly below the total, so an empty interval (a zero) is never picked."""
    total = cdf[:, -1:]
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, u, right=True).squeeze(-1)


def _decode_mask_kind(model, attention_mask: Tensor) -> str:
    """How decode steps pass their attention mask to the model.

    "none": no prompt padding, a single new token may attend to the whole cache. "bool" (SDPA) or
    "additive" (eager): a prebuilt ``[B,1,1,S]`` mask, which the model uses as is. "model": the 2-D
    mask, the model builds its own (other attention kernels, sliding-window layers).
    """
    config = model.config
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and any(kind != "full_attention" for kind in layer_types):
        return "model"
    if bool(attention_mask.bool().all()):
        return "none"
    impl = getattr(config, "_attn_implementation", None)
    return {"sdpa": "bool", "eager": "additive"}.get(impl, "model")


def _step_mask(keys: Tensor, length: int, kind: str, dtype: torch.dtype) -> Tensor | None:
    """The attention mask argument of a decode step over the first ``length`` cache positions.

    keys [B,S_max] bool (True = may be attended) -> None, [B,length] long, or [B,1,1,length].
    """
    if kind == "none":
        return None
    view = keys[:, :length]
    if kind == "model":
        return view.long()
    mask4d = view[:, None, None, :]
    if kind == "additive":
        additive = torch.zeros(mask4d.shape, dtype=dtype, device=keys.device)
        return additive.masked_fill(~mask4d, torch.finfo(dtype).min)
    return mask4d


def _check_inputs(input_ids: Tensor, attention_mask: Tensor, max_new_tokens: int, temperature: float, top_p: float):
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"input_ids and attention_mask must both be [B,P]; got {tuple(input_ids.shape)} and "
            f"{tuple(attention_mask.shape)}"
        )
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    lengths = attention_mask.sum(dim=-1)
    if bool((lengths == 0).any()):
        raise ValueError("every row needs at least one prompt token (attention_mask has an all-zero row)")
    if bool((attention_mask[:, -1] == 0).any()):
        raise ValueError("prompts must be left-padded: attention_mask[:, -1] must be 1 on every row")


@torch.inference_mode()
def generate(
    model,
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    eos_token_id: int | Sequence[int] | None,
    pad_token_id: int,
    generator: torch.Generator | None = None,
    compact: bool = True,
    fast: bool = True,
) -> GenerationOutput:
    """Sample up to ``max_new_tokens`` tokens per row with a KV cache.

    input_ids [B,P] long, left-padded; attention_mask [B,P] (1 on prompt tokens). ``eos_token_id``
    may be one id, several, or None (run to the budget). ``temperature=0`` is greedy. ``generator``
    seeds the draws (None uses the global RNG). ``compact`` drops finished rows from the batch;
    it changes how many random numbers each step consumes, not the distribution. ``fast`` uses the
    lean Llama-family decode step where supported (``runners.models.decoders``); False always
    decodes through the model's own forward.
    Returns a :class:`GenerationOutput` with R = number of steps run.
    """
    _check_inputs(input_ids, attention_mask, max_new_tokens, temperature, top_p)
    from runners.models.decoders import LlamaFamilyDecoder, make_decoder

    device = input_ids.device
    batch, prompt_len = input_ids.shape
    eos = _eos_tensor(eos_token_id, device)
    decoder = make_decoder(model, batch=batch, max_length=prompt_len + max_new_tokens, fast=fast)
    mask_kind = _decode_mask_kind(model, attention_mask)
    if isinstance(decoder, LlamaFamilyDecoder) and mask_kind != "none":
        mask_kind = "bool"
    logits_dtype = model.get_input_embeddings().weight.dtype

    responses = torch.full((batch, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
    response_mask = torch.zeros((batch, max_new_tokens), dtype=attention_mask.dtype, device=device)
    logps = torch.zeros((batch, max_new_tokens), dtype=torch.float32, device=device)
    # attention over [prompt | generated]; rows that finished keep attending to their pad tokens,
    # whose outputs are discarded
    keys = torch.zeros((batch, prompt_len + max_new_tokens), dtype=torch.bool, device=device)
    keys[:, :prompt_len] = attention_mask.bool()
    position = (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)
    next_position = position[:, -1:] + 1

    # the decode steps' [B,V] temporaries (scores, probabilities, logsumexp) reuse one set of buffers
    workspace = Workspace()
    logits = _prefill(decoder, input_ids, attention_mask, position)
    rows = torch.arange(batch, device=device)  # original row of each row still in the batch
    active = torch.ones(batch, dtype=torch.bool, device=device)  # over the current (compacted) batch
    steps = 0
    for t in range(max_new_tokens):
        token, logp = sample_next(
            logits, temperature=temperature, top_p=top_p, generator=generator, workspace=workspace
        )
        token = torch.where(active, token, pad_token_id)
        responses[rows, t] = token
        logps[rows, t] = torch.where(active, logp, 0.0)
        response_mask[rows, t] = active.to(response_mask.dtype)
        steps = t + 1
        if eos is not None:
            active = active & ~torch.isin(token, eos)
        if t + 1 == max_new_tokens:
            break
        n_active = int(active.sum())
        if n_active == 0:
            break
        if compact and 2 * n_active <= active.numel():
            keep = active.nonzero().squeeze(-1)
            decoder.select(keep)
            rows, token, active = rows[keep], token[keep], active[keep]
            keys, next_position = keys[keep], next_position[keep]
        keys[:, prompt_len + t] = True
        length = prompt_len + t + 1
        logits = decoder.step(token, next_position, _step_mask(keys, length, mask_kind, logits_dtype), length)
        next_position = next_position + 1

    if eos is None:
        finished = torch.zeros(batch, dtype=torch.bool, device=device)
    else:
        finished = torch.isin(responses[:, :steps], eos).any(dim=-1)
    return GenerationOutput(
        responses=responses[:, :steps],
        response_mask=response_mask[:, :steps],
        logp=logps[:, :steps],
        finished=finished,
    )


def _prefill(decoder, input_ids: Tensor, attention_mask: Tensor, position: Tensor) -> Tensor:
    """Prefill each distinct prompt once (GRPO samples n responses per prompt), then copy its cache rows
    and next-token logits to every row that repeats it. -> logits [B,V]."""
    batch = input_ids.shape[0]
    first = first_of_equal_rows(input_ids, attention_mask)
    distinct = (first == torch.arange(batch, device=first.device)).nonzero().squeeze(-1)
    if distinct.numel() == batch:
        return decoder.prefill(input_ids, attention_mask, position)
    slot = torch.empty(batch, dtype=torch.long, device=first.device)
    slot[distinct] = torch.arange(distinct.numel(), device=first.device)
    rows = slot[first]  # the prefilled row each row takes its cache and logits from
    logits = decoder.prefill(input_ids[distinct], attention_mask[distinct], position[distinct])
    decoder.select(rows)
    return logits[rows]


def left_pad(sequences: Sequence[Sequence[int]], *, pad_token_id: int) -> tuple[Tensor, Tensor]:
    """Token lists -> (input_ids [B,L], attention_mask [B,L]) with each row's tokens flush right.

    L is the longest sequence; the mask is 1 on real tokens. This is the prompt layout
    :func:`generate` expects.
    """
    width = max(len(seq) for seq in sequences)
    ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, seq in enumerate(sequences):
        if seq:
            ids[i, width - len(seq) :] = torch.as_tensor(seq, dtype=torch.long)
            mask[i, width - len(seq) :] = 1
    return ids, mask


def join_left_padded(
    prompt_ids: Tensor, prompt_mask: Tensor, responses: Tensor, response_mask: Tensor, *, pad_token_id: int
) -> tuple[Tensor, Tensor]:
    """Concatenate left-padded prompts with right-padded partial responses, re-left-padded.

    prompt_ids/prompt_mask [B,P], responses/response_mask [B,R] -> (input_ids [B,P+R],
    attention_mask [B,P+R]) with every row's real tokens (prompt then response) flush right,
    ready for :func:`generate` to continue the responses (T-PPO windows).
    """
    ids = torch.cat([prompt_ids, responses], dim=1)
    mask = torch.cat([prompt_mask.to(response_mask.dtype), response_mask], dim=1)
    # a stable sort on the 0/1 mask moves padding to the front and keeps token order
    order = torch.sort(mask.long(), dim=1, stable=True).indices
    ids = ids.gather(1, order)
    mask = mask.gather(1, order)
    ids = ids.masked_fill(mask == 0, pad_token_id)
    return ids, mask
