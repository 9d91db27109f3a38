"""Loss aggregation and ``masked_mean`` on the edge cases that mutation testing showed the other tests leave
open: a batch with a single real token or a single non-empty sequence (the ``clamp(min=1)`` guards of the
denominators), ``masked_mean`` along a dimension, and the dtype of the result (the loss's, whatever the
mask's dtype).

References: the loops of ``test_ref_objectives`` (verl 0.9.1's ``agg_loss`` conventions; Dr. GRPO,
arXiv 2503.20783, sec. 3, for the constant-length norm) and numbers written by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from runners.algorithms import LOSS_AGGS
from runners.algorithms.loss_agg import masked_mean

from .test_ref_objectives import MODES, ref_aggregate

LOSS = np.array([[0.5, -1.25, 2.0, 4.0], [3.0, 7.0, -2.0, 1.5], [0.25, 0.75, -0.5, 6.0]])


@pytest.mark.parametrize("mode", MODES)
def test_a_single_real_token_is_the_whole_loss(mode):
    """One real token in the batch: every mode's denominators are 1 (token-mean, sequence count, that
    sequence's length); seq-mean-token-sum-norm divides by T = 4 only."""
    mask = np.zeros(LOSS.shape)
    mask[1, 2] = 1.0
    value = LOSS_AGGS.get(mode)(torch.tensor(LOSS), torch.tensor(mask))
    expected = -2.0 / 4 if mode == "seq-mean-token-sum-norm" else -2.0
    assert float(value) == pytest.approx(expected, rel=1e-15)
    assert float(value) == pytest.approx(ref_aggregate(LOSS, mask, mode), rel=1e-15)


@pytest.mark.parametrize("mode", MODES)
def test_one_non_empty_sequence_counts_once(mode):
    """Rows 0 and 2 empty, row 1 with three real tokens: the sequence count is 1 (not clamped to more)."""
    mask = np.zeros(LOSS.shape)
    mask[1, :3] = 1.0
    value = LOSS_AGGS.get(mode)(torch.tensor(LOSS), torch.tensor(mask))
    expected = {
        "token-mean": 8.0 / 3,
        "seq-mean-token-mean": 8.0 / 3,
        "seq-mean-token-sum": 8.0,
        "seq-mean-token-sum-norm": 8.0 / 4,
    }[mode]
    assert float(value) == pytest.approx(expected, rel=1e-15)
    assert float(value) == pytest.approx(ref_aggregate(LOSS, mask, mode), rel=1e-15)


@pytest.mark.parametrize("mode", MODES)
def test_result_has_the_loss_dtype_whatever_the_mask_dtype(mode):
    """A float32 loss with a float64 mask aggregates to float32 (the mask is cast to the loss's dtype)."""
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=np.float64)
    value = LOSS_AGGS.get(mode)(torch.tensor(LOSS, dtype=torch.float32), torch.tensor(mask))
    assert value.dtype == torch.float32
    assert float(value) == pytest.approx(ref_aggregate(LOSS, mask, mode), rel=1e-6)


def test_masked_mean_over_everything_and_along_a_dimension():
    """``masked_mean``: all real entries, per row (dim=-1 and dim=1), per column (dim=0); a row or column with
    one real entry is that entry, an empty one is 0; float32 values keep float32 with a float64 mask."""
    mask = np.array([[1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]], dtype=np.float64)
    values = torch.tensor(LOSS, dtype=torch.float32)
    m = torch.tensor(mask)
    total = masked_mean(values, m)
    assert total.dtype == torch.float32
    assert float(total) == pytest.approx((0.5 - 1.25 - 2.0) / 3, rel=1e-6)
    for dim in (-1, 1):
        rows = masked_mean(values, m, dim=dim)
        assert rows.dtype == torch.float32
        np.testing.assert_allclose(rows.numpy(), [(0.5 - 1.25) / 2, -2.0, 0.0], rtol=1e-6)
    cols = masked_mean(values, m, dim=0)
    np.testing.assert_allclose(cols.numpy(), [0.5, -1.25, -2.0, 0.0], rtol=1e-6)


def test_masked_mean_of_a_single_entry_is_that_entry():
    mask = torch.zeros(3, 4, dtype=torch.float64)
    mask[2, 3] = 1.0
    assert float(masked_mean(torch.tensor(LOSS), mask)) == 6.0
    assert float(masked_mean(torch.tensor(LOSS), torch.zeros(3, 4))) == 0.0
