"""Loss aggregation modes: reduce a per-token loss matrix [B,T] to a scalar.

Modes (verl's agg_loss; Dr.GRPO arXiv 2503.20783 for the constant-length norm) and verl's names for them:

- ``token-mean``: sum over all tokens of the batch / number of tokens.
- ``seq-mean-token-mean``: mean over tokens of each sequence, then mean over sequences.
- ``seq-mean-token-sum``: sum over tokens of each sequence, then mean over sequences.
- ``seq-mean-token-sum-norm``: sum over tokens / a constant ``norm_len`` (Dr.GRPO; default T),
  then mean over sequences.

Sequence masks (TRM, TRM (arXiv 2512.23075) eq. 50) are applied by multiplying ``loss_mat`` by the keep weights
while ``loss_mask`` stays the response mask, so rejected sequences add zero to the numerator but
still count in the denominator (the total batch size N, not the number accepted).

Gradient accumulation: pass the global counts (``num_tokens``, ``num_seqs``) of the mini-batch so
that the sum of micro-batch losses equals the mini-batch loss.
"""

from __future__ import annotations

from torch import Tensor


def _seq_count(loss_mask: Tensor, num_seqs: float | None) -> Tensor | float:
    if num_seqs is not None:
        return num_seqs
    return (loss_mask.sum(-1) > 0).sum().clamp(min=1)


def token_mean(loss_mat: Tensor, loss_mask: Tensor, *, num_tokens: float | None = None, **_: object) -> Tensor:
    mask = loss_mask.to(loss_mat.dtype)
    denom = num_tokens if num_tokens is not None else mask.sum().clamp(min=1)
    return (loss_mat * mask).sum() / denom


def seq_mean_token_mean(loss_mat: Tensor, loss_mask: Tensor, *, num_seqs: float | None = None, **_: object) -> Tensor:
    mask = loss_mask.to(loss_mat.dtype)
    per_seq = (loss_mat * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return per_seq.sum() / _seq_count(mask, num_seqs)


def seq_mean_token_sum(loss_mat: Tensor, loss_mask: Tensor, *, num_seqs: float | None = None, **_: object) -> Tensor:
    mask = loss_mask.to(loss_mat.dtype)
    return (loss_mat * mask).sum(-1).sum() / _seq_count(mask, num_seqs)


def seq_mean_token_sum_norm(
    loss_mat: Tensor,
    loss_mask: Tensor,
    *,
    num_seqs: float | None = None,
    norm_len: float | None = None,
    **_: object,
) -> Tensor:
    norm = float(norm_len) if norm_len is not None else float(loss_mask.shape[-1])
    return seq_mean_token_sum(loss_mat, loss_mask, num_seqs=num_seqs) / norm


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``values`` where ``mask`` is non-zero (over all, or along ``dim``)."""
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1)


__all__ = [
    "masked_mean",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_sum_norm",
    "token_mean",
]
