"""TROLL (TROLL, arXiv 2510.03817, section 3, appendices A and B) against independent references.

- gradients: ``torch.autograd.gradcheck`` (finite differences, float64) through the dense
  projection, the sparse objective, the dense objective and the GSPO form;
- the projection: scipy's SLSQP on the simplex with the KL constraint, and scipy's brentq on the
  stationarity condition KL(q_eta || q_old) = eps for eta*;
- the sparse tail atom: the dense projection of the explicit V-dimensional sparse distributions of
  Definition A.1;
- Theorem A.2 and eq. 23: the paper's printed numbers, and the inequality on random distributions;
- sparsification: hand-computed cases;
- hypothesis properties: one-hot, uniform, -inf logits, tiny eps, length-1 sequences;
- the objective's other paths and contracts: responses=None (sparsify's layout) against the
  responses-given path and test_ref_troll.py's reference, input errors naming the field, the
  kept-mass metric against a float64 sum, the log-ratio clamp, float32 / bf16 inputs, the GSPO
  token count, the solver options (bracketing steps of Listing 3) and the defaults (paper values,
  conf/objective/troll.yaml).

Run: ``pytest tests/algorithms/test_troll.py``.
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq, minimize

from runners import metric_names
from runners.algorithms import OBJECTIVES
from runners.algorithms.components import TrollObjective
from runners.algorithms.troll import (
    dense_storage_bytes,
    project,
    project_with_info,
    solve_dual,
    sparse_storage_bytes,
    sparsify,
    theorem_a2_bound,
    troll_objective,
)
from runners.algorithms.troll_solver import categorical_kl
from runners.algorithms.troll_sparse import chunked_logsumexp, reduce_on_kept_set
from runners.algorithms.types import PolicyInputs

from .test_ref_troll import ref_loss

EPS = 0.05
PRECISE = {"polish_steps": 3}  # eta* to machine precision, as finite differences need


def _pair(rows: int, vocab: int, seed: int, scale: float = 2.0, shift: float = 1.5):
    """Random old and new log-probs [rows, V], float64; new = old + noise * shift."""
    g = torch.Generator().manual_seed(seed)
    old = torch.randn(rows, vocab, generator=g, dtype=torch.float64) * scale
    new = old + torch.randn(rows, vocab, generator=g, dtype=torch.float64) * shift
    return torch.log_softmax(new, -1), torch.log_softmax(old, -1)


def _inputs(logits, old_index, old_logp, responses, mask=None, adv=None, with_responses=True):
    batch, length = responses.shape
    if adv is None:
        adv = torch.linspace(-1.0, 1.5, batch, dtype=torch.float64).unsqueeze(-1).expand(batch, length)
    return PolicyInputs(
        logp=torch.zeros(batch, length),
        old_logp=torch.zeros(batch, length),
        advantages=adv,
        response_mask=torch.ones(batch, length) if mask is None else mask,
        logits=logits,
        old_topk_index=old_index,
        old_topk_logp=old_logp,
        responses=responses if with_responses else None,
    )


def _sparse_batch(batch=2, length=4, vocab=24, k=6, delta=1e-3, seed=0, shift=1.5):
    g = torch.Generator().manual_seed(seed)
    old_logits = torch.randn(batch, length, vocab, generator=g) * 3
    new_logits = (old_logits + torch.randn(batch, length, vocab, generator=g) * shift).double()
    # a local generator: the global one's state depends on which tests ran before
    probs = torch.softmax(old_logits, -1).reshape(-1, vocab)
    responses = torch.multinomial(probs, 1, generator=g).reshape(batch, length)
    index, logp = sparsify(old_logits, responses, k=k, delta=delta)
    return old_logits, new_logits, responses, index, logp


# -- projection ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_gradcheck_dense_projection_inside_and_outside():
    """Implicit gradient (appendix A.3) vs finite differences; rows 0-2 outside, 3-4 inside."""
    lq_out, lo_out = _pair(3, 7, seed=1, shift=3.0)
    lo_in = lo_out[:2]
    noise = torch.randn(2, 7, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    lq_in = torch.log_softmax(lo_in + 0.05 * noise, -1)
    lq = torch.cat([lq_out, lq_in]).requires_grad_()
    lo = torch.cat([lo_out, lo_in])
    _, info = project_with_info(lq, lo, EPS)
    assert info.projected.tolist() == [True, True, True, False, False]
    assert torch.autograd.gradcheck(lambda x: project(x, lo, EPS, **PRECISE), (lq,))


def test_projection_matches_slsqp():
    """Projection = argmin KL(p || q_new) s.t. KL(p || q_old) <= eps, solved by scipy SLSQP."""
    lq, lo = _pair(6, 5, seed=2, shift=3.0)
    lp, info = project_with_info(lq, lo, EPS)
    assert info.projected.all()
    for row in range(lq.shape[0]):
        qn, qo = lq[row].exp().numpy(), lo[row].exp().numpy()

        def kl(p, q):
            return float(np.sum(p * np.log(p / q)))

        res = minimize(
            lambda p, qn=qn: kl(p, qn),
            qo.copy(),
            jac=lambda p, qn=qn: np.log(p / qn) + 1,
            method="SLSQP",
            bounds=[(1e-12, 1)] * len(qn),
            constraints=[
                {"type": "eq", "fun": lambda p: p.sum() - 1, "jac": lambda p: np.ones_like(p)},
                {
                    "type": "ineq",
                    "fun": lambda p, qo=qo: EPS - kl(p, qo),
                    "jac": lambda p, qo=qo: -(np.log(p / qo) + 1),
                },
            ],
            options={"ftol": 1e-14, "maxiter": 1000},
        )
        assert res.success, res.message
        np.testing.assert_allclose(lp[row].exp().numpy(), res.x, atol=2e-5)
        assert abs(kl(lp[row].exp().numpy(), qn) - res.fun) < 1e-6  # SLSQP ends within ~1e-7 of feasibility


def test_eta_matches_brentq_root():
    """eta* of the bracketing solver vs the root of KL(q_eta || q_old) = eps found by brentq."""
    lq, lo = _pair(5, 9, seed=3)
    sol = solve_dual(lq, lo, EPS)
    assert sol.converged.all()
    for row in range(lq.shape[0]):

        def gap(eta, row=row):
            lp = torch.log_softmax((eta * lo[row] + lq[row]) / (eta + 1), -1)
            return float(categorical_kl(lp, lo[row])) - EPS

        root = brentq(gap, 1e-9, 1e3, xtol=1e-14)
        assert math.isclose(float(sol.eta[row]), root, rel_tol=2e-5)


def test_solver_steps_follow_bracket_shrinkage():
    """Each step keeps 2 of num_points + 1 sub-intervals: steps = first n with w0 (2/9)^n < tol."""
    lq, lo = _pair(4, 6, seed=4)
    width = math.log(1e2) - math.log(1e-7)
    expected = next(n for n in range(1, 50) if width * (2 / 9) ** n < 1e-5)
    assert solve_dual(lq, lo, EPS).steps == expected == 10
    assert solve_dual(lq, lo, EPS, tol=1e-12, max_steps=20).steps == 20


def test_unreachable_region_is_flagged_not_converged():
    """With eps so small that eta* > eta_max the bracket sticks to eta_max: flagged, KL stays > eps."""
    lq, lo = _pair(2, 6, seed=5)
    lp, info = project_with_info(lq, lo, 1e-9, eta_max=10.0)
    assert info.projected.all() and not info.converged.any()
    assert (categorical_kl(lp, lo) > 1e-9).all()


def test_inside_untouched_and_projected_on_boundary():
    """KL <= eps: returned bit-identical; KL > eps: ends on the boundary (float32 and float64)."""
    lq, lo = _pair(64, 50, seed=6, shift=0.4)
    for dtype in (torch.float64, torch.float32):
        lp, info = project_with_info(lq.to(dtype), lo.to(dtype), EPS)
        inside = ~info.projected
        assert inside.any() and info.projected.any()
        assert torch.equal(lp[inside], lq.to(dtype)[inside])
        kl_after = categorical_kl(lp[info.projected].double(), lo[info.projected])
        tol = 1e-7 if dtype == torch.float64 else 2e-5
        assert (kl_after - EPS).abs().max() < tol


def test_infeasible_disjoint_support_falls_back_to_old():
    """No p has finite KL to both: the old distribution is returned, flagged not converged, no NaN."""
    inf = -math.inf
    lq = torch.tensor([[0.0, inf, inf]], dtype=torch.float64, requires_grad=True)
    lo = torch.tensor([[inf, math.log(0.5), math.log(0.5)]], dtype=torch.float64)
    lp, info = project_with_info(lq, lo, EPS)
    assert torch.equal(lp.detach(), lo) and not info.converged.any()
    lp.exp().sum().backward()
    assert not torch.isnan(lq.grad).any()


# -- sparsification --------------------------------------------------------------------------------


def test_sparsify_hand_computed():
    """Cut after the mass reaches 1 - delta, cap at K, sampled token last, gamma of eq. 21."""
    probs = torch.tensor([0.5, 0.3, 0.15, 0.04, 0.01] + [0.0] * 5, dtype=torch.float64)
    logits = torch.log(probs.clamp(min=1e-30)).unsqueeze(0).repeat(3, 1)
    sampled = torch.tensor([1, 4, 3])
    p_d = 1e-6
    index, logp, mass = sparsify(logits, sampled, k=4, delta=0.06, p_default=p_d, return_mass=True)
    assert index.dtype == torch.int32 and logp.dtype == torch.float32 and index.shape == (3, 5)
    kept = [sorted(index[r][logp[r] > -math.inf].tolist()) for r in range(3)]
    assert kept == [[0, 1, 2], [0, 1, 2, 4], [0, 1, 2, 3]]  # cumsum 0.5, 0.8, 0.95 >= 0.94 -> 3 kept
    assert index[:, -1].tolist() == [1, 4, 3]  # sampled token in the last slot
    assert logp[0, 1] == -math.inf  # token 1 moved from the top slots to the last slot
    for r, s in enumerate([[0, 1, 2], [0, 1, 2, 4], [0, 1, 2, 3]]):
        true_mass = float(probs[s].sum())
        assert math.isclose(float(mass[r]), true_mass, rel_tol=1e-6)
        gamma = (1 - (10 - len(s)) * p_d) / true_mass
        expected = {i: math.log(float(probs[i]) * gamma) for i in s}
        got = {int(i): float(v) for i, v in zip(index[r], logp[r]) if v > -math.inf}
        assert got.keys() == expected.keys()
        assert all(math.isclose(got[i], expected[i], abs_tol=1e-6) for i in s)
    index_k2, logp_k2 = sparsify(logits, sampled, k=2, delta=0.06, p_default=p_d)
    assert (logp_k2[:, :2] > -math.inf).sum(-1).tolist() == [1, 2, 2]  # K caps the top part


def test_sparsify_chunks_and_leading_shape():
    logits = torch.randn(3, 5, 40) * 4
    sampled = torch.randint(0, 40, (3, 5))
    a = sparsify(logits, sampled, k=8, delta=1e-4, chunk_size=1)
    b = sparsify(logits.reshape(15, 40), sampled.reshape(15), k=8, delta=1e-4, chunk_size=1024)
    assert a[0].shape == (3, 5, 9)
    assert torch.equal(a[0].reshape(15, 9), b[0]) and torch.equal(a[1].reshape(15, 9), b[1])


def test_chunked_logsumexp_matches_torch():
    """Blocked logsumexp (with and without the max shift, rows subset, -inf entries) == torch.logsumexp."""
    g = torch.Generator().manual_seed(16)
    x = torch.randn(37, 5000, generator=g) * 5
    x[3] += 200.0  # overflows without the max shift
    x[7] -= 200.0  # underflows without the max shift
    x[5, :4000] = -math.inf
    rows = torch.tensor([0, 3, 5, 36])
    torch.testing.assert_close(chunked_logsumexp(x, chunk_size=4), torch.logsumexp(x.double(), -1).float())
    torch.testing.assert_close(
        chunked_logsumexp(x, rows, chunk_size=1024), torch.logsumexp(x[rows].double(), -1).float()
    )
    bf16 = x.bfloat16()
    torch.testing.assert_close(chunked_logsumexp(bf16), torch.logsumexp(bf16.double(), -1).float())


def test_sparsify_bf16_logits():
    """bf16 logits: same kept ids as the fp32 upcast of the same values, log-probs to fp32 accuracy."""
    g = torch.Generator().manual_seed(17)
    logits = (torch.randn(6, 300, generator=g) * 4).bfloat16()
    sampled = torch.randint(0, 300, (6,), generator=g)
    a = sparsify(logits, sampled, k=16, delta=1e-3)
    b = sparsify(logits.float(), sampled, k=16, delta=1e-3)
    assert torch.equal(a[0], b[0])
    torch.testing.assert_close(a[1], b[1])


def test_sparsify_rejects_bad_arguments():
    with pytest.raises(ValueError, match="sampled token ids"):
        sparsify(torch.randn(2, 10), torch.tensor([0, 10]), k=3)
    with pytest.raises(ValueError, match="p_default"):
        sparsify(torch.randn(2, 10), torch.tensor([0, 1]), k=3, p_default=0.2)
    with pytest.raises(ValueError, match="k must be"):
        sparsify(torch.randn(2, 10), torch.tensor([0, 1]), k=11)


def test_tail_atom_equals_projection_of_explicit_sparse_distributions():
    """Reduced (K+2)-dim projection == dense projection of the V-dim sparse pair (Definition A.1)."""
    vocab, p_d = 30, 1e-4
    old_logits, new_logits, responses, index, logp = _sparse_batch(1, 6, vocab, k=5, delta=1e-2, seed=7, shift=2.0)
    index, logp = index.reshape(-1, 6).long(), logp.reshape(-1, 6).double()
    new_flat = new_logits.reshape(-1, vocab)
    logq, logo, kept = reduce_on_kept_set(new_flat.gather(-1, index), logp, vocab, p_default=p_d)
    lp_reduced = project(logq, logo, EPS)
    for r in range(index.shape[0]):
        valid = logp[r] > -math.inf
        ids = index[r][valid]
        full_old = torch.full((vocab,), p_d, dtype=torch.float64)
        full_new = torch.full((vocab,), p_d, dtype=torch.float64)
        full_old[ids] = logp[r][valid].exp() / logp[r][valid].exp().sum() * (1 - (vocab - len(ids)) * p_d)
        pn = new_flat[r, ids].softmax(-1)
        full_new[ids] = pn * (1 - (vocab - len(ids)) * p_d)
        assert math.isclose(float(full_old.sum()), 1.0, abs_tol=1e-12)
        lp_full = project(full_new.log().unsqueeze(0), full_old.log().unsqueeze(0), EPS)[0]
        torch.testing.assert_close(lp_full[ids], lp_reduced[r][:-1][valid], rtol=0, atol=1e-9)
        tail = torch.ones(vocab, dtype=torch.bool)
        tail[ids] = False
        torch.testing.assert_close(lp_full[tail].exp().sum(), lp_reduced[r][-1].exp(), rtol=1e-9, atol=0)
        assert int(kept[r]) == len(ids)


# -- paper numbers -----------------------------------------------------------------------------------


def test_theorem_a2_numbers():
    """TROLL (arXiv 2510.03817) appendix A.4, Theorem A.2: 0.99999015168, 0.00075823623, 0.050757743814."""
    b = theorem_a2_bound(V=151936, K=256, delta=1e-5, p_d=1e-12, q_min=1.17549e-38, eps=0.05)
    assert math.isclose(b.factor, 0.99999015168, rel_tol=1e-11)
    assert math.isclose(b.additive, 0.00075823623, rel_tol=1e-9)
    assert math.isclose(b.bound, 0.050757743814, rel_tol=1e-10)


def test_theorem_a2_inequality_on_random_distributions():
    """KL(p||q) <= factor KL(p'||q') + delta log(delta / q_min) for shared top-k sets of mass 1 - delta."""
    g = torch.Generator().manual_seed(8)
    vocab, k, delta, p_d = 200, 8, 1e-2, 1e-8
    for _ in range(20):
        top_p = torch.rand(k, generator=g, dtype=torch.float64) + 1
        top_q = torch.rand(k, generator=g, dtype=torch.float64) + 1
        rest_p = torch.rand(vocab - k, generator=g, dtype=torch.float64)
        rest_q = torch.rand(vocab - k, generator=g, dtype=torch.float64) + 1e-3
        p = torch.cat([top_p / top_p.sum() * (1 - delta), rest_p / rest_p.sum() * delta])
        q = torch.cat([top_q / top_q.sum() * (1 - delta), rest_q / rest_q.sum() * delta])
        gamma = (1 - (vocab - k) * p_d) / (1 - delta)
        sp = torch.cat([gamma * p[:k], torch.full((vocab - k,), p_d, dtype=torch.float64)])
        sq = torch.cat([gamma * q[:k], torch.full((vocab - k,), p_d, dtype=torch.float64)])
        bound = theorem_a2_bound(vocab, k, delta, p_d, float(q.min()), 0.0)
        kl_true = float((p * (p / q).log()).sum())
        kl_sparse = float((sp * (sp / sq).log()).sum())
        assert kl_true <= bound.factor * kl_sparse + bound.additive


def test_eq23_storage_figures():
    """Dense fp32: 256 x 8 x 151936 x 4 B = 1.16 GiB per prompt, ~296 GiB for 256 prompts; sparse < 1 MiB."""
    dense = dense_storage_bytes(256, 8, 151936)
    assert round(dense / 2**30, 2) == 1.16
    assert 296 <= 256 * dense / 2**30 < 297
    assert sparse_storage_bytes(256, 8, 10) < 2**20  # 5-10 kept per token, packed
    assert sparse_storage_bytes(256, 8, 65) / dense <= 1 / 1000  # padded [K+1] layout of sparsify


# -- objective ---------------------------------------------------------------------------------------


def test_registered_as_objective():
    assert OBJECTIVES.get("troll") is troll_objective


@pytest.mark.slow
@pytest.mark.parametrize("with_responses", [True, False])
def test_gradcheck_sparse_objective(with_responses):
    """Ratio path of eq. 5 through sparsify's layout (alpha=0: the regression term's stop-gradient
    makes its analytic gradient differ from finite differences by design)."""
    _, new_logits, responses, index, logp = _sparse_batch(seed=9, shift=0.5)
    inp = _inputs(new_logits, index, logp, responses, with_responses=with_responses)
    out = troll_objective(inp)
    assert 0 < out.metrics[metric_names.TROLL_PROJECTED_FRAC] < 1

    def loss(x):
        inp.logits = x
        return troll_objective(inp, alpha=0.0, **PRECISE).loss_mat

    assert torch.autograd.gradcheck(loss, (new_logits.clone().requires_grad_(),))


@pytest.mark.slow
def test_gradcheck_dense_objective_and_gspo_form():
    """Dense mode (old_topk_index=None) and sequence=True; GSPO's stop-gradient token form has the
    gradient of the sequence objective, so the check is on per-sequence sums (constant A per sequence)."""
    old_logits, new_logits, responses, _, _ = _sparse_batch(length=2, vocab=10, seed=10)
    dense = _inputs(new_logits, None, torch.log_softmax(old_logits, -1), responses)
    assert 0 < troll_objective(dense).metrics[metric_names.TROLL_PROJECTED_FRAC] < 1

    def loss(x):
        dense.logits = x
        return troll_objective(dense, alpha=0.0, **PRECISE).loss_mat

    assert torch.autograd.gradcheck(loss, (new_logits.clone().requires_grad_(),))
    _, _, _, index, logp = _sparse_batch(length=2, vocab=10, seed=10)
    sparse = _inputs(new_logits, index, logp, responses)

    def seq_loss(x):
        sparse.logits = x
        return troll_objective(sparse, alpha=0.0, sequence=True, **PRECISE).loss_mat.sum(-1)

    assert torch.autograd.gradcheck(seq_loss, (new_logits.clone().requires_grad_(),))


def test_regression_term_gradient_is_kl_to_a_constant_target():
    """alpha term's gradient = grad of KL(q_new || C) with C the projection held fixed (dense mode)."""
    old_logits, new_logits, responses, _, _ = _sparse_batch(seed=11)
    old = torch.log_softmax(old_logits.double(), -1)
    x1 = new_logits.clone().requires_grad_()
    x0 = new_logits.clone().requires_grad_()
    troll_objective(_inputs(x1, None, old, responses), alpha=1.0).loss_mat.sum().backward()
    troll_objective(_inputs(x0, None, old, responses), alpha=0.0).loss_mat.sum().backward()
    x = new_logits.clone().requires_grad_()
    lq = torch.log_softmax(x, -1)
    target = project(lq.detach(), old, EPS)
    categorical_kl(lq, target).sum().backward()
    torch.testing.assert_close(x1.grad - x0.grad, x.grad, rtol=1e-6, atol=1e-9)


def test_on_policy_loss_is_minus_advantage():
    """Old == new: nothing projected, r_proj = 1, loss = -A on response tokens, 0 elsewhere."""
    g = torch.Generator().manual_seed(12)
    logits = torch.randn(3, 5, 20, generator=g)
    responses = torch.randint(0, 20, (3, 5), generator=g)
    index, logp = sparsify(logits, responses, k=6)
    mask = torch.ones(3, 5)
    mask[2, 2:] = 0
    adv = torch.randn(3, 5, generator=g)
    for inp in (
        _inputs(logits, index, logp, responses, mask, adv),
        _inputs(logits, None, torch.log_softmax(logits, -1), responses, mask, adv),
    ):
        out = troll_objective(inp)
        torch.testing.assert_close(out.loss_mat, torch.where(mask.bool(), -adv, 0.0), rtol=1e-5, atol=1e-6)
        assert out.metrics[metric_names.TROLL_PROJECTED_FRAC] == 0.0
        assert out.metrics[metric_names.TROLL_DUAL_STEPS] == 0.0
        assert abs(out.metrics[metric_names.TROLL_KL_BEFORE]) < 1e-6


def test_sparse_with_every_token_kept_equals_dense_mode():
    """K = V and delta = 0 keep the whole vocabulary: the sparse path reduces to the dense projection."""
    old_logits, new_logits, responses, _, _ = _sparse_batch(seed=13)
    index, logp = sparsify(old_logits, responses, k=old_logits.shape[-1], delta=0.0)
    sparse = troll_objective(_inputs(new_logits, index, logp, responses))
    dense = troll_objective(_inputs(new_logits, None, torch.log_softmax(old_logits.double(), -1), responses))
    torch.testing.assert_close(sparse.loss_mat, dense.loss_mat, rtol=1e-5, atol=1e-6)
    for name in (metric_names.TROLL_PROJECTED_FRAC, metric_names.TROLL_KL_BEFORE, metric_names.TROLL_KL_AFTER):
        assert math.isclose(sparse.metrics[name], dense.metrics[name], rel_tol=1e-5, abs_tol=1e-7)


def test_gspo_form_values_and_metrics():
    """sequence=True: every token's ratio is the geometric mean of the sequence's r_proj."""
    _, new_logits, responses, index, logp = _sparse_batch(seed=14)
    mask = torch.ones(2, 4)
    mask[1, 3] = 0
    adv = torch.ones(2, 4, dtype=torch.float64)
    tok = troll_objective(_inputs(new_logits, index, logp, responses, mask, adv), alpha=0.0)
    seq = troll_objective(_inputs(new_logits, index, logp, responses, mask, adv), alpha=0.0, sequence=True)
    log_r = torch.log(-tok.loss_mat.clamp(max=-1e-300))  # loss = -r with A = 1
    geo = torch.exp((log_r * mask).sum(-1) / mask.sum(-1))
    torch.testing.assert_close(seq.loss_mat, torch.where(mask.bool(), -geo.unsqueeze(-1), 0.0).double())
    assert set(tok.metrics) == {
        metric_names.TROLL_PROJECTED_FRAC,
        metric_names.TROLL_KEPT_TOKENS,
        metric_names.TROLL_KEPT_MASS,
        metric_names.TROLL_KL_BEFORE,
        metric_names.TROLL_KL_AFTER,
        metric_names.TROLL_DUAL_STEPS,
    }
    kept = (logp > -math.inf).sum(-1).double()
    assert math.isclose(tok.metrics[metric_names.TROLL_KEPT_TOKENS], float(kept[mask.bool()].mean()), rel_tol=1e-9)
    assert 0 < tok.metrics[metric_names.TROLL_KEPT_MASS] <= 1


def test_objective_errors_name_the_field():
    _, new_logits, responses, index, logp = _sparse_batch(seed=15)
    with pytest.raises(ValueError, match="logits"):
        troll_objective(_inputs(None, index, logp, responses))
    with pytest.raises(ValueError, match="old_topk_logp"):
        troll_objective(_inputs(new_logits, index, None, responses))
    with pytest.raises(ValueError, match="responses"):
        troll_objective(_inputs(new_logits, None, torch.log_softmax(new_logits, -1), responses, with_responses=False))
    wrong = (responses + 1) % new_logits.shape[-1]
    with pytest.raises(ValueError, match="missing from old_topk_index"):
        troll_objective(_inputs(new_logits, index, logp, wrong))
    with pytest.raises(ValueError, match="eps"):
        troll_objective(_inputs(new_logits, index, logp, responses), eps=0.0)


# -- properties ----------------------------------------------------------------------------------------

_kind = st.sampled_from(["random", "one_hot", "uniform", "masked"])


def _logits(kind: str, rows: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, vocab, generator=g, dtype=torch.float64) * 4
    if kind == "one_hot":
        x = torch.full((rows, vocab), -math.inf, dtype=torch.float64)
        x[torch.arange(rows), torch.randint(0, vocab, (rows,), generator=g)] = 0.0
    elif kind == "uniform":
        x = torch.zeros(rows, vocab, dtype=torch.float64)
    elif kind == "masked":  # -inf logits on a random subset, at least one finite entry per row
        drop = torch.rand(rows, vocab, generator=g) < 0.5
        drop[:, 0] = False
        x = x.masked_fill(drop, -math.inf)
    return x


@settings(max_examples=40, deadline=None)
@given(
    new_kind=_kind,
    old_kind=_kind,
    vocab=st.integers(2, 12),
    eps=st.sampled_from([1e-6, 1e-3, 0.05, 1.0]),
    seed=st.integers(0, 2**16),
)
def test_property_projection_no_nan_and_constraint(new_kind, old_kind, vocab, eps, seed):
    lq = torch.log_softmax(_logits(new_kind, 4, vocab, seed), -1).requires_grad_()
    lo = torch.log_softmax(_logits(old_kind, 4, vocab, seed + 1), -1)
    lp, info = project_with_info(lq, lo, eps)
    assert not torch.isnan(lp).any()
    (lp.exp() * torch.arange(vocab, dtype=torch.float64)).sum().backward()
    assert not torch.isnan(lq.grad).any()
    ok = info.converged
    assert (categorical_kl(lp.detach()[ok], lo[ok]) <= eps * (1 + 1e-4)).all()  # log-eta tolerance 1e-5
    assert torch.allclose(lp.detach().exp().sum(-1), torch.ones(4, dtype=torch.float64))


@settings(max_examples=25, deadline=None)
@given(
    new_kind=_kind,
    old_kind=st.sampled_from(["random", "one_hot", "uniform", "masked"]),
    length=st.integers(1, 3),
    eps=st.sampled_from([1e-6, 0.05]),
    sequence=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_property_objective_no_nan(new_kind, old_kind, length, eps, sequence, seed):
    vocab = 16
    old_logits = _logits(old_kind, 2 * length, vocab, seed).reshape(2, length, vocab)
    new_logits = _logits(new_kind, 2 * length, vocab, seed + 1).reshape(2, length, vocab).requires_grad_()
    responses = torch.distributions.Categorical(logits=old_logits).sample()
    index, logp = sparsify(old_logits, responses, k=4, delta=1e-3)
    out = troll_objective(_inputs(new_logits, index, logp, responses), eps=eps, sequence=sequence)
    assert torch.isfinite(out.loss_mat).all()
    out.loss_mat.sum().backward()
    assert not torch.isnan(new_logits.grad).any()
    assert all(math.isfinite(v) for v in out.metrics.values())


@pytest.mark.parametrize("sparse", [True, False], ids=["sparse", "dense"])
def test_micro_batch_without_response_tokens_gives_zero_loss_gradient_and_metrics(sparse):
    """A micro-batch whose response mask is all zero (a padded shard): loss and gradient exactly 0 and
    every troll/* metric 0.0, not the NaN of a mean over no tokens."""
    old_logits, new_logits, responses, index, logp = _sparse_batch(seed=5)
    logits = new_logits.clone().requires_grad_(True)
    mask = torch.zeros(responses.shape)
    if sparse:
        inp = _inputs(logits, index, logp, responses, mask=mask)
    else:
        inp = _inputs(logits, None, torch.log_softmax(old_logits.double(), -1), responses, mask=mask)
    out = troll_objective(inp, eps=EPS)
    assert not out.loss_mat.any()
    out.loss_mat.sum().backward()
    assert not logits.grad.any()
    for key in (
        metric_names.TROLL_PROJECTED_FRAC,
        metric_names.TROLL_KEPT_TOKENS,
        metric_names.TROLL_KL_BEFORE,
        metric_names.TROLL_KL_AFTER,
        metric_names.TROLL_KEPT_MASS,
    ):
        assert out.metrics[key] == 0.0, key


# -- paths and checks the tests above leave out ------------------------------------------------------


def _full_layout(batch=2, length=3, vocab=16, k=4, seed=21):
    """A sparse layout with every slot kept ([B,T,K+1], distinct ids, old log-probs at those ids), the
    sampled token in the last slot as ``sparsify`` puts it; returns (new logits, index, logp, responses)."""
    g = torch.Generator().manual_seed(seed)
    old = torch.log_softmax(torch.randn(batch, length, vocab, generator=g, dtype=torch.float64) * 2, -1)
    ids = torch.stack([torch.randperm(vocab, generator=g)[: k + 1] for _ in range(batch * length)])
    index = ids.reshape(batch, length, k + 1)
    new = old + torch.randn(batch, length, vocab, generator=g, dtype=torch.float64)
    return new, index, old.gather(-1, index), index[..., -1].clone()


def _seeded_batch(**kwargs):
    """``_sparse_batch`` with the sampled tokens drawn under a fixed global seed (Categorical.sample
    reads torch's global generator, whose state depends on the tests run before)."""
    with torch.random.fork_rng():
        torch.manual_seed(kwargs.get("seed", 0))
        return _sparse_batch(**kwargs)


def _sample(logits, g):
    """Token ids [...] drawn from softmax(logits [..., V]) with the generator g."""
    probs = torch.softmax(logits.double(), -1).reshape(-1, logits.shape[-1])
    return torch.multinomial(probs, 1, generator=g).reshape(logits.shape[:-1])


def test_sparse_without_responses_reads_the_sampled_token_from_the_last_slot():
    """responses=None (sparsify's layout, sampled token in slot K): the same loss and gradient as with
    the sampled ids given, and the loss of the eq. 5 / eq. 21 reference (TROLL, arXiv 2510.03817) of
    test_ref_troll.py on the explicit V-dimensional sparse pair."""
    _, new_logits, responses, index, logp = _seeded_batch(k=5, seed=9, shift=1.0)
    mask = torch.ones(responses.shape)
    mask[1, 3] = 0
    adv = torch.tensor([[-1.0, 0.5, 2.0, -0.3], [1.5, -2.0, 0.7, 1.0]], dtype=torch.float64)
    rows = int(mask.sum())
    assert rows != index.shape[-1]  # slot R - 1 and slot K differ
    assert (logp[mask.bool()] == -math.inf).any()  # some rows cut before K: empty slots in the middle
    grads, outs = [], []
    for with_responses in (True, False):
        x = new_logits.clone().requires_grad_()
        inp = _inputs(x, index, logp, responses, mask, adv, with_responses=with_responses)
        out = troll_objective(inp, eps=EPS, alpha=0.7, **PRECISE)
        out.loss_mat.sum().backward()
        outs.append(out)
        grads.append(x.grad)
    assert 0 < outs[1].metrics[metric_names.TROLL_PROJECTED_FRAC] < 1
    assert torch.equal(outs[1].loss_mat, outs[0].loss_mat)
    assert torch.equal(grads[1], grads[0])
    assert outs[1].metrics == outs[0].metrics
    kept = [
        [
            (index[b, t][logp[b, t] > -math.inf].numpy(), logp[b, t][logp[b, t] > -math.inf].double().numpy())
            for t in range(index.shape[1])
        ]
        for b in range(index.shape[0])
    ]
    ref, projected = ref_loss(
        new_logits.numpy(), None, responses.numpy(), adv.numpy(), mask.numpy(),
        eps=EPS, alpha=0.7, sequence=False, kept=kept,
    )  # fmt: skip
    assert projected[mask.numpy() > 0].any() and not projected[mask.numpy() > 0].all()
    np.testing.assert_allclose(outs[1].loss_mat.detach().numpy(), ref, rtol=1e-8, atol=1e-9)


def test_objective_input_errors_name_the_offending_field():
    """Each invalid input raises ValueError naming the field (and the check is not left to a later
    IndexError or NaN)."""
    new, index, logp, responses = _full_layout()
    batch, length, vocab = new.shape
    ok = troll_objective(_inputs(new, index, logp, responses, with_responses=False))
    assert torch.isfinite(ok.loss_mat).all()  # the full layout itself is valid without responses
    with pytest.raises(ValueError, match="PolicyInputs.logits"):
        troll_objective(_inputs(None, index, logp, responses))
    with pytest.raises(ValueError, match="PolicyInputs.old_topk_logp"):
        troll_objective(_inputs(new, index, None, responses))
    with pytest.raises(ValueError, match="PolicyInputs.responses"):  # dense mode needs the sampled ids
        troll_objective(_inputs(new, None, torch.log_softmax(new, -1), responses, with_responses=False))
    with pytest.raises(ValueError, match="PolicyInputs.responses"):  # a sampled id outside the kept set
        troll_objective(_inputs(new, index, logp, (responses + 1) % vocab))
    with pytest.raises(ValueError, match="logits .*response_mask"):  # [B,T,V] logits, a [B,T+1] mask
        troll_objective(_inputs(new, index, logp, responses, mask=torch.ones(batch, length + 1)))
    for bad_id in (vocab, -1):  # one kept id out of [0, V)
        bad = index.clone()
        bad[0, 0, 0] = bad_id
        with pytest.raises(ValueError, match=rf"old_topk_index values must be in \[0, V={vocab}\)"):
            troll_objective(_inputs(new, bad, logp, responses))
    empty = logp.clone()
    empty[1, 2] = -math.inf  # one response position without any kept entry, the others full
    for with_responses in (True, False):
        with pytest.raises(ValueError, match="old_topk_logp"):
            troll_objective(_inputs(new, index, empty, responses, with_responses=with_responses))
    no_last = logp.clone()
    no_last[0, 1, -1] = -math.inf  # sampled slot empty at one position, every other slot kept everywhere
    with pytest.raises(ValueError, match="PolicyInputs.responses"):
        troll_objective(_inputs(new, index, no_last, responses, with_responses=False))
    on_policy = _inputs(new, None, new.clone(), responses)  # KL = 0: nothing to project, no solver call
    assert troll_objective(on_policy, eps=EPS).metrics[metric_names.TROLL_KL_BEFORE] == 0.0
    for eps in (0.0, -0.1):
        with pytest.raises(ValueError, match="eps"):
            troll_objective(on_policy, eps=eps)
    with pytest.raises(ValueError, match="alpha"):
        troll_objective(on_policy, alpha=-0.5)


def test_kept_mass_metric_is_the_current_mass_on_the_old_kept_set():
    """troll/kept_mass: mean over response tokens of sum_{x in S} q_new(x) (sparse, S = the old kept
    set, each id once), computed here in float64 from the logits; dense mode keeps all V: exactly 1."""
    g = torch.Generator().manual_seed(22)
    batch, length, vocab = 2, 4, 30
    old_logits = torch.randn(batch, length, vocab, generator=g, dtype=torch.float64) * 3
    old_logits[..., 0] = -8.0  # token 0 (the id of unused slots) is outside the old kept sets ...
    new_logits = old_logits + torch.randn(batch, length, vocab, generator=g, dtype=torch.float64)
    new_logits[..., 0] = 4.0  # ... and holds much of the current mass
    responses = _sample(old_logits, g)
    index, logp = sparsify(old_logits, responses, k=6, delta=1e-2)
    mask = torch.ones(batch, length)
    mask[0, 3] = 0
    q_new = torch.softmax(new_logits, -1)
    masses = []
    for b in range(batch):
        for t in range(length):
            if mask[b, t]:
                ids = sorted({int(i) for i, v in zip(index[b, t], logp[b, t]) if v > -math.inf})
                assert 0 not in ids
                masses.append(float(q_new[b, t, ids].sum()))
    expected = sum(masses) / len(masses)
    assert (logp[mask.bool()] == -math.inf).any()  # unused slots (id 0) at response positions
    assert expected < 0.9  # far from the dense value 1
    out = troll_objective(_inputs(new_logits, index, logp, responses, mask=mask))
    assert math.isclose(out.metrics[metric_names.TROLL_KEPT_MASS], expected, rel_tol=1e-5)
    dense = troll_objective(_inputs(new_logits, None, torch.log_softmax(old_logits, -1), responses, mask=mask))
    assert dense.metrics[metric_names.TROLL_KEPT_MASS] == 1.0
    assert (
        metric_names.TROLL_KEPT_MASS
        not in troll_objective(_inputs(new_logits, index, logp, responses, mask=mask), log_kept_mass=False).metrics
    )


def test_log_ratio_is_clamped_at_20_as_verl_does():
    """An unprojected token with q_new(y)/q_old(y) = e^24 (KL(q_new || q_old) = 0.023 < eps): the ratio is
    exp(20), the loss -A e^20, and the clamped token passes no gradient; the next token is on-policy."""
    old_row = torch.tensor([0.0, 0.0, 0.0, -30.0], dtype=torch.float64)
    new_row = torch.tensor([0.0, 0.0, 0.0, math.log(3e-3)], dtype=torch.float64)
    logits = torch.stack([new_row, new_row]).unsqueeze(0).requires_grad_()
    old = torch.log_softmax(torch.stack([old_row, new_row]).unsqueeze(0), -1)
    responses = torch.tensor([[3, 1]])
    adv = torch.tensor([[0.5, -2.0]], dtype=torch.float64)
    log_r = float(torch.log_softmax(new_row, -1)[3] - old[0, 0, 3])
    assert log_r > 24
    out = troll_objective(_inputs(logits, None, old, responses, adv=adv))
    assert out.metrics[metric_names.TROLL_PROJECTED_FRAC] == 0.0
    torch.testing.assert_close(
        out.loss_mat, torch.tensor([[-0.5 * math.exp(20.0), 2.0]], dtype=torch.float64), rtol=1e-12, atol=1e-12
    )
    out.loss_mat[0, 0].backward()
    assert not logits.grad.any()


def test_float32_logits_give_a_float32_loss_equal_to_float64_to_its_precision():
    """float32 logits (the training dtype) with float64 advantages, projection active: the loss is
    float32 in both modes and matches the float64 run of the same values."""
    old_logits, new_logits, responses, index, logp = _seeded_batch(seed=9, shift=1.0)
    adv = torch.linspace(-1.0, 2.0, 8, dtype=torch.float64).reshape(2, 4)
    x32 = new_logits.float()
    for old_index, old_logp in ((index, logp), (None, torch.log_softmax(old_logits.double(), -1))):
        outs, grads = [], []
        for x in (x32, x32.double()):
            x = x.clone().requires_grad_()
            out = troll_objective(_inputs(x, old_index, old_logp, responses, adv=adv))
            out.loss_mat.sum().backward()
            outs.append(out)
            grads.append(x.grad)
        assert 0 < outs[0].metrics[metric_names.TROLL_PROJECTED_FRAC] < 1
        assert outs[0].loss_mat.dtype == torch.float32 and grads[0].dtype == torch.float32
        assert outs[1].loss_mat.dtype == torch.float64
        torch.testing.assert_close(outs[0].loss_mat.double(), outs[1].loss_mat, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grads[0].double(), grads[1], rtol=1e-4, atol=1e-5)


def test_dense_mode_upcasts_bf16_logits_and_old_log_probs():
    """bf16 logits or bf16 old log-probs in dense mode: exactly the result of their float32 upcast
    (the normalisation runs in float32, not in bf16)."""
    old_logits, new_logits, responses, _, _ = _seeded_batch(seed=13, shift=0.5)
    new16 = new_logits.bfloat16()
    old16 = torch.log_softmax(old_logits.double(), -1).bfloat16()
    upcast = troll_objective(_inputs(new16.float(), None, old16.float(), responses))
    assert 0 < upcast.metrics[metric_names.TROLL_PROJECTED_FRAC] < 1
    for logits, old in ((new16, old16.float()), (new16.float(), old16), (new16, old16)):
        out = troll_objective(_inputs(logits, None, old, responses))
        assert out.loss_mat.dtype == torch.float32
        assert torch.equal(out.loss_mat, upcast.loss_mat)
        assert out.metrics == upcast.metrics


def test_gspo_sequence_with_one_response_token_keeps_its_own_ratio():
    """sequence=True: a response of a single token has the geometric mean of one ratio, its own."""
    _, new_logits, responses, index, logp = _seeded_batch(seed=14)
    mask = torch.ones(2, 4)
    mask[1, 1:] = 0
    adv = torch.ones(2, 4, dtype=torch.float64)
    tok = troll_objective(_inputs(new_logits, index, logp, responses, mask, adv), alpha=0.0)
    seq = troll_objective(_inputs(new_logits, index, logp, responses, mask, adv), alpha=0.0, sequence=True)
    assert abs(float(tok.loss_mat[1, 0]) + 1) > 1e-2  # the ratio is not 1
    torch.testing.assert_close(seq.loss_mat[1], tok.loss_mat[1], rtol=1e-12, atol=0.0)


def test_gspo_mean_counts_response_tokens_exactly_with_a_bf16_mask():
    """sequence=True over 301 response tokens with a bf16 response mask (which cannot hold the count 301):
    the same loss as with a float32 mask."""
    g = torch.Generator().manual_seed(23)
    length, vocab = 301, 6
    old_logits = torch.randn(1, length, vocab, generator=g)
    new_logits = (old_logits + 0.5 * torch.randn(1, length, vocab, generator=g)).double()
    responses = _sample(old_logits, g)
    index, logp = sparsify(old_logits, responses, k=3, delta=1e-3)
    adv = torch.ones(1, length, dtype=torch.float64)
    mask = torch.ones(1, length)
    base = troll_objective(_inputs(new_logits, index, logp, responses, mask, adv), alpha=0.0, sequence=True)
    assert abs(float(base.loss_mat[0, 0]) + 1) > 1e-3  # the geometric mean is not 1
    for low in (torch.bfloat16, torch.float16, torch.bool):
        out = troll_objective(_inputs(new_logits, index, logp, responses, mask.to(low), adv), alpha=0.0, sequence=True)
        assert torch.equal(out.loss_mat, base.loss_mat), low


def test_solver_options_reach_the_dual_solver():
    """Each solver option changes the number of bracketing steps (troll/dual_steps) as Listing 3 sets
    it: the first n with log(eta_max / eta_min) (2 / (num_points + 1))^n < tol, at most max_steps
    (20 by default: tol = 1e-12 would need 21)."""
    _, new_logits, responses, index, logp = _seeded_batch(seed=9, shift=1.0)
    inp = _inputs(new_logits, index, logp, responses)

    def expected(num_points=8, max_steps=20, tol=1e-5, eta_min=1e-7, eta_max=1e2):
        width = math.log(eta_max) - math.log(eta_min)
        return min(max_steps, next(n for n in range(1, 200) if width * (2 / (num_points + 1)) ** n < tol))

    seen = set()
    for options in (
        {}, {"num_points": 4}, {"max_steps": 3}, {"tol": 1e-2}, {"eta_min": 1.0}, {"eta_max": 1e12}, {"tol": 1e-12},
    ):  # fmt: skip
        out = troll_objective(inp, **options)
        assert out.metrics[metric_names.TROLL_PROJECTED_FRAC] > 0
        assert out.metrics[metric_names.TROLL_DUAL_STEPS] == expected(**options), options
        seen.add(expected(**options))
    assert len(seen) == 7  # every option moves the count off the default 10
    assert expected(tol=1e-12, max_steps=10**6) > 20


def test_defaults_are_the_paper_and_config_values():
    """troll_objective's defaults: TROLL (arXiv 2510.03817) eps = 0.05, alpha = 1, p_d = 1e-12, Listing 3's
    solver (8 points, 20 steps, stop width 1e-5, eta in [1e-7, 1e2]), 1024-token chunks; the same as
    conf/objective/troll.yaml and its schema; and a call without options equals one that names them."""
    paper = dict(
        eps=0.05, alpha=1.0, sequence=False, p_default=1e-12, chunk_size=1024, log_kept_mass=True,
        num_points=8, max_steps=20, tol=1e-5, eta_min=1e-7, eta_max=1e2, polish_steps=0,
    )  # fmt: skip
    params = inspect.signature(troll_objective).parameters.values()
    defaults = {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert defaults == paper
    conf = yaml.safe_load((Path(__file__).resolve().parents[2] / "conf/objective/troll.yaml").read_text())
    assert conf["name"] == "troll" and (conf["eps"], conf["alpha"]) == (paper["eps"], paper["alpha"])
    schema = TrollObjective(name="troll")
    for name in ("eps", "alpha", "sequence", "p_default", "chunk_size", "num_points", "max_steps", "tol"):
        assert getattr(schema, name) == paper[name], name
    assert (schema.eta_min, schema.eta_max) == (paper["eta_min"], paper["eta_max"])
    _, new_logits, responses, index, logp = _seeded_batch(seed=9, shift=1.0)
    inp = _inputs(new_logits, index, logp, responses)
    plain, named = troll_objective(inp), troll_objective(inp, **paper)
    assert 0 < plain.metrics[metric_names.TROLL_PROJECTED_FRAC] < 1
    assert torch.equal(plain.loss_mat, named.loss_mat) and plain.metrics == named.metrics
