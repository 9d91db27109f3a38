"""Advantage estimators, one function per method (GRPO arXiv 2402.03300, Dr.GRPO 2503.20783, RLOO
2402.14740, LOOP 2502.01600, REINFORCE++ 2501.03262, GPG 2504.02546, GAE 1506.02438, EGAE 2506.15050).

Contract: ``fn(inp: AdvantageInputs, **params) -> (advantages [B,T], returns [B,T])``, float32,
zero outside ``inp.response_mask``.

Design decisions:

- Outcome estimators (GRPO, Dr.GRPO, RLOO, LOOP, GPG, REINFORCE++-baseline) reduce each response to
  a score ``R_i = token_rewards.sum(-1)`` and compare it with its prompt group. Group statistics use
  scatter ops (``index_add_``), not a Python loop over groups as verl does, so they cost the same for
  B = 10 or 10^5 and run on the tensors' device.
- Token estimators (REINFORCE++, GAE, EGAE) run one reverse scan over T, vectorised over B. Masked
  positions inside a response (multi-turn observation tokens) carry the running return, next value
  and GAE accumulator through unchanged, as verl does.
- Where verl 0.9.1 has the method, its semantics are kept (the tests compare on random tensors):
  unbiased group std, ``eps`` added to the std, token-weighted batch whitening with Bessel's
  correction and ``1e-8`` under the square root, GAE advantages whitened over the batch with
  ``returns = raw advantages + values``. This includes verl's choice for a group of one response:
  baseline 0 and std 1, so its advantage is its raw score (plain REINFORCE), not 0.
- Deliberate differences from verl, none of which changes a result verl defines: groups whose
  rewards are all equal get advantages exactly 0 (verl can leave float rounding noise divided by
  ``eps``); whitening a batch with a single real token does not raise; advantages are zero on padding.
- ``group_index`` may be a long tensor or any array of hashables (verl's ``uid`` strings).

Run the tests: ``pytest tests/algorithms/test_estimators.py`` (the ``verl`` marker compares with verl).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from runners.algorithms.components import GPG_RESCALE
from runners.algorithms.types import AdvantageInputs


# -- helpers ---------------------------------------------------------------------------------
def _mask_of(inp: AdvantageInputs) -> Tensor:
    if inp.token_rewards.shape != inp.response_mask.shape or inp.token_rewards.dim() != 2:
        raise ValueError(
            f"token_rewards {tuple(inp.token_rewards.shape)} and response_mask "
            f"{tuple(inp.response_mask.shape)} must both be [B,T]"
        )
    return inp.response_mask.to(torch.float32)


def _scores(inp: AdvantageInputs) -> Tensor:
    """[B] outcome score R_i = sum_t token_rewards[i,t] (verl's convention), float32."""
    return inp.token_rewards.to(torch.float32).sum(-1)


def group_inverse(group_index: Tensor | Sequence[Any] | np.ndarray | None, batch_size: int, device=None) -> Tensor:
    """Map ``group_index`` [B] (tensor or array of hashables) to dense group ids 0..G-1, long [B]."""
    if group_index is None:
        raise ValueError("this estimator compares responses within prompt groups: inp.group_index is required")
    if isinstance(group_index, Tensor):
        ids = group_index.reshape(-1)
        if ids.numel() != batch_size:
            raise ValueError(f"group_index has {ids.numel()} entries for {batch_size} responses")
        _, inverse = torch.unique(ids, return_inverse=True)
        return inverse.to(device) if device is not None else inverse
    array = np.asarray(group_index).reshape(-1)
    if array.size != batch_size:
        raise ValueError(f"group_index has {array.size} entries for {batch_size} responses")
    _, inverse = np.unique(array, return_inverse=True)
    return torch.as_tensor(inverse.reshape(-1), dtype=torch.long, device=device)


class _Groups:
    """Per-response statistics of its prompt group: size, mean, unbiased std, all-equal flag (all [B])."""

    def __init__(self, scores: Tensor, inverse: Tensor) -> None:
        n_groups = int(inverse.max()) + 1 if inverse.numel() else 0
        zeros = scores.new_zeros(n_groups)
        count = zeros.index_add(0, inverse, torch.ones_like(scores))
        mean = zeros.index_add(0, inverse, scores) / count.clamp(min=1)
        sq_dev = zeros.index_add(0, inverse, (scores - mean[inverse]) ** 2)
        std = (sq_dev / (count - 1).clamp(min=1)).sqrt()
        high = zeros.scatter_reduce(0, inverse, scores, reduce="amax", include_self=False)
        low = zeros.scatter_reduce(0, inverse, scores, reduce="amin", include_self=False)
        self.count = count[inverse]
        self.mean = mean[inverse]
        self.std = std[inverse]
        self.singleton = self.count < 2
        self.constant = (high == low)[inverse] & ~self.singleton

    def centered(self, scores: Tensor) -> Tensor:
        """R_i - mean_g R; verl's baseline 0 for singletons; exactly 0 for all-equal groups."""
        centered = torch.where(self.singleton, scores, scores - self.mean)
        return torch.where(self.constant, torch.zeros_like(centered), centered)


def _groups(inp: AdvantageInputs, scores: Tensor) -> _Groups:
    return _Groups(scores, group_inverse(inp.group_index, scores.shape[0], scores.device))


def masked_whiten(values: Tensor, mask: Tensor, *, center: bool = True) -> Tensor:
    """Whiten ``values`` [B,T] with the mean and unbiased std of the entries where ``mask`` is 1.

    Same numbers as verl's ``masked_whiten`` (``1e-8`` in the mean's denominator and under the square
    root), but a single real token gives 0 instead of raising. ``center=False`` divides by the std
    without subtracting the mean (REINFORCE++, arXiv 2501.03262: the mean subtraction is optional).
    """
    n = mask.sum()
    mean = (values * mask).sum() / (n + 1e-8)
    var = (((values - mean) ** 2) * mask).sum() / (n + 1e-8)
    var = var * torch.where(n > 1, n / (n - 1).clamp(min=1e-8), torch.ones_like(n))
    shifted = values - mean if center else values
    return shifted * torch.rsqrt(var + 1e-8)


def _broadcast(per_seq: Tensor, mask: Tensor) -> Tensor:
    return per_seq.unsqueeze(-1) * mask


# -- outcome estimators ----------------------------------------------------------------------
def compute_grpo_advantages(inp: AdvantageInputs, *, std_eps: float = 1e-6, norm_by_std: bool = True):
    """GRPO: ``A_i = (R_i - mean_g R) / (std_g R + std_eps)`` broadcast over the response (arXiv 2402.03300).

    ``norm_by_std=False`` is Dr.GRPO (verl's ``norm_adv_by_std_in_grpo=False``). Returns ``(A, A)``.
    """
    mask = _mask_of(inp)
    scores = _scores(inp)
    groups = _groups(inp, scores)
    adv = groups.centered(scores)
    if norm_by_std:
        std = torch.where(groups.singleton, torch.ones_like(groups.std), groups.std)
        adv = adv / (std + std_eps)
    adv = _broadcast(adv, mask)
    return adv, adv


def compute_drgrpo_advantages(inp: AdvantageInputs):
    """Dr.GRPO: ``A_i = R_i - mean_g R`` (no std); pair with ``seq-mean-token-sum-norm`` aggregation."""
    return compute_grpo_advantages(inp, norm_by_std=False)


def compute_rloo_advantages(inp: AdvantageInputs):
    """RLOO: ``A_i = R_i - mean_{j != i} R_j = G/(G-1) (R_i - mean_g R)``; a singleton keeps R_i (verl)."""
    mask = _mask_of(inp)
    scores = _scores(inp)
    groups = _groups(inp, scores)
    scale = torch.where(groups.singleton, torch.ones_like(groups.count), groups.count / (groups.count - 1).clamp(min=1))
    adv = _broadcast(scale * groups.centered(scores), mask)
    return adv, adv


def compute_loop_advantages(inp: AdvantageInputs):
    """LOOP: RLOO advantages; the PPO clipped loss is the objective's business (arXiv 2502.01600)."""
    return compute_rloo_advantages(inp)


def compute_gpg_advantages(inp: AdvantageInputs, *, rescale: str = "verl", f_norm: float = 1.0):
    """GPG: ``A_i = alpha (R_i - mean_g R) / f_norm`` (arXiv 2504.02546).

    ``rescale`` picks alpha: ``"verl"`` = B / #responses with a non-zero score (verl 0.9.1's
    ``compute_gpg_outcome_advantage``); ``"groups"`` = B / #responses in groups whose rewards are not
    all equal (the GPG paper's B / (B - M), M = responses without gradient signal); ``"none"`` = 1.
    """
    if rescale not in GPG_RESCALE:
        raise ValueError(f"gpg rescale={rescale!r}; valid values: {', '.join(GPG_RESCALE)}")
    if f_norm <= 0:
        raise ValueError(f"gpg f_norm must be > 0, got {f_norm!r}")
    mask = _mask_of(inp)
    scores = _scores(inp)
    groups = _groups(inp, scores)
    batch = float(scores.shape[0])
    if rescale == "verl":
        alpha = batch / torch.count_nonzero(scores).clamp(min=1).to(scores.dtype)
    elif rescale == "groups":
        informative = (~groups.constant & ~groups.singleton).sum()
        alpha = batch / informative.clamp(min=1).to(scores.dtype)
    else:
        alpha = torch.ones((), dtype=scores.dtype, device=scores.device)
    adv = _broadcast(alpha * groups.centered(scores) / f_norm, mask)
    return adv, adv


# -- token estimators ------------------------------------------------------------------------
def _discounted_returns(rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """[B,T] ``G_t = r_t + gamma G_{t+1}`` over real tokens; masked positions pass G through (verl)."""
    returns = torch.zeros_like(rewards)
    running = rewards.new_zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        m = mask[:, t]
        new = rewards[:, t] + gamma * running
        returns[:, t] = new * m
        running = new * m + running * (1 - m)
    return returns


def compute_rfpp_advantages(inp: AdvantageInputs, *, gamma: float = 1.0, center: bool = True):
    """REINFORCE++: token returns ``G_t``, whitened over all real tokens of the batch (global norm).

    Returns ``(whiten(G) * mask, G)`` as verl's ``compute_reinforce_plus_plus_outcome_advantage``.
    """
    mask = _mask_of(inp)
    returns = _discounted_returns(inp.token_rewards.to(torch.float32), mask, gamma)
    adv = masked_whiten(returns, mask, center=center) * mask
    return adv, returns


def compute_rfpp_baseline_advantages(inp: AdvantageInputs):
    """REINFORCE++-baseline: ``R_i - mean_g R`` broadcast over the response, then global whitening."""
    mask = _mask_of(inp)
    scores = _scores(inp)
    groups = _groups(inp, scores)
    adv = masked_whiten(_broadcast(groups.centered(scores), mask), mask) * mask
    return adv, adv


def _gae_scan(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float, bootstrap: Tensor) -> Tensor:
    """[B,T] raw GAE ``A_t = sum_k (gamma lam)^k delta_{t+k}`` with ``V(s_T) = bootstrap`` [B].

    ``delta_t = r_t + gamma V(s_{t+1}) - V(s_t)`` (T-PPO, arXiv 2506.15050, eqs. 2-3); masked positions carry the next
    value and the accumulator through unchanged (verl's ``compute_gae_advantage_return``).
    """
    adv = torch.zeros_like(rewards)
    next_value = bootstrap
    acc = rewards.new_zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        new_acc = delta + gamma * lam * acc
        next_value = values[:, t] * m + (1 - m) * next_value
        acc = new_acc * m + (1 - m) * acc
        adv[:, t] = acc
    return adv * mask


def _critic_inputs(inp: AdvantageInputs, name: str) -> tuple[Tensor, Tensor, Tensor]:
    mask = _mask_of(inp)
    if inp.values is None:
        raise ValueError(f"{name} needs critic values: inp.values [B,T] is None")
    if inp.values.shape != mask.shape:
        raise ValueError(f"{name}: inp.values {tuple(inp.values.shape)} must match response_mask {tuple(mask.shape)}")
    return inp.token_rewards.to(torch.float32), inp.values.to(torch.float32), mask


def compute_gae_advantages(inp: AdvantageInputs, *, gamma: float = 1.0, lam: float = 1.0, whiten: bool = True):
    """GAE (PPO): raw advantages from a reverse scan; ``returns = raw + values``; advantages whitened
    over the batch (verl) unless ``whiten=False``. Terminal value ``V(s_T) = 0``."""
    rewards, values, mask = _critic_inputs(inp, "gae")
    raw = _gae_scan(rewards, values, mask, gamma, lam, rewards.new_zeros(rewards.shape[0]))
    returns = (raw + values) * mask
    adv = masked_whiten(raw, mask) * mask if whiten else raw
    return adv, returns


def last_real_value(values: Tensor, mask: Tensor) -> Tensor:
    """[B] value at each row's last real token (0 for a row without real tokens)."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, torch.full_like(positions, -1)).amax(-1)
    picked = values.gather(1, last.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return torch.where(last >= 0, picked, torch.zeros_like(picked))


def compute_egae_advantages(inp: AdvantageInputs, *, gamma: float = 1.0, lam: float = 0.95, whiten: bool = True):
    """EGAE (T-PPO, T-PPO (arXiv 2506.15050) section 3.1 eq. 6): GAE over the generated window ``s_0 .. s_{l-1}``.

    For unfinished responses (``inp.finished`` False) the not-yet-generated next state takes
    ``V(s_l) = V(s_{l-1})``, the value at the last real token, so with gamma = 1 the last TD term is
    ``r_{l-1}`` (0 without a reward). Finished responses use plain GAE (``V = 0`` after the end).
    Returns and whitening as in :func:`compute_gae_advantages`.
    """
    rewards, values, mask = _critic_inputs(inp, "egae")
    if inp.finished is None:
        raise ValueError("egae needs inp.finished [B] (True where the response ended in this window)")
    finished = inp.finished.reshape(-1).to(device=mask.device, dtype=torch.bool)
    if finished.numel() != mask.shape[0]:
        raise ValueError(f"egae: inp.finished has {finished.numel()} entries for {mask.shape[0]} responses")
    last_value = last_real_value(values, mask)
    bootstrap = torch.where(finished, torch.zeros_like(last_value), last_value)
    raw = _gae_scan(rewards, values, mask, gamma, lam, bootstrap)
    returns = (raw + values) * mask
    adv = masked_whiten(raw, mask) * mask if whiten else raw
    return adv, returns


__all__ = [
    "compute_drgrpo_advantages",
    "compute_egae_advantages",
    "compute_gae_advantages",
    "compute_gpg_advantages",
    "compute_grpo_advantages",
    "compute_loop_advantages",
    "compute_rfpp_advantages",
    "compute_rfpp_baseline_advantages",
    "compute_rloo_advantages",
    "group_inverse",
    "last_real_value",
    "masked_whiten",
]
