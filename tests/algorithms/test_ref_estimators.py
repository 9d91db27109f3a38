"""Advantage estimators against references written from the papers, and the references against verl.

What is compared with what:

- ``ESTIMATORS[name]`` (grpo, drgrpo, rloo, loop, gpg, rfpp, rfpp_baseline, gae, egae; parameters of the
  conf/estimator presets and others) against the ``ref_*`` functions below: advantages and returns [B,T].
- The same references against verl 0.9.1's own functions where verl has the method (GRPO / Dr.GRPO,
  RLOO, GPG, REINFORCE++, REINFORCE++-baseline, GAE): a second, independent reference (``verl`` marker).

The references are plain float64 loops over prompt groups, sequences and tokens, written from each
paper's formula (cited in each docstring); they use nothing from ``runners.algorithms``. Where a paper
leaves a choice open, the reference takes verl 0.9.1's (``verl.trainer.ppo.core_algos``), which the
library follows by design: the group std is the unbiased sample std (``torch.std``) plus ``eps``; a
group of one response has baseline 0 and std 1 (its advantage is its score); batch whitening uses the
mean and the unbiased std of all real tokens with 1e-8 under the square root.

The batches: prompt groups of 4, 3, 2, 1, 5 and 1 responses in shuffled order (two singletons, one with
score 0), tied scores inside a group and a group whose scores are all equal, variable lengths, a score
split over two tokens; token estimators get process rewards, observation-token holes inside responses
and critic values; EGAE gets finished and truncated (unfinished) responses.

Tolerances: the library computes in float32 (inputs float32-representable): rtol 1e-5, atol 1e-6
against the float64 references. The references against verl in float64: 1e-12, or 1e-7 where verl's
whitening adds 1e-8 to the token count or verl keeps a constant in float32 (GRPO's singleton std, GPG's alpha).

Run: ``pytest tests/algorithms/test_ref_estimators.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from runners.algorithms import ESTIMATORS
from runners.algorithms.types import AdvantageInputs

CONF = Path(__file__).resolve().parents[2] / "conf" / "estimator"
RTOL, ATOL = 1e-5, 1e-6
WHITEN_EPS = 1e-8  # under the square root of the batch variance (verl's masked_whiten)


# -- references ----------------------------------------------------------------------------------------
def ref_scores(token_rewards) -> list[float]:
    """Outcome score of each response: ``R_i = sum_t r_{i,t}`` (verl's convention: the outcome reward sits
    on the last real token, process rewards add up)."""
    return [float(sum(float(x) for x in row)) for row in token_rewards]


def _members(group_index) -> dict:
    """group id -> indices of its responses."""
    members: dict = {}
    for i, g in enumerate(group_index):
        members.setdefault(g.item() if hasattr(g, "item") else g, []).append(i)
    return members


def _broadcast(per_seq, mask) -> np.ndarray:
    out = np.zeros(np.shape(mask))
    for i in range(out.shape[0]):
        for t in range(out.shape[1]):
            if mask[i][t] > 0:
                out[i, t] = per_seq[i]
    return out


def _mean(xs) -> float:
    return sum(xs) / len(xs)


def _sample_std(xs) -> float:
    """Unbiased (Bessel-corrected) sample standard deviation, as ``torch.std``."""
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def ref_grpo(token_rewards, mask, group_index, *, std_eps=1e-6, norm_by_std=True) -> np.ndarray:
    """GRPO outcome advantage (DeepSeekMath, arXiv 2402.03300, sec. 4.1.2):
    ``A_i = (R_i - mean_g R) / (std_g R + eps)`` on every token of response i; ``norm_by_std=False`` is
    Dr. GRPO's ``R_i - mean_g R`` (arXiv 2503.20783, sec. 3). Unbiased std; a singleton: mean 0, std 1."""
    scores = ref_scores(token_rewards)
    adv = [0.0] * len(scores)
    for members in _members(group_index).values():
        values = [scores[i] for i in members]
        mean, std = (0.0, 1.0) if len(values) == 1 else (_mean(values), _sample_std(values))
        for i in members:
            adv[i] = (scores[i] - mean) / (std + std_eps) if norm_by_std else scores[i] - mean
    return _broadcast(adv, mask)


def ref_rloo(token_rewards, mask, group_index) -> np.ndarray:
    """RLOO (Ahmadian et al., arXiv 2402.14740, the RLOO estimator): ``A_i = R_i - (1 / (k - 1)) sum_{j != i} R_j`` over the other
    responses of the prompt; a singleton keeps ``R_i`` (no other sample, verl's convention). LOOP
    (arXiv 2502.01600) uses the same advantages."""
    scores = ref_scores(token_rewards)
    adv = [0.0] * len(scores)
    for members in _members(group_index).values():
        for i in members:
            others = [scores[j] for j in members if j != i]
            adv[i] = scores[i] - (_mean(others) if others else 0.0)
    return _broadcast(adv, mask)


def ref_gpg(token_rewards, mask, group_index, *, rescale="verl", f_norm=1.0) -> np.ndarray:
    """GPG (arXiv 2504.02546, sec. 3): ``A_i = alpha (R_i - mean_g R) / F_norm``.

    ``alpha``: ``"groups"`` = the paper's ``B / (B - M)``, M = responses in groups whose rewards are all
    equal (no gradient signal; a group of one counts as such); ``"verl"`` = B / #responses with a non-zero
    score (verl 0.9.1); ``"none"`` = 1. A singleton's baseline is 0 (verl).
    """
    scores = ref_scores(token_rewards)
    batch = len(scores)
    groups = _members(group_index)
    if rescale == "groups":
        silent = sum(len(m) for m in groups.values() if len({scores[i] for i in m}) == 1)
        alpha = batch / max(batch - silent, 1)
    elif rescale == "verl":
        alpha = batch / max(sum(1 for s in scores if s != 0), 1)
    else:
        alpha = 1.0
    adv = [0.0] * batch
    for members in groups.values():
        mean = 0.0 if len(members) == 1 else _mean([scores[i] for i in members])
        for i in members:
            adv[i] = alpha * (scores[i] - mean) / f_norm
    return _broadcast(adv, mask)


def ref_whiten(values, mask, *, center=True) -> np.ndarray:
    """Batch ("global") normalisation over all real tokens: ``(x - mean) / sqrt(var + 1e-8)`` with the
    unbiased variance (REINFORCE++, arXiv 2501.03262, global advantage normalisation; ``center=False`` divides by the std only);
    zero off the mask."""
    real = [(i, t) for i in range(values.shape[0]) for t in range(values.shape[1]) if mask[i][t] > 0]
    xs = [float(values[i, t]) for i, t in real]
    mean = _mean(xs)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    out = np.zeros(values.shape)
    for i, t in real:
        out[i, t] = ((values[i, t] - mean) if center else values[i, t]) / math.sqrt(var + WHITEN_EPS)
    return out


def _real_positions(mask_row) -> list[int]:
    return [t for t in range(len(mask_row)) if mask_row[t] > 0]


def ref_discounted_returns(token_rewards, mask, gamma) -> np.ndarray:
    """REINFORCE++'s token return ``G_t = sum_{k >= t} gamma^{k - t} r_k`` over the response's real tokens
    (arXiv 2501.03262; observation tokens inside a response are skipped), zero off the mask."""
    out = np.zeros(np.shape(mask))
    for i, row in enumerate(mask):
        positions = _real_positions(row)
        for n, t in enumerate(positions):
            out[i, t] = sum(gamma**m * float(token_rewards[i][k]) for m, k in enumerate(positions[n:]))
    return out


def ref_rfpp(token_rewards, mask, *, gamma=1.0, center=True):
    """REINFORCE++ (arXiv 2501.03262): ``(whiten(G), G)``, the returns normalised over the whole batch."""
    returns = ref_discounted_returns(token_rewards, mask, gamma)
    return ref_whiten(returns, mask, center=center), returns


def ref_rfpp_baseline(token_rewards, mask, group_index) -> np.ndarray:
    """REINFORCE++-baseline (arXiv 2501.03262): ``R_i - mean_g R`` on every token (singleton: baseline 0),
    then normalised over the whole batch."""
    centered = ref_grpo(token_rewards, mask, group_index, norm_by_std=False)
    return ref_whiten(centered, mask)


def ref_gae(token_rewards, values, mask, *, gamma, lam, whiten=True, bootstrap=None):
    """GAE (Schulman et al., arXiv 1506.02438, eq. 16) by its recursion over the real tokens of each
    response, last to first: ``delta_t = r_t + gamma V(s_{t+1}) - V(s_t)``, ``A_t = delta_t + gamma lam A_{t+1}``;
    ``V`` after the last token is ``bootstrap[i]`` (0: the response ended). Returns ``(A, A_raw + V)``,
    ``A`` whitened over the batch when ``whiten`` (PPO's advantage normalisation, as verl)."""
    raw = np.zeros(np.shape(mask))
    returns = np.zeros(np.shape(mask))
    for i, row in enumerate(mask):
        next_value = 0.0 if bootstrap is None else float(bootstrap[i])
        next_adv = 0.0
        for t in reversed(_real_positions(row)):
            delta = float(token_rewards[i][t]) + gamma * next_value - float(values[i][t])
            raw[i, t] = delta + gamma * lam * next_adv
            returns[i, t] = raw[i, t] + float(values[i][t])
            next_value, next_adv = float(values[i][t]), raw[i, t]
    return (ref_whiten(raw, mask) if whiten else raw), returns


def ref_egae(token_rewards, values, mask, finished, *, gamma, lam, whiten=True):
    """EGAE (T-PPO, arXiv 2506.15050, sec. 3.1, eq. 6) as the explicit sum over a window of l tokens:
    ``A_t = sum_{k=0}^{l-t-1} (gamma lam)^k delta_{t+k}``, with ``V(s_l) = V(s_{l-1})`` for a response
    truncated at the window (not finished) and ``V(s_l) = 0`` for a finished one (plain GAE, eq. 2).
    Positions are the response's real tokens. Returns ``(A, A_raw + V)`` as :func:`ref_gae`."""
    raw = np.zeros(np.shape(mask))
    returns = np.zeros(np.shape(mask))
    for i, row in enumerate(mask):
        positions = _real_positions(row)
        if not positions:
            continue
        v = [float(values[i][t]) for t in positions]
        v_after = 0.0 if finished[i] else v[-1]  # V(s_l) = V(s_{l-1}) for the not-yet-generated state
        deltas = [
            float(token_rewards[i][t]) + gamma * (v[n + 1] if n + 1 < len(v) else v_after) - v[n]
            for n, t in enumerate(positions)
        ]
        for n, t in enumerate(positions):
            raw[i, t] = sum((gamma * lam) ** k * deltas[n + k] for k in range(len(positions) - n))
            returns[i, t] = raw[i, t] + v[n]
    return (ref_whiten(raw, mask) if whiten else raw), returns


# -- batches --------------------------------------------------------------------------------------------
def _f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).astype(np.float64)


@dataclass
class OutcomeCase:
    """token_rewards, mask [B,T] float64 (float32-representable), group ids [B] long, uid strings [B]."""

    rewards: np.ndarray
    mask: np.ndarray
    groups: np.ndarray
    uids: np.ndarray


# (group id, scores): 4 with ties, 3 all equal, 2, a singleton, 5 with a tie, a singleton with score 0
GROUPS = [
    (17, [1.0, 0.0, 1.0, 1.0]),
    (3, [0.5, 0.5, 0.5]),
    (42, [0.25, -0.75]),
    (8, [0.7]),
    (5, [0.3, -1.1, 0.3, 2.0, 0.9]),
    (11, [0.0]),
]
BINARY_GROUPS = [(17, [1.0, 0.0, 1.0, 1.0]), (3, [1.0, 1.0, 1.0]), (42, [0.0, 1.0]), (8, [1.0]), (5, [0, 0, 1, 0, 1])]


def outcome_case(seed: int, groups=GROUPS, *, length: int = 8) -> OutcomeCase:
    """Responses of the given groups in shuffled order, lengths 1..T, the score on the last real token
    (one response's score split over its first and last tokens)."""
    rng = np.random.default_rng(seed)
    ids = [g for g, scores in groups for _ in scores]
    scores = [float(s) for _, ss in groups for s in ss]
    order = rng.permutation(len(ids))
    ids, scores = [ids[k] for k in order], [scores[k] for k in order]
    batch = len(ids)
    lengths = rng.integers(1, length + 1, batch)
    split = next(i for i, s in enumerate(scores) if s != 0)  # this response's score is spread over two tokens
    lengths[split] = length
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.float64)
    rewards = np.zeros((batch, length))
    rewards[np.arange(batch), lengths - 1] = scores
    rewards[split, 0], rewards[split, length - 1] = 0.25 * scores[split], 0.75 * scores[split]
    uids = np.array([f"prompt-{g}" for g in ids], dtype=object)
    return OutcomeCase(_f32(rewards), mask, np.array(ids), uids)


@dataclass
class TokenCase:
    """Process rewards, critic values, a mask with observation holes, finished flags [B]."""

    rewards: np.ndarray
    values: np.ndarray
    mask: np.ndarray
    finished: np.ndarray


def token_case(seed: int, *, batch: int = 7, length: int = 9) -> TokenCase:
    """Even rows are truncated at the window (full length, unfinished, no outcome reward, one with a
    process reward); odd rows finished at lengths 5..T with an outcome reward; holes inside responses."""
    rng = np.random.default_rng(seed)
    finished = np.array([i % 2 == 1 for i in range(batch)])
    lengths = np.where(finished, rng.integers(5, length + 1, batch), length)
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.float64)
    mask[1, 1] = mask[4, 3] = mask[4, 4] = mask[6, 0] = 0.0  # observation tokens inside responses
    rewards = np.zeros((batch, length))
    for i in range(batch):
        if finished[i]:
            rewards[i, lengths[i] - 1] = rng.normal()
    rewards[1, 0] = 0.3  # process rewards
    rewards[2, 5] = -0.4
    rewards[5, 1] = 0.2
    values = rng.normal(0.0, 1.0, (batch, length)) * mask
    return TokenCase(_f32(rewards * mask), _f32(values), mask, finished)


def estimator_preset(name: str) -> dict:
    """Parameters of the conf/estimator preset ``name``."""
    node = yaml.safe_load((CONF / f"{name}.yaml").read_text())
    node.pop("defaults", None)
    node.pop("name", None)
    return node


def run_estimator(name: str, case, params: dict, *, group_ids=None):
    """The library estimator on float32 tensors; ``(advantages, returns)`` as float64 arrays."""
    if group_ids is None and isinstance(case, OutcomeCase):
        group_ids = torch.tensor(case.groups)
    inp = AdvantageInputs(
        token_rewards=torch.tensor(case.rewards, dtype=torch.float32),
        response_mask=torch.tensor(case.mask, dtype=torch.float32),
        group_index=group_ids,
        values=torch.tensor(case.values, dtype=torch.float32) if isinstance(case, TokenCase) else None,
        finished=torch.tensor(case.finished) if isinstance(case, TokenCase) else None,
    )
    adv, ret = ESTIMATORS.get(name)(inp, **params)
    return adv.double().numpy(), ret.double().numpy()


def close(ours, ref, *, rtol=RTOL, atol=ATOL) -> None:
    np.testing.assert_allclose(ours, ref, rtol=rtol, atol=atol)


def _outcome_case_acts(case: OutcomeCase) -> None:
    sizes = {g: int((case.groups == g).sum()) for g in set(case.groups.tolist())}
    assert sorted(sizes.values()) == [1, 1, 2, 3, 4, 5]
    lengths = case.mask.sum(-1)
    assert lengths.min() == 1 and lengths.max() == case.mask.shape[1]
    assert (case.rewards != 0).sum(-1).max() == 2  # one score spread over two tokens
    assert list(case.groups) != sorted(case.groups)  # groups interleaved


# -- outcome estimators ----------------------------------------------------------------------------------
OUTCOME = {
    "grpo": (lambda c, p: ref_grpo(c.rewards, c.mask, c.groups, **p), [{}, {"std_eps": 1e-3}]),
    "drgrpo": (lambda c, p: ref_grpo(c.rewards, c.mask, c.groups, norm_by_std=False), [{}]),
    "rloo": (lambda c, p: ref_rloo(c.rewards, c.mask, c.groups), [{}]),
    "loop": (lambda c, p: ref_rloo(c.rewards, c.mask, c.groups), [{}]),
    "gpg": (
        lambda c, p: ref_gpg(c.rewards, c.mask, c.groups, **p),
        [{}, {"rescale": "groups", "f_norm": 2.0}, {"rescale": "none", "f_norm": 0.5}],
    ),
    "rfpp_baseline": (lambda c, p: ref_rfpp_baseline(c.rewards, c.mask, c.groups), [{}]),
}


@pytest.mark.parametrize(
    ("name", "k"), [(name, k) for name, (_, params) in OUTCOME.items() for k in range(len(params))]
)
@pytest.mark.parametrize("seed", [0, 1])
def test_outcome_estimator_matches_reference(name, k, seed):
    """Group baselines with groups of different sizes, two singletons, ties and an all-equal group."""
    ref_fn, param_sets = OUTCOME[name]
    params = {**estimator_preset(name), **param_sets[k]}
    case = outcome_case(seed)
    _outcome_case_acts(case)
    adv, ret = run_estimator(name, case, params)
    ref = ref_fn(case, params)
    close(adv, ref)
    close(ret, ref)
    by_uid, _ = run_estimator(name, case, params, group_ids=case.uids)  # verl's uid strings as group ids
    close(by_uid, ref)
    # the all-equal group (id 3) gets exactly 0 before any batch whitening; other groups do not
    if name != "rfpp_baseline":
        assert (adv[case.groups == 3] == 0).all()
        assert (np.abs(adv[case.groups == 5]).sum(-1) > 0).all()


def test_outcome_references_on_a_hand_example():
    """One group of 3 scores [1, 0, 2] and a singleton [4]: the references' numbers, worked by hand."""
    rewards = np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 2.0], [4.0, 0.0]])
    mask = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 1.0], [1.0, 0.0]])
    groups = np.array([0, 0, 0, 1])
    # mean 1, unbiased std 1: GRPO (R - 1) / (1 + eps); the singleton keeps R / (1 + eps)
    np.testing.assert_allclose(ref_grpo(rewards, mask, groups, std_eps=0.0)[:, 0], [0.0, -1.0, 1.0, 4.0])
    # RLOO: R_i - mean of the other two
    np.testing.assert_allclose(ref_rloo(rewards, mask, groups)[:, 0], [1 - 1.0, 0 - 1.5, 2 - 0.5, 4.0])
    # GPG, paper rescale: the singleton is silent, alpha = 4 / 3
    np.testing.assert_allclose(ref_gpg(rewards, mask, groups, rescale="groups")[:, 0], [0.0, -4 / 3, 4 / 3, 16 / 3])


# -- token estimators ------------------------------------------------------------------------------------
def _token_case_acts(case: TokenCase) -> None:
    assert case.finished.any() and not case.finished.all()
    lengths = case.mask.sum(-1)
    real = case.mask > 0
    inner_holes = [~real[i, t] and real[i, t:].any() and real[i, :t].any() for i, t in np.argwhere(~real)]
    assert sum(inner_holes) >= 3 and lengths.min() >= 1
    assert (case.rewards[case.finished] != 0).any() and (case.rewards[~case.finished] != 0).any()


@pytest.mark.parametrize(
    "params", [estimator_preset("rfpp"), {"gamma": 0.9, "center": True}, {"gamma": 0.8, "center": False}], ids=str
)
def test_rfpp_matches_reference(params):
    case = token_case(0)
    _token_case_acts(case)
    adv, ret = run_estimator("rfpp", case, params)
    ref_adv, ref_ret = ref_rfpp(case.rewards, case.mask, **params)
    close(adv, ref_adv)
    close(ret, ref_ret)
    assert np.unique(np.round(ref_adv[case.mask > 0], 9)).size > 5


@pytest.mark.parametrize(
    "params",
    [estimator_preset("gae"), {"gamma": 0.95, "lam": 0.9}, {"gamma": 0.9, "lam": 0.7, "whiten": False}],
    ids=str,
)
def test_gae_matches_reference(params):
    case = token_case(1)
    _token_case_acts(case)
    adv, ret = run_estimator("gae", case, params)
    ref_adv, ref_ret = ref_gae(case.rewards, case.values, case.mask, **params)
    close(adv, ref_adv)
    close(ret, ref_ret)


@pytest.mark.parametrize(
    "params",
    [estimator_preset("egae"), {"gamma": 0.9, "lam": 0.8}, {"gamma": 1.0, "lam": 0.95, "whiten": False}],
    ids=str,
)
@pytest.mark.parametrize("seed", [2, 3])
def test_egae_matches_reference(params, seed):
    """EGAE bootstraps truncated responses from V(s_{l-1}) and ends finished ones with V = 0."""
    case = token_case(seed)
    _token_case_acts(case)
    adv, ret = run_estimator("egae", case, params)
    ref_adv, ref_ret = ref_egae(case.rewards, case.values, case.mask, case.finished, **params)
    close(adv, ref_adv)
    close(ret, ref_ret)
    # the truncation acts: plain GAE (V = 0 after every window) differs on truncated rows only
    gae_adv, gae_ret = ref_gae(
        case.rewards, case.values, case.mask, gamma=params["gamma"], lam=params["lam"], whiten=False
    )
    raw, raw_ret = ref_egae(
        case.rewards, case.values, case.mask, case.finished, gamma=params["gamma"], lam=params["lam"], whiten=False
    )
    np.testing.assert_allclose(raw[case.finished], gae_adv[case.finished], rtol=1e-12, atol=1e-12)
    assert (np.abs(raw_ret - gae_ret)[~case.finished].max(-1) > 1e-3).all()


def test_egae_reference_last_td_term_with_gamma_one():
    """T-PPO with gamma = 1: the last TD term of a truncated response is its reward there, r + V - V."""
    case = token_case(4)
    raw, _ = ref_egae(case.rewards, case.values, case.mask, case.finished, gamma=1.0, lam=0.0, whiten=False)
    for i in np.flatnonzero(~case.finished):
        last = _real_positions(case.mask[i])[-1]
        assert raw[i, last] == pytest.approx(case.rewards[i, last], abs=1e-12)


def test_gae_recursion_equals_egae_sum_on_finished_responses():
    """The recursion (GAE) and the explicit sum (EGAE eq. 6) agree where they should: every row finished."""
    case = token_case(5)
    everything = np.ones_like(case.finished)
    for gamma, lam in [(1.0, 1.0), (0.9, 0.7)]:
        a, r = ref_gae(case.rewards, case.values, case.mask, gamma=gamma, lam=lam, whiten=False)
        b, s = ref_egae(case.rewards, case.values, case.mask, everything, gamma=gamma, lam=lam, whiten=False)
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(r, s, rtol=1e-12, atol=1e-12)


# -- the references against verl --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def core_algos():
    return pytest.importorskip("verl.trainer.ppo.core_algos")


def _t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


@pytest.mark.verl
@pytest.mark.parametrize("seed", [0, 1])
def test_outcome_references_match_verl(core_algos, seed):
    """GRPO, Dr.GRPO, RLOO, GPG and REINFORCE++-baseline references equal verl's functions (float64)."""
    case = outcome_case(seed)
    r, m = _t(case.rewards), _t(case.mask)
    for norm in (True, False):
        verl, _ = core_algos.compute_grpo_outcome_advantage(r.clone(), m, case.uids, norm_adv_by_std_in_grpo=norm)
        ref = ref_grpo(case.rewards, case.mask, case.groups, norm_by_std=norm)
        # verl's singleton std is a float32 constant: 1 + eps rounds to float32 there (relative 5e-8)
        np.testing.assert_allclose(verl.numpy(), ref, rtol=1e-7, atol=1e-12)
    verl, _ = core_algos.compute_rloo_outcome_advantage(r.clone(), m, case.uids)
    np.testing.assert_allclose(verl.numpy(), ref_rloo(case.rewards, case.mask, case.groups), rtol=1e-12, atol=1e-12)
    verl, _ = core_algos.compute_gpg_outcome_advantage(r.clone(), m, case.uids)
    ref = ref_gpg(case.rewards, case.mask, case.groups, rescale="verl")
    np.testing.assert_allclose(verl.numpy(), ref, rtol=1e-7, atol=1e-12)  # verl's alpha is float32
    verl, _ = core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(r.clone(), m, case.uids)
    ref = ref_rfpp_baseline(case.rewards, case.mask, case.groups)
    np.testing.assert_allclose(verl.numpy(), ref, rtol=1e-7, atol=1e-9)


@pytest.mark.verl
def test_gpg_reference_matches_verl_on_binary_rewards(core_algos):
    """verl's GPG rescale B / #non-zero scores on 0/1 rewards (many zero scores)."""
    case = outcome_case(2, BINARY_GROUPS)
    verl, _ = core_algos.compute_gpg_outcome_advantage(_t(case.rewards), _t(case.mask), case.uids)
    ref = ref_gpg(case.rewards, case.mask, case.groups, rescale="verl")
    np.testing.assert_allclose(verl.numpy(), ref, rtol=1e-7, atol=1e-12)  # verl's alpha is float32
    adv, _ = run_estimator("gpg", case, {"rescale": "verl"})
    close(adv, ref)


@pytest.mark.verl
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_rfpp_reference_matches_verl(core_algos, gamma):
    from omegaconf import OmegaConf

    case = token_case(0)
    adv, ret = core_algos.compute_reinforce_plus_plus_outcome_advantage(
        _t(case.rewards), _t(case.mask), config=OmegaConf.create({"gamma": gamma})
    )
    ref_adv, ref_ret = ref_rfpp(case.rewards, case.mask, gamma=gamma)
    np.testing.assert_allclose(ret.numpy(), ref_ret, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(adv.numpy(), ref_adv, rtol=1e-7, atol=1e-9)


@pytest.mark.verl
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.95, 0.9)])
def test_gae_reference_matches_verl(core_algos, gamma, lam):
    """verl's GAE (finished responses, whitened advantages, returns = raw + V) equals the reference;
    on positions off the mask verl leaves carried values, so only real tokens are compared."""
    case = token_case(1)
    adv, ret = core_algos.compute_gae_advantage_return(_t(case.rewards), _t(case.values), _t(case.mask), gamma, lam)
    ref_adv, ref_ret = ref_gae(case.rewards, case.values, case.mask, gamma=gamma, lam=lam)
    real = case.mask > 0
    np.testing.assert_allclose(ret.numpy()[real], ref_ret[real], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(adv.numpy()[real], ref_adv[real], rtol=1e-7, atol=1e-9)
