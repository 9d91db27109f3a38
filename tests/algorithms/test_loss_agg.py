"""Loss aggregation modes against verl's ``agg_loss``, gradient accumulation with global counts, and
the TRM convention that sequence masks keep the denominator (TRM, arXiv 2512.23075, eq. 50).

Run: ``pytest tests/algorithms/test_loss_agg.py``.
"""

from __future__ import annotations

import pytest
import torch

from runners.algorithms import LOSS_AGGS
from runners.algorithms.loss_agg import masked_mean, seq_mean_token_mean, seq_mean_token_sum_norm, token_mean

from ._ref_batches import random_mask

MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


@pytest.fixture(scope="module")
def core_algos():
    return pytest.importorskip("verl.trainer.ppo.core_algos")


def _loss_and_mask(seed: int, batch: int = 9, length: int = 11):
    gen = torch.Generator().manual_seed(seed)
    mask = random_mask(gen, batch, length, holes=True)
    mask[batch // 2] = 0  # a fully masked sequence: excluded from the sequence count, as in verl
    return torch.randn(batch, length, generator=gen), mask


def test_registry_names_are_verls_modes():
    assert sorted(LOSS_AGGS.names()) == sorted(MODES)


@pytest.mark.verl
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_modes_match_verl_agg_loss(core_algos, mode, seed):
    """Value and gradient of every mode equal verl's agg_loss on the same matrix and mask."""
    loss_mat, mask = _loss_and_mask(seed)
    ours_in = loss_mat.clone().requires_grad_(True)
    ref_in = loss_mat.clone().requires_grad_(True)
    ours = LOSS_AGGS.get(mode)(ours_in, mask)
    ref = core_algos.agg_loss(ref_in, mask, mode)
    torch.testing.assert_close(ours, ref)
    ours.backward()
    ref.backward()
    torch.testing.assert_close(ours_in.grad, ref_in.grad)


@pytest.mark.verl
@pytest.mark.parametrize("mode", MODES)
def test_micro_batches_with_global_counts_sum_to_the_batch_loss(core_algos, mode):
    """Micro-batch losses with the mini-batch's token and sequence counts add up to the full-batch
    loss, and each equals verl's agg_loss given batch_num_tokens / global_batch_size; a constant
    norm_len equals verl's loss_scale_factor."""
    loss_mat, mask = _loss_and_mask(3, batch=12)
    num_tokens = mask.sum()
    num_seqs = (mask.sum(-1) > 0).sum()
    kw = {"num_tokens": num_tokens, "num_seqs": num_seqs, "norm_len": 16}
    ref_kw = {"batch_num_tokens": num_tokens, "global_batch_size": num_seqs, "loss_scale_factor": 16}
    full = LOSS_AGGS.get(mode)(loss_mat, mask, **kw)
    parts = []
    for rows in (slice(0, 5), slice(5, 12)):
        part = LOSS_AGGS.get(mode)(loss_mat[rows], mask[rows], **kw)
        torch.testing.assert_close(part, core_algos.agg_loss(loss_mat[rows], mask[rows], mode, **ref_kw))
        parts.append(part)
    torch.testing.assert_close(sum(parts), full)
    if mode != "seq-mean-token-sum-norm":
        torch.testing.assert_close(full, LOSS_AGGS.get(mode)(loss_mat, mask))


def test_hand_case():
    """Rows (1, 2, pad) and (3, pad, pad): token-mean 2, seq-mean-token-mean (1.5 + 3) / 2,
    seq-mean-token-sum (3 + 3) / 2, seq-mean-token-sum-norm with T = 3: 3 / 3."""
    loss_mat = torch.tensor([[1.0, 2.0, 99.0], [3.0, 99.0, 99.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    expected = {
        "token-mean": 2.0,
        "seq-mean-token-mean": 2.25,
        "seq-mean-token-sum": 3.0,
        "seq-mean-token-sum-norm": 1.0,
    }
    for mode, value in expected.items():
        assert LOSS_AGGS.get(mode)(loss_mat, mask).item() == pytest.approx(value)


def test_sequence_mask_keeps_denominator():
    """TRM (arXiv 2512.23075) eq. 50: rejecting a sequence zeroes its numerator but not its share of the
    denominator (multiply loss_mat by the keep weights, keep the response mask)."""
    loss_mat = torch.tensor([[1.0, 1.0], [5.0, 5.0]])
    mask = torch.ones(2, 2)
    keep = torch.tensor([1.0, 0.0])
    assert token_mean(loss_mat * keep[:, None], mask).item() == pytest.approx(2 / 4)
    assert seq_mean_token_mean(loss_mat * keep[:, None], mask).item() == pytest.approx(1 / 2)
    assert seq_mean_token_sum_norm(loss_mat * keep[:, None], mask, norm_len=4).item() == pytest.approx(2 / 2 / 4)


@pytest.mark.parametrize("mode", MODES)
def test_empty_mask_gives_zero_not_nan(mode):
    loss = LOSS_AGGS.get(mode)(torch.randn(3, 4), torch.zeros(3, 4))
    assert loss.item() == 0.0
    assert masked_mean(torch.randn(3, 4), torch.zeros(3, 4)).item() == 0.0
