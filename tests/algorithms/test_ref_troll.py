"""TROLL's loss where the projection acts, against a reference written from the paper in numpy.

The reference (``ref_*`` functions, float64 numpy, no trustbench code) follows TROLL (arXiv 2510.03817):
- the projection (section 3.1, eq. 4): where KL(q_new || q_old) > eps, q_proj = argmin_p KL(p || q_new)
  s.t. KL(p || q_old) <= eps, whose minimiser is log p = log_softmax((log q_new + eta log q_old) / (eta + 1))
  with eta > 0 the root of KL(p_eta || q_old) = eps, found here by scipy's ``brentq`` (a bracketing
  root-finder on the primal constraint, not the dual search the code uses); the closed form itself is
  checked against scipy's SLSQP on the primal problem;
- the loss per response token (eq. 5): -A * q_proj(y) / q_old(y) + alpha * KL(q_new || sg(q_proj));
  in the GSPO form every token's ratio is the sequence's geometric mean s of q_proj(y)/q_old(y), with
  gradient sg(s) * grad log r_t;
- the sparse form (section 3.2, eq. 21): both distributions over the whole vocabulary V, the old kept
  set S (stored at rollout time) renormalised to 1 - (V - |S|) p_d and p_d on every other token; the
  projection and the loss are computed in those V dimensions (the code works in |S| + 1 dimensions).
The reference gradient is central finite differences of the reference loss (q_proj held fixed in the
regression term, as the stop-gradient says).

Every case asserts that the projection acts on a share of tokens and that the projected ratio
differs from the unprojected one by far more than the tolerance, so replacing q_proj by q_new in the
ratio (or dropping a term) fails.

Run: ``pytest tests/algorithms/test_ref_troll.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import brentq, minimize
from scipy.special import logsumexp

from runners import metric_names
from runners.algorithms import OBJECTIVES
from runners.algorithms.types import PolicyInputs

EPS = 0.05
ALPHA = 0.7  # not 1, so that a dropped or doubled alpha shows
P_D = 1e-12
FD_STEP = 1e-5

# -- the reference ---------------------------------------------------------------------------------


def ref_kl(logp: np.ndarray, logq: np.ndarray) -> float:
    """KL(p || q) of two log-probability vectors."""
    return float(np.sum(np.exp(logp) * (logp - logq)))


def ref_project(lq: np.ndarray, lo: np.ndarray, eps: float) -> tuple[np.ndarray, bool]:
    """q_proj of TROLL eq. 4 (log-probs) and whether the row was outside the trust region."""
    if ref_kl(lq, lo) <= eps:
        return lq, False

    def log_p(eta: float) -> np.ndarray:
        z = (lq + eta * lo) / (eta + 1.0)
        return z - logsumexp(z)

    def gap(log_eta: float) -> float:
        return ref_kl(log_p(np.exp(log_eta)), lo) - eps

    hi = 0.0
    while gap(hi) > 0:  # KL(p_eta || q_old) falls to 0 as eta grows
        hi += 2.0
    log_eta = brentq(gap, -40.0, hi, xtol=1e-14, rtol=1e-15, maxiter=500)
    return log_p(np.exp(log_eta)), True


def ref_token_terms(lq: np.ndarray, lo: np.ndarray, y: int, eps: float) -> tuple[float, float, bool]:
    """(log q_proj(y) - log q_old(y), KL(q_new || q_proj), projected) for one token."""
    lp, projected = ref_project(lq, lo, eps)
    return float(lp[y] - lo[y]), ref_kl(lq, lp), projected


def ref_sparse_pair(
    new_logits: np.ndarray, kept: np.ndarray, kept_logp: np.ndarray, p_d: float
) -> tuple[np.ndarray, np.ndarray]:
    """TROLL eq. 21 over the whole vocabulary: (log q_new', log q_old') [V] on the old kept set ``kept``
    (ids) with stored old log-probs ``kept_logp``; p_d on every token outside it."""
    vocab = new_logits.shape[-1]
    rest = 1.0 - (vocab - kept.size) * p_d
    lq_full = new_logits - logsumexp(new_logits)
    lq = np.full(vocab, np.log(p_d))
    lq[kept] = lq_full[kept] - logsumexp(lq_full[kept]) + np.log(rest)
    lo = np.full(vocab, np.log(p_d))
    lo[kept] = kept_logp - logsumexp(kept_logp) + np.log(rest)
    return lq, lo


def ref_token_arrays(
    logits: np.ndarray,
    old: np.ndarray,
    responses: np.ndarray,
    mask: np.ndarray,
    *,
    eps: float,
    kept: list | None,
    p_d: float = P_D,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per response token [B,T]: log q_proj(y) - log q_old(y), KL(q_new || q_proj) and the projected flag.

    Dense: ``old`` [B,T,V] old logits. Sparse: ``kept[b][t]`` = (ids, stored log-probs) and ``old``
    unused; the pair is eq. 21's over V."""
    batch, length, _ = logits.shape
    log_r = np.zeros((batch, length))
    reg = np.zeros((batch, length))
    projected = np.zeros((batch, length), dtype=bool)
    for b in range(batch):
        for t in range(length):
            if not mask[b, t]:
                continue
            if kept is None:
                lq, lo = logits[b, t] - logsumexp(logits[b, t]), old[b, t] - logsumexp(old[b, t])
            else:
                lq, lo = ref_sparse_pair(logits[b, t], *kept[b][t], p_d)
            log_r[b, t], reg[b, t], projected[b, t] = ref_token_terms(lq, lo, int(responses[b, t]), eps)
    return log_r, reg, projected


def ref_loss(
    logits: np.ndarray,
    old: np.ndarray,
    responses: np.ndarray,
    adv: np.ndarray,
    mask: np.ndarray,
    *,
    eps: float,
    alpha: float,
    sequence: bool,
    kept: list | None = None,
    p_d: float = P_D,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-token loss [B,T] (eq. 5, or its GSPO form) and the projected flags [B,T] (inputs as
    ``ref_token_arrays``)."""
    log_r, reg, projected = ref_token_arrays(logits, old, responses, mask, eps=eps, kept=kept, p_d=p_d)
    length = logits.shape[1]
    if sequence:
        seq = np.array([log_r[b][mask[b] > 0].mean() for b in range(logits.shape[0])])
        log_r = np.repeat(seq[:, None], length, axis=1)
    loss = np.where(mask > 0, -np.exp(log_r) * adv + alpha * reg, 0.0)
    return loss, projected


def ref_gradient(
    logits: np.ndarray,
    old: np.ndarray,
    responses: np.ndarray,
    adv: np.ndarray,
    mask: np.ndarray,
    weights: np.ndarray,
    *,
    eps: float,
    alpha: float,
    sequence: bool,
    kept: list | None = None,
    columns: dict | None = None,
    p_d: float = P_D,
) -> np.ndarray:
    """d/d logits of sum_{b,t} weights[b,t] * loss[b,t] by central differences, q_proj fixed in the
    regression term (its stop-gradient) and, in the GSPO form, s fixed outside exp(log r_t - sg(log r_t)).
    ``columns[(b, t)]``: the vocabulary entries to differentiate (default all)."""
    batch, length, vocab = logits.shape
    grad = np.zeros_like(logits)
    log_r_tokens, _, _ = ref_token_arrays(logits, old, responses, mask, eps=eps, kept=kept, p_d=p_d)
    log_r_seq = {b: log_r_tokens[b][mask[b] > 0].mean() for b in range(batch)}

    def pair(row: np.ndarray, b: int, t: int) -> tuple[np.ndarray, np.ndarray]:
        if kept is None:
            return row - logsumexp(row), old[b, t] - logsumexp(old[b, t])
        return ref_sparse_pair(row, *kept[b][t], p_d)

    for b in range(batch):
        for t in range(length):
            if not mask[b, t]:
                continue
            y = int(responses[b, t])
            lq0, lo = pair(logits[b, t], b, t)
            lp_fixed, _ = ref_project(lq0, lo, eps)
            for v in (columns or {}).get((b, t), range(vocab)):
                values = []
                for sign in (1.0, -1.0):
                    row = logits[b, t].copy()
                    row[v] += sign * FD_STEP
                    lq, _ = pair(row, b, t)
                    lp, _ = ref_project(lq, lo, eps)
                    log_r = lp[y] - lo[y]
                    if sequence:  # d/dx of sg(s) * exp(log r_t - sg(log r_t)) = s * d log r_t
                        ratio_term = np.exp(log_r_seq[b]) * log_r
                    else:
                        ratio_term = np.exp(log_r)
                    values.append(weights[b, t] * (-ratio_term * adv[b, t] + alpha * ref_kl(lq, lp_fixed)))
                grad[b, t, v] = (values[0] - values[1]) / (2 * FD_STEP)
    return grad


# -- cases -----------------------------------------------------------------------------------------


def _case(seed: int, *, batch: int = 3, length: int = 4, vocab: int = 12, shift: float = 1.0):
    """Old logits, new logits (old + noise: some tokens in, some out of the trust region), sampled
    tokens (from the old policy), advantages of both signs, a right-padded mask, loss weights."""
    rng = np.random.default_rng(seed)
    old = rng.normal(size=(batch, length, vocab)) * 2.0
    new = old + rng.normal(size=(batch, length, vocab)) * shift * rng.uniform(0.1, 1.0, size=(batch, length, 1))
    probs = np.exp(old - logsumexp(old, axis=-1, keepdims=True))
    responses = np.array([[rng.choice(vocab, p=probs[b, t]) for t in range(length)] for b in range(batch)])
    adv = np.repeat(np.linspace(-1.2, 1.5, batch)[:, None], length, axis=1) + 0.1 * rng.normal(size=(batch, length))
    mask = np.ones((batch, length))
    mask[0, length - 1] = 0.0  # right padding
    weights = rng.uniform(0.5, 1.5, size=(batch, length)) * mask
    return old, new, responses, adv, mask, weights


def _sparse_store(old: np.ndarray, responses: np.ndarray, k: int, cover: float):
    """The stored old distribution: per token the top tokens (at most k, only as many as cover mass
    ``cover``) and the sampled token last, as (ids, true log-probs); also the [B,T,k+1] index/logp
    tensors (unused slots -inf) the objective reads."""
    batch, length, _ = old.shape
    index = np.zeros((batch, length, k + 1), dtype=np.int64)
    logp = np.full((batch, length, k + 1), -np.inf)
    kept = [[None] * length for _ in range(batch)]
    for b in range(batch):
        for t in range(length):
            lo = old[b, t] - logsumexp(old[b, t])
            y = int(responses[b, t])
            order = [int(v) for v in np.argsort(-lo, kind="stable") if v != y]
            top, mass = [], np.exp(lo[y])
            for v in order[:k]:
                if mass >= cover:
                    break
                top.append(v)
                mass += np.exp(lo[v])
            ids = np.array([*top, y])
            index[b, t, : len(top)] = top
            index[b, t, k] = y
            logp[b, t, : len(top)] = lo[top]
            logp[b, t, k] = lo[y]
            kept[b][t] = (ids, lo[ids])
    return kept, torch.from_numpy(index), torch.from_numpy(logp)


def _objective(new, old_index, old_logp, responses, adv, mask, *, sequence: bool, alpha: float = ALPHA, **options):
    logits = torch.tensor(new, dtype=torch.float64, requires_grad=True)
    inp = PolicyInputs(
        logp=torch.zeros(mask.shape, dtype=torch.float64),
        old_logp=torch.zeros(mask.shape, dtype=torch.float64),
        advantages=torch.from_numpy(adv),
        response_mask=torch.from_numpy(mask),
        logits=logits,
        old_topk_index=old_index,
        old_topk_logp=old_logp,
        responses=torch.from_numpy(responses),
    )
    out = OBJECTIVES.get("troll")(inp, eps=EPS, alpha=alpha, sequence=sequence, **options)
    return logits, out


def _assert_acts(projected: np.ndarray, mask: np.ndarray, loss: np.ndarray, unprojected: np.ndarray) -> None:
    share = projected[mask > 0].mean()
    assert 0.2 <= share <= 0.8, f"the projection should act on some tokens but not all, acts on {share:.2f}"
    assert np.abs(loss - unprojected).max() > 1e-3  # q_proj vs q_new in the ratio: far above the tolerance


# -- dense (section 3.1) ---------------------------------------------------------------------------


def test_reference_projection_is_the_primal_minimiser():
    """The closed form of the reference (eq. 4) against scipy's SLSQP on the primal problem."""
    old, new, *_ = _case(3, batch=1, length=3, vocab=6, shift=2.0)
    for t in range(3):
        lq, lo = new[0, t] - logsumexp(new[0, t]), old[0, t] - logsumexp(old[0, t])
        lp, projected = ref_project(lq, lo, EPS)
        if not projected:
            continue
        qn, qo = np.exp(lq), np.exp(lo)
        res = minimize(
            lambda p, qn=qn: float(np.sum(p * np.log(p / qn))),
            qo.copy(),
            method="SLSQP",
            bounds=[(1e-12, 1.0)] * qn.size,
            constraints=[
                {"type": "eq", "fun": lambda p: p.sum() - 1.0},
                {"type": "ineq", "fun": lambda p, qo=qo: EPS - float(np.sum(p * np.log(p / qo)))},
            ],
            options={"ftol": 1e-14, "maxiter": 500},
        )
        assert res.success
        np.testing.assert_allclose(np.exp(lp), res.x, atol=2e-5)


@pytest.mark.parametrize("sequence", [False, True], ids=["token", "gspo"])
def test_dense_loss_and_gradient_match_the_reference(sequence):
    """Dense mode (old_topk_index None, full old log-probs), eta* polished to machine precision."""
    old, new, responses, adv, mask, weights = _case(11)
    ref, projected = ref_loss(new, old, responses, adv, mask, eps=EPS, alpha=ALPHA, sequence=sequence)
    unprojected, _ = ref_loss(new, old, responses, adv, mask, eps=1e9, alpha=ALPHA, sequence=sequence)
    _assert_acts(projected, mask, ref, unprojected)
    old_logp = torch.log_softmax(torch.from_numpy(old), -1)
    logits, out = _objective(new, None, old_logp, responses, adv, mask, sequence=sequence, polish_steps=4)
    np.testing.assert_allclose(out.loss_mat.detach().numpy(), ref, rtol=1e-9, atol=1e-10)
    (out.loss_mat * torch.from_numpy(weights)).sum().backward()
    grad = ref_gradient(new, old, responses, adv, mask, weights, eps=EPS, alpha=ALPHA, sequence=sequence)
    np.testing.assert_allclose(logits.grad.numpy(), grad, rtol=1e-6, atol=1e-8)
    assert out.metrics[metric_names.TROLL_PROJECTED_FRAC] == pytest.approx(projected[mask > 0].mean())


def test_dense_loss_with_the_default_solver_is_within_its_bracket_tolerance():
    """The configured default (no Newton polish: eta* is the midpoint of the last bracket) stays
    within 1e-4 of the reference, far below the 1e-3-and-up effect of the projection."""
    old, new, responses, adv, mask, weights = _case(12)
    ref, projected = ref_loss(new, old, responses, adv, mask, eps=EPS, alpha=ALPHA, sequence=False)
    unprojected, _ = ref_loss(new, old, responses, adv, mask, eps=1e9, alpha=ALPHA, sequence=False)
    _assert_acts(projected, mask, ref, unprojected)
    old_logp = torch.log_softmax(torch.from_numpy(old), -1)
    logits, out = _objective(new, None, old_logp, responses, adv, mask, sequence=False)
    np.testing.assert_allclose(out.loss_mat.detach().numpy(), ref, atol=1e-4)
    (out.loss_mat * torch.from_numpy(weights)).sum().backward()
    grad = ref_gradient(new, old, responses, adv, mask, weights, eps=EPS, alpha=ALPHA, sequence=False)
    np.testing.assert_allclose(logits.grad.numpy(), grad, atol=1e-3)


def test_alpha_zero_leaves_only_the_projected_ratio():
    """alpha = 0: the loss is -A * q_proj(y)/q_old(y) alone; its gradient flows through eta* (appendix
    A.3), which the reference reaches by finite differences through the root-finder."""
    old, new, responses, adv, mask, weights = _case(13)
    ref, projected = ref_loss(new, old, responses, adv, mask, eps=EPS, alpha=0.0, sequence=False)
    assert projected[mask > 0].any()
    old_logp = torch.log_softmax(torch.from_numpy(old), -1)
    logits, out = _objective(new, None, old_logp, responses, adv, mask, sequence=False, polish_steps=4, alpha=0.0)
    np.testing.assert_allclose(out.loss_mat.detach().numpy(), ref, rtol=1e-9, atol=1e-10)
    (out.loss_mat * torch.from_numpy(weights)).sum().backward()
    grad = ref_gradient(new, old, responses, adv, mask, weights, eps=EPS, alpha=0.0, sequence=False)
    np.testing.assert_allclose(logits.grad.numpy(), grad, rtol=1e-6, atol=1e-8)


# -- sparse (section 3.2), V >> K ---------------------------------------------------------------------


def _peaked_sparse_case(k: int = 6, vocab: int = 400):
    """``_case`` with peaked rows (fewer than k tokens cover 1 - 1e-3 in some) and its stored sparse old
    distribution: (old, new, responses, adv, mask, weights, kept, index, logp)."""
    old, new, responses, adv, mask, weights = _case(21, vocab=vocab, shift=1.2)
    peak = np.array([1.0, 6.0, 1.0, 6.0])[None, :, None]
    new, old = old * peak + (new - old), old * peak
    kept, index, logp = _sparse_store(old, responses, k, cover=1 - 1e-3)
    return old, new, responses, adv, mask, weights, kept, index, logp


def _acting_reference(case, options) -> tuple[np.ndarray, np.ndarray]:
    """The reference loss and projected flags of ``case``, checked to act (``_assert_acts``)."""
    old, new, responses, adv, mask = case[:5]
    ref, projected = ref_loss(new, old, responses, adv, mask, eps=EPS, **options)
    unprojected, _ = ref_loss(new, old, responses, adv, mask, eps=1e9, **options)
    _assert_acts(projected, mask, ref, unprojected)
    return ref, projected


def check_sparse_gradient(got: np.ndarray, case, options, zero_atol: float = 0.0) -> None:
    """The logits' gradient ``got`` [B,T,V] against ``ref_gradient``'s finite differences on every kept
    logit and 3 dropped ones per token; every dropped logit's gradient within ``zero_atol`` of 0 (eq. 21
    puts p_d there whatever the logits)."""
    old, new, responses, adv, mask, weights, kept = case[:7]
    vocab = new.shape[-1]
    rng = np.random.default_rng(0)
    columns = {}
    for b in range(new.shape[0]):
        for t in range(new.shape[1]):
            dropped = np.setdiff1d(np.arange(vocab), kept[b][t][0])
            columns[(b, t)] = [*kept[b][t][0].tolist(), *rng.choice(dropped, 3, replace=False).tolist()]
    grad = ref_gradient(new, old, responses, adv, mask, weights, eps=EPS, columns=columns, **options)
    for (b, t), cols in columns.items():
        np.testing.assert_allclose(got[b, t, cols], grad[b, t, cols], rtol=1e-6, atol=1e-8, err_msg=f"token {b},{t}")
        others = np.setdiff1d(np.arange(vocab), kept[b][t][0])
        np.testing.assert_allclose(got[b, t, others], 0.0, rtol=0, atol=zero_atol, err_msg="only the kept logits")


@pytest.mark.parametrize(
    ("sequence", "p_d"), [(False, P_D), (True, P_D), (False, 1e-4)], ids=["token", "gspo", "token-heavy-tail"]
)
def test_sparse_loss_and_gradient_match_the_reference_over_the_whole_vocabulary(sequence, p_d):
    """V = 400, at most 6 + 1 kept tokens: the reference projects eq. 21's V-dimensional pair; the
    code projects |S| + 1 dimensions. Gradients on the kept logits by finite differences, and on a few
    dropped ones (where eq. 21 puts p_d whatever the logits: zero). ``p_d`` = 1e-4 gives the dropped
    tokens 4% of the mass, so that the tail's share of the projection shows beyond rounding."""
    case = _peaked_sparse_case()
    old, new, responses, adv, mask, weights, kept, index, logp = case
    sizes = [kept[b][t][0].size for b in range(3) for t in range(4)]
    assert min(sizes) < 6 + 1 == max(sizes), sizes  # some rows cut by the mass cover, some full
    options = dict(alpha=ALPHA, sequence=sequence, kept=kept, p_d=p_d)
    ref, projected = _acting_reference(case, options)
    logits, out = _objective(new, index, logp, responses, adv, mask, sequence=sequence, polish_steps=4, p_default=p_d)
    np.testing.assert_allclose(out.loss_mat.detach().numpy(), ref, rtol=1e-8, atol=1e-9)
    (out.loss_mat * torch.from_numpy(weights)).sum().backward()
    check_sparse_gradient(logits.grad.numpy(), case, options)
    assert out.metrics[metric_names.TROLL_PROJECTED_FRAC] == pytest.approx(projected[mask > 0].mean())
    assert out.metrics[metric_names.TROLL_KEPT_TOKENS] == pytest.approx(np.mean(sizes[:3] + sizes[4:]))
