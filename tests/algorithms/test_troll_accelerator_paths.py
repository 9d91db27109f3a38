"""TROLL's accelerator code paths, run on the CPU against independent references.

On a GPU the kept-mass logsumexp of the TROLL objective runs over contiguous blocks without a
per-block host read, and top-K over a large vocabulary runs in two stages (on every device). The
logsumexp path is chosen by device, so a CPU-only suite would never run it; here both are run on
CPU tensors and compared with:

- ``large_topk``: numpy's sort of each row (values exactly; indices where values are distinct),
  at vocabulary sizes with and without a remainder group, rows with -inf entries, and K above the
  number of groups (the plain ``torch.topk`` fallback);
- the device logsumexp: scipy's float64 logsumexp of the selected rows, -inf rows included;
- the dual search's stop step, known before the search (``bracket_steps``): the brackets' widths on the
  device after that many steps, and one step fewer; and the host reads of the search and the projection,
  counted on the CPU by ``tests/host_reads.py`` (none in the search, the projected rows' ``nonzero``
  in the projection).

The number of synchronisations on a real GPU is checked by tests/backends/test_cuda.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import logsumexp as scipy_logsumexp

from runners.algorithms.troll_solver import bracket_steps, categorical_kl, project_with_info, solve_dual
from runners.algorithms.troll_sparse import _TOPK_GROUP, _device_logsumexp, large_topk

from ..host_reads import HostReads


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


def _outside_pairs(rows: int, vocab: int, eps: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 log-prob pairs (new, old) [m, V], only rows whose KL(new || old) exceeds ``eps``."""
    g = torch.Generator().manual_seed(seed)
    old = torch.log_softmax(torch.randn(rows, vocab, generator=g, dtype=torch.float64) * 2, -1)
    new = torch.log_softmax(old + torch.randn(rows, vocab, generator=g, dtype=torch.float64), -1)
    outside = categorical_kl(new, old) > eps
    assert int(outside.sum()) >= rows // 2
    return new[outside], old[outside]


@pytest.mark.parametrize(("num_points", "tol"), [(2, 1e-3), (3, 1e-5), (8, 1e-5), (8, 1e-9), (16, 1e-7)])
def test_the_search_runs_until_every_bracket_is_narrower_than_tol(num_points, tol):
    """The stop step computed before the search is the step the device brackets pass ``tol``: with it
    every row converges (eta* inside the range), one step fewer none does."""
    new, old = _outside_pairs(64, 40, 0.05, seed=num_points)
    steps = bracket_steps(num_points, 200, tol, math.log(1e2) - math.log(1e-7))
    done = solve_dual(new, old, 0.05, num_points=num_points, max_steps=200, tol=tol)
    assert done.steps == steps and bool(done.converged.all())
    short = solve_dual(new, old, 0.05, num_points=num_points, max_steps=steps - 1, tol=tol)
    assert short.steps == steps - 1 and not bool(short.converged.any())


def test_a_single_point_never_narrows_the_bracket():
    assert bracket_steps(1, 17, 1e-5, 20.0) == 17
    assert bracket_steps(1, 17, 30.0, 20.0) == 1  # already narrower than tol: stops after the first step
    assert bracket_steps(8, 4, 1e-5, 20.0) == 4  # max_steps first


def test_the_dual_search_never_reads_the_device_and_the_projection_once():
    """On a GPU each host read waits for the queued kernels. The search's 10 steps at the default
    settings read nothing (their stop step is known before); the projection reads the device once, for
    the rows to project (``nonzero``)."""
    new, old = _outside_pairs(64, 300, 0.05, seed=5)
    with HostReads() as reads:
        sol = solve_dual(new, old, 0.05)
    assert sol.steps == 10 and bool(sol.converged.all())
    assert reads.total == 0, reads.by_name
    leaf = new.clone().requires_grad_(True)
    with HostReads() as reads:
        out, info = project_with_info(leaf, old, 0.05)
        out.sum().backward()
    assert bool(info.projected.all()) and info.steps == 10
    assert dict(reads.by_name) == {"nonzero": 1}


def test_the_host_read_counter_sees_value_reads_and_value_sized_outputs():
    x = torch.arange(6.0)
    with HostReads() as reads:
        bool((x > 2).any()), float(x.sum()), x.tolist(), x[x > 2], (x > 1).nonzero(), x.max().item()
        x + 1, x.sum(), torch.where(x > 2, x, 0.0)  # no read: stay on the device
    assert dict(reads.by_name) == {
        "__bool__": 1,
        "__float__": 1,
        "tolist": 1,
        "__getitem__": 1,
        "nonzero": 1,
        "item": 1,
    }
