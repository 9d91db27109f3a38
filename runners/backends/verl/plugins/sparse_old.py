"""Old-policy top-K and current logits inside verl's engine forward (TROLL, arXiv 2510.03817, section 3.2, TRM (arXiv 2512.23075) eq. 51).

Design: verl 0.9.1 computes log pi_old in ``TrainingWorker.infer_batch`` -> ``engine.forward_step``
-> ``prepare_model_outputs``, the one place where the full [tokens, V] logits exist, and hands the
loss only ``log_probs``/``entropy``. ``TrustbenchOutputsMixin`` overrides ``prepare_model_outputs``
of the engine (FSDP/FSDP2 and engines sharing ``FSDPEngineWithLMHead``'s output layout) and acts on
two non-tensor flags the trustbench trainer puts on the batch:

- ``SPARSIFY_KEY`` (old-log-prob pass): each response token's distribution is reduced by
  ``runners.algorithms.troll.sparsify`` in chunks of ``chunk_size`` rows (the only dense fp32 copy
  is one chunk) and returned as ``old_topk_index`` (int32) / ``old_topk_logp`` (fp32), jagged
  [B, response_len, K+1] like verl's top-K teacher fields. verl writes every model output to the
  TransferQueue, so they reach the update pass with the batch. Stored: (K+1) x 8 bytes per response
  token (520 B at K=64), 1/1169 of a dense fp32 row at V=151936.
- ``KEEP_LOGITS_KEY`` (update pass): the temperature-scaled logits [N, V] (a view of the engine's
  own tensor, with gradient) and each response's first row in it go to ``model_output``, for
  ``plugins_ppo_loss`` to build the objective's [B,T,V] input.
- ``POST_UPDATE_KEY`` (a forward after the update): per response token KL(pi_new || pi_old) on the
  stored old top-K plus a rest bin (``post_update_kl_rows``), for ``actor/post_update_kl``.

Temperature scaling is done once here and handed to verl's own code as already-scaled logits, so
the log-probs verl computes and the logits the plugins see are the same numbers. Not supported
(clear errors): fused kernels (no materialised logits), Ulysses sequence parallelism (logits are
sharded along tokens). Megatron engines have no ``prepare_model_outputs``.

    engine = install_trustbench_outputs(engine)      # done by plugins_workers.TrustbenchTrainingWorker

Tests: ``pytest tests/verl/test_plugins_engine.py``.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict
from torch import Tensor

from runners.algorithms.troll_sparse import sparsify

# non-tensor batch entries set by the trustbench trainer
SPARSIFY_KEY = "trustbench_sparsify"  # dict(k, delta, p_default, chunk_size): sparsify in this pass
KEEP_LOGITS_KEY = "trustbench_logits"  # True: hand the logits to the loss
POST_UPDATE_KEY = "trustbench_post_update"  # chunk size: KL(new || old top-K) per response token (after the update)
# model outputs / batch fields
OLD_TOPK_INDEX = "old_topk_index"
OLD_TOPK_LOGP = "old_topk_logp"
LOGITS_OUTPUT = "trustbench_logits"  # [N, V] temperature-scaled logits (engine rows)
LOGIT_STARTS_OUTPUT = "trustbench_logit_starts"  # [B] row of LOGITS_OUTPUT predicting each response's 1st token
POST_KL_OUTPUT = "trustbench_post_kl"  # jagged [B, response_len] float32: KL(pi_new || pi_old) per token


def _flag(data: TensorDict, key: str, default):
    from verl.utils import tensordict_utils as tu

    return tu.get_non_tensor_data(data=data, key=key, default=default)


def prompt_response_lengths(data: TensorDict) -> tuple[Tensor, Tensor]:
    """Real prompt and response lengths [B] (long) of a verl micro-batch (nested or padded prompts)."""
    prompts, responses = data["prompts"], data["responses"]
    if prompts.is_nested:
        return prompts.offsets().diff().long(), responses.offsets().diff().long()
    attention = data["attention_mask"]
    width = prompts.shape[1]
    return attention[:, :width].sum(1).long(), attention[:, width:].sum(1).long()


def response_starts(data: TensorDict, padded_width: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Where each response's token predictions sit: ``(packed_starts, logit_starts, lengths)``, [B] each.

    The logits at packed row ``j`` of ``data["input_ids"]`` (nested, verl's NO_PADDING layout) predict
    token ``j + 1``, so response token ``t`` of sequence ``i`` is predicted at packed row
    ``cu[i] + prompt_len[i] - 1 + t`` (verl's ``no_padding_2_padding``). ``logit_starts`` is that row
    in the engine's flattened logits: the packed row (remove-padding path), or
    ``i * padded_width + prompt_len[i] - 1`` when the engine ran on right-padded [B, width] inputs.
    """
    prompt_lens, lengths = prompt_response_lengths(data)
    cu = data["input_ids"].offsets().long().to(lengths.device)
    packed = cu[:-1] + prompt_lens - 1
    if padded_width is None:
        return packed, packed, lengths
    rows = torch.arange(lengths.numel(), device=lengths.device) * padded_width + prompt_lens - 1
    return packed, rows, lengths


def expand_rows(starts: Tensor, lengths: Tensor) -> Tensor:
    """Concatenated ``starts[i] + arange(lengths[i])`` over i -> [sum(lengths)] long."""
    seq = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths)
    offsets = torch.cumsum(lengths, 0) - lengths
    return starts[seq] + torch.arange(seq.numel(), device=lengths.device) - offsets[seq]


def sparsify_rows(
    logits: Tensor, rows: Tensor, sampled: Tensor, *, k: int, delta: float, p_default: float, chunk_size: int
) -> tuple[Tensor, Tensor]:
    """``sparsify`` of ``logits[rows]`` ([N,V] -> [n,K+1] int32 and fp32), ``chunk_size`` rows at a time.

    ``sampled`` [n] holds the token each row predicted (kept in the last slot). ``k`` is capped at V,
    as the built-in trainer does.
    """
    vocab = logits.shape[-1]
    k = min(int(k), vocab)
    n = rows.numel()
    index = torch.zeros(n, k + 1, dtype=torch.int32, device=logits.device)
    logp = torch.full((n, k + 1), float("-inf"), dtype=torch.float32, device=logits.device)
    with torch.no_grad():
        for start in range(0, n, chunk_size):
            stop = min(start + chunk_size, n)
            chunk = logits.detach().index_select(0, rows[start:stop])
            index[start:stop], logp[start:stop] = sparsify(
                chunk,
                sampled[start:stop],
                k=k,
                delta=delta,
                p_default=p_default,
                chunk_size=chunk_size,
                renormalize=False,  # the kept tokens' true log-probs, as the built-in trainer stores them
            )
    return index, logp


def nested_by_lengths(values: Tensor, lengths: Tensor) -> Tensor:
    """Jagged nested tensor [B, lengths[i], ...] over consecutive rows of ``values`` [sum(lengths), ...]."""
    offsets = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)]).to(values.device)
    longest = int(lengths.max()) if lengths.numel() else 0
    return torch.nested.nested_tensor_from_jagged(values, offsets=offsets, min_seqlen=0, max_seqlen=longest)


def padded_from_nested(values: Tensor, width: int, fill: float = 0.0) -> Tensor:
    """[B, width, ...] right-padded copy of a jagged nested tensor (a padded tensor is cut/padded)."""
    if values.is_nested:
        trailing = tuple(values.values().shape[1:])
        return torch.nested.to_padded_tensor(values, fill, output_size=(values.size(0), width, *trailing))
    if values.shape[1] >= width:
        return values[:, :width]
    pad = values.new_full((values.shape[0], width - values.shape[1], *values.shape[2:]), fill)
    return torch.cat([values, pad], dim=1)


def response_logits(logits: Tensor, starts: Tensor, lengths: Tensor, width: int) -> Tensor:
    """[B, width, V] response logits gathered from the engine's rows ``logits`` [N, V] (differentiable).

    Row ``starts[i] + t`` for ``t < lengths[i]``; padding positions repeat a real row and must stay
    outside the response mask (every objective and mask ignores them).
    """
    rows = _response_rows(logits, starts, lengths, width)
    return logits.index_select(0, rows.reshape(-1)).view(starts.numel(), width, logits.shape[-1])


def _response_rows(logits: Tensor, starts: Tensor, lengths: Tensor, width: int) -> Tensor:
    """[B, width] row of ``logits`` for each response position (padding repeats the response's first row)."""
    steps = torch.arange(width, device=logits.device)
    rows = starts.to(logits.device)[:, None] + steps[None, :]
    rows = torch.where(steps[None, :] < lengths.to(logits.device)[:, None], rows, starts.to(logits.device)[:, None])
    return rows.clamp(0, logits.shape[0] - 1)


def response_topk_logp(logits: Tensor, starts: Tensor, lengths: Tensor, width: int, index: Tensor) -> Tensor:
    """[B, width, K] float64 log-probs of the engine's rows at the stored ids ``index`` [B, width, K]
    (``PolicyInputs.topk_logp``), without a [B, width, V] copy of the logits.

    The gathered logits carry the gradient; the rows' logsumexp (float64, in slices of 2**24 values, by
    ``troll_sparse.chunked_logsumexp``) does not: exact for TROLL, whose loss renormalises on the kept
    set (a per-row shift changes nothing, so the logsumexp's gradient term sums to zero), and for the
    exact-KL TRM masks, which read no gradient. Padding positions repeat a real row (as ``response_logits``).
    """
    from runners.algorithms.troll_sparse import chunked_logsumexp

    rows = _response_rows(logits, starts, lengths, width).reshape(-1)
    picked = logits[rows[:, None], index.to(logits.device).reshape(rows.numel(), -1).long()]
    slice_rows = max(1, (1 << 24) // logits.shape[-1])  # 2**24 values per float64 slice (128 MiB): 110 rows at Qwen's V
    lse = chunked_logsumexp(logits.detach(), rows, chunk_size=slice_rows, dtype=torch.float64)
    return (picked.double() - lse[:, None]).view(*index.shape)


def post_update_kl_rows(logits: Tensor, rows: Tensor, micro_batch: TensorDict, chunk_size: int) -> Tensor:
    """KL(pi_new || pi_old) [n] float32 of ``logits[rows]`` against the stored old top-K of the micro-batch
    (``runners.algorithms.diagnostics.coarse_reverse_kl``), ``chunk_size`` rows at a time."""
    from runners.algorithms.diagnostics import coarse_reverse_kl

    index = micro_batch[OLD_TOPK_INDEX].values().to(logits.device).long()
    old_logp = micro_batch[OLD_TOPK_LOGP].values().to(logits.device)
    out = torch.zeros(rows.numel(), dtype=torch.float32, device=logits.device)
    with torch.no_grad():
        for start in range(0, rows.numel(), chunk_size):
            stop = min(start + chunk_size, rows.numel())
            chunk = logits.detach().index_select(0, rows[start:stop])
            out[start:stop] = coarse_reverse_kl(chunk, index[start:stop], old_logp[start:stop]).float()
    return out


class TrustbenchOutputsMixin:
    """Adds ``old_topk_*`` (old pass) or the logits (update pass) to the engine's model outputs."""

    def prepare_model_outputs(self, output, output_args, micro_batch: TensorDict, logits_processor_func):
        sparse = _flag(micro_batch, SPARSIFY_KEY, None)
        keep_logits = bool(_flag(micro_batch, KEEP_LOGITS_KEY, False))
        post_chunk = _flag(micro_batch, POST_UPDATE_KEY, None)
        if not sparse and not keep_logits and not post_chunk:
            return super().prepare_model_outputs(output, output_args, micro_batch, logits_processor_func)
        logits, output_args = self._trustbench_scaled_logits(output, output_args, micro_batch)
        model_output = super().prepare_model_outputs(output, output_args, micro_batch, logits_processor_func)
        # remove-padding path: logits [1, N(+pad), V]; otherwise right-padded [B, width, V]
        width = None if "temperature_rmpad" in output_args else logits.shape[1]
        flat = logits.reshape(-1, logits.shape[-1])
        packed_starts, logit_starts, lengths = response_starts(micro_batch, width)
        if sparse:
            sampled = micro_batch["input_ids"].values()[expand_rows(packed_starts, lengths) + 1]
            index, logp = sparsify_rows(flat, expand_rows(logit_starts, lengths).to(flat.device), sampled, **sparse)
            model_output[OLD_TOPK_INDEX] = nested_by_lengths(index, lengths)
            model_output[OLD_TOPK_LOGP] = nested_by_lengths(logp, lengths)
        if keep_logits:
            model_output[LOGITS_OUTPUT] = flat
            model_output[LOGIT_STARTS_OUTPUT] = logit_starts
        if post_chunk:
            rows = expand_rows(logit_starts, lengths).to(flat.device)
            kl = post_update_kl_rows(flat, rows, micro_batch, int(post_chunk))
            model_output[POST_KL_OUTPUT] = nested_by_lengths(kl, lengths)
        return model_output

    def _trustbench_scaled_logits(self, output, output_args: dict, micro_batch: TensorDict):
        """Temperature-scaled logits, handed back to verl's code as unit-temperature logits."""
        if getattr(self, "use_ulysses_sp", False):
            raise ValueError(
                "trustbench TROLL / exact-KL TRM need whole logits: Ulysses sequence parallelism "
                "(ulysses_sequence_parallel_size > 1) is not supported"
            )
        if _flag(micro_batch, "use_fused_kernels", False) or getattr(output, "logits", None) is None:
            raise ValueError(
                "trustbench TROLL / exact-KL TRM need the logits: set actor_rollout_ref.model.use_fused_kernels=false"
            )
        logits = output.logits
        if hasattr(logits, "full_tensor"):  # tensor parallel: DTensor sharded on the vocabulary
            logits = logits.full_tensor()
        if not output_args.get("temperature_is_one", False):
            if "temperature_rmpad" in output_args:
                temperature = output_args["temperature_rmpad"].reshape(1, -1, 1)
            else:
                temperature = output_args["temperature"].reshape(-1, 1, 1)
            logits = logits / temperature.clamp(min=1e-8).to(logits.dtype)
        output.logits = logits
        return logits, {**output_args, "temperature_is_one": True}


_MIXED: dict[type, type] = {}


def install_trustbench_outputs(engine):
    """Make ``engine`` (an instance) use ``TrustbenchOutputsMixin``; returns it. Idempotent."""
    if isinstance(engine, TrustbenchOutputsMixin):
        return engine
    cls = type(engine)
    if not hasattr(cls, "prepare_model_outputs"):
        raise TypeError(
            f"{cls.__name__} has no prepare_model_outputs: the trustbench sparse-old / logits hooks support "
            "verl's FSDP/FSDP2 engines (actor.strategy=fsdp|fsdp2)"
        )
    if cls not in _MIXED:
        _MIXED[cls] = type(f"Trustbench{cls.__name__}", (TrustbenchOutputsMixin, cls), {"__module__": __name__})
    engine.__class__ = _MIXED[cls]
    return engine


__all__ = [
    "KEEP_LOGITS_KEY",
    "LOGITS_OUTPUT",
    "LOGIT_STARTS_OUTPUT",
    "POST_KL_OUTPUT",
    "POST_UPDATE_KEY",
    "OLD_TOPK_INDEX",
    "OLD_TOPK_LOGP",
    "SPARSIFY_KEY",
    "TrustbenchOutputsMixin",
    "expand_rows",
    "install_trustbench_outputs",
    "nested_by_lengths",
    "padded_from_nested",
    "post_update_kl_rows",
    "prompt_response_lengths",
    "response_logits",
    "response_topk_logp",
    "response_starts",
    "sparsify_rows",
]
