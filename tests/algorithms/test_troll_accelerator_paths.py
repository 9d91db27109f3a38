"""TROLL's accelerator code paths, run on the CPU against independent references.

On a GPU the kept-mass logsumexp of the TROLL objective runs over contiguous blocks without a
per-block host read, and top-K over a large vocabulary runs in two stages (on every device). The
logsumexp path is chosen by device, so a CPU-only suite would never run it; here both are run on
CPU tensors and compared with:

- ``large_topk``: numpy's sort of each row (values exactly; indices where values are distinct),
  at vocabulary sizes with and without a remainder group, rows with -inf entries, and K above the
  number of groups (the plain ``torch.topk`` fallback);
- the device logsumexp: scipy's float64 logsumexp of the selected rows, -inf rows included.

The number of synchronisations on a real GPU is checked by tests/backends/test_cuda.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import logsumexp as scipy_logsumexp

from runners.algorithms.troll_sparse import _TOPK_GROUP, _device_logsumexp, large_topk


def _reference_topk(x: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Values and indices of the k largest entries per row by a stable numpy sort (descending)."""
    a = x.double().numpy()
    order = np.argsort(-a, axis=-1, kind="stable")[:, :k]
    return np.take_along_axis(a, order, -1), order


@pytest.mark.parametrize("vocab", [16384, 151936, 49152 + 77, 20000])
def test_two_stage_topk_equals_a_full_sort(vocab):
    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(12, vocab, generator=g) * 2
    heads = torch.randint(0, vocab, (12, 40), generator=g)
    x.scatter_(1, heads, torch.randn(12, 40, generator=g) + 15)  # several top tokens per group
    x[2] = -math.inf
    x[2, vocab - 1] = 3.0  # one finite entry, in the remainder group where there is one
    x[5, : vocab // 2] = -math.inf
    assert vocab // _TOPK_GROUP >= 64  # the two-stage path, not the fallback
    values, index = large_topk(x, 64)
    ref_values, ref_index = _reference_topk(x, 64)
    np.testing.assert_array_equal(values.double().numpy(), ref_values)
    finite = np.isfinite(ref_values)
    np.testing.assert_array_equal(index.numpy()[finite], ref_index[finite])
    assert int(index.max()) < vocab and torch.equal(x.gather(-1, index), values)


def test_two_stage_topk_falls_back_when_k_exceeds_the_groups():
    x = torch.randn(3, 20000, generator=torch.Generator().manual_seed(1))
    k = 20000 // _TOPK_GROUP + 1
    values, index = large_topk(x, k)
    ref_values, ref_index = _reference_topk(x, k)
    np.testing.assert_array_equal(values.double().numpy(), ref_values)
    np.testing.assert_array_equal(index.numpy(), ref_index)


def test_device_logsumexp_matches_scipy_on_selected_rows():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(37, 3000, generator=g) * 4
    x[3] = -math.inf
    x[7, :2999] = -math.inf  # one finite entry
    x[11] += 95.0  # exp overflows float32 without the shift
    rows = torch.tensor([0, 3, 7, 11, 36, 20, 19])
    for chunk in (1, 3, 1024):
        got = _device_logsumexp(x, rows, chunk, torch.float32)
        ref = scipy_logsumexp(x.double().numpy()[rows.numpy()], axis=-1)
        np.testing.assert_allclose(got.double().numpy(), ref, rtol=2e-6, atol=0)
    whole = _device_logsumexp(x, None, 5, torch.float64)
    np.testing.assert_allclose(whole.numpy(), scipy_logsumexp(x.double().numpy(), axis=-1), rtol=1e-12)
