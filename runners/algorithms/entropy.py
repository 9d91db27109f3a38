"""Entropy controllers (REPO-R, REPO-D, ADAPO, adaptive entropy bonus) and the Corollary-1 diagnostic.

Design: one small stateful object per method behind one interface (``EntropyController``), so the
trainer does the same five calls whatever the method (Entropy-preserving RL, arXiv 2603.11682, sections 3-5, appendix D.2):

    ctl = ENTROPY_CONTROLLERS.get(name)(**params)
    metrics = ctl.update(batch_entropy)          # once per iteration, see below
    objective_params.update(ctl.objective_overrides())
    adv = ctl.transform_advantages(adv, logp.detach(), response_mask)   # inside the loss
    extra = ctl.loss_term(entropy)               # None, or a [B,T] loss to add before aggregation
    checkpoint["entropy_control"] = ctl.state_dict()

When the controller acts: the paper says only "once per iteration" (appendix D.2 listing) and
"estimate H_init, the policy entropy over experience collected in the first iteration" (section
5.1). Our reading: once per iteration, on the token-mean entropy of the current policy over the
experience collected in that iteration (the training batch), measured BEFORE the policy update on
that batch; the target is that quantity at the first iteration, which can only be pre-update. The coefficient set by ``update(H_k)`` is then used for the update
on batch k (at k = 1, H = target and no rule fires, so zeta0 applies). Feeding an entropy logged
during the previous update (verl's ``actor/entropy``) is a one-iteration-delayed variant.
REPO's advantage transform uses the latest model's detached log-probs (appendix D.2:
``logp = new_logp.detach()``), so call it where the loss is computed, with the current logp.

Run the tests: ``pytest tests/algorithms/test_entropy.py``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from runners.algorithms.numerics import entropy_from_logits
from runners.metric_names import ENTROPY_BONUS_COEF, ENTROPY_EPS_HIGH, ENTROPY_TARGET, ENTROPY_ZETA


def bidirectional_zeta_step(zeta: float, entropy: float, target: float, zeta_min: float, zeta_max: float) -> float:
    """One step of the adaptive bidirectional controller (Entropy-preserving RL, arXiv 2603.11682, appendix D.2 listing).

    Entropy above target: a positive zeta halves and flips to -zeta_min below zeta_min; a negative
    zeta doubles in magnitude up to -zeta_max. Below target: the mirror image. Equal: unchanged.
    """
    if entropy > target:
        if zeta >= 0:
            zeta = zeta / 2.0
            if zeta < zeta_min:
                zeta = -zeta_min
        else:
            zeta = max(-zeta_max, zeta * 2.0)
    elif entropy < target:
        if zeta >= 0:
            zeta = min(zeta_max, zeta * 2.0)
        else:
            zeta = zeta / 2.0
            if zeta > -zeta_min:
                zeta = zeta_min
    return zeta


def _check_entropy(entropy: Any) -> float:
    value = float(entropy)
    if not math.isfinite(value):
        raise ValueError(f"entropy controller update got a non-finite entropy {entropy!r}")
    return value


class EntropyController:
    """Base: no-op controller with a target set by the first ``update`` (or given)."""

    def __init__(self, *, target: float | None = None) -> None:
        self.target = None if target is None else float(target)
        self.num_updates = 0

    def transform_advantages(self, advantages: Tensor, logp: Tensor, response_mask: Tensor) -> Tensor:
        """advantages [B,T], logp [B,T] (detached, current policy), response_mask [B,T] -> [B,T]."""
        return advantages

    def objective_overrides(self) -> dict[str, float]:
        """Objective parameters to override this iteration (e.g. ``clip_ratio_high``)."""
        return {}

    def loss_term(self, entropy: Tensor) -> Tensor | None:
        """Per-token loss [B,T] to add to the objective's loss matrix, or None."""
        return None

    def update(self, entropy: float) -> dict[str, float]:
        """Observe the iteration's training-batch token-mean entropy; return metrics."""
        value = _check_entropy(entropy)
        if self.target is None:
            self.target = value
        self.num_updates += 1
        self._step(value)
        return self.metrics()

    def _step(self, entropy: float) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"target": self.target, "num_updates": self.num_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        expected = set(self.state_dict())
        if set(state) != expected:
            raise ValueError(
                f"{type(self).__name__} state keys {sorted(state)} do not match expected {sorted(expected)}"
            )
        for key, value in state.items():
            setattr(self, key, value)


class NoEntropyControl(EntropyController):
    """No entropy control (identity everywhere, no metrics)."""

    def __init__(self) -> None:
        super().__init__()


class _ZetaController(EntropyController):
    """Shared zeta state and controller of REPO-R / REPO-D (Entropy-preserving RL, arXiv 2603.11682, section 5.1)."""

    def __init__(self, *, zeta0: float, zeta_min: float, zeta_max: float, target: float | None) -> None:
        super().__init__(target=target)
        if not 0 < zeta_min <= zeta_max:
            raise ValueError(f"need 0 < zeta_min <= zeta_max, got zeta_min={zeta_min}, zeta_max={zeta_max}")
        if not zeta_min <= abs(zeta0) <= zeta_max:
            raise ValueError(f"|zeta0|={abs(zeta0)} must lie in [zeta_min, zeta_max] = [{zeta_min}, {zeta_max}]")
        self.zeta, self.zeta_min, self.zeta_max = float(zeta0), float(zeta_min), float(zeta_max)

    def _step(self, entropy: float) -> None:
        self.zeta = bidirectional_zeta_step(self.zeta, entropy, self.target, self.zeta_min, self.zeta_max)

    def metrics(self) -> dict[str, float]:
        return {ENTROPY_ZETA: self.zeta, ENTROPY_TARGET: self.target}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "zeta": self.zeta}


class RepoRController(_ZetaController):
    """REPO-R (Entropy-preserving RL, arXiv 2603.11682, appendix D.2): per token, logp detached,
    A > 0: max(0, A (1 - zeta logp)); A < 0: min(0, A (1 + zeta logp)); A = 0 unchanged.
    |zeta| in [1e-4, 0.05], zeta0 = 1e-3."""

    def __init__(
        self, *, zeta0: float = 1e-3, zeta_min: float = 1e-4, zeta_max: float = 0.05, target: float | None = None
    ) -> None:
        super().__init__(zeta0=zeta0, zeta_min=zeta_min, zeta_max=zeta_max, target=target)

    def transform_advantages(self, advantages: Tensor, logp: Tensor, response_mask: Tensor) -> Tensor:
        logp = logp.detach()
        up = (advantages * (1 - self.zeta * logp)).clamp(min=0.0)
        down = (advantages * (1 + self.zeta * logp)).clamp(max=0.0)
        out = torch.where(advantages > 0, up, torch.where(advantages < 0, down, advantages))
        return torch.where(response_mask.bool(), out, advantages)


class RepoDController(_ZetaController):
    """REPO-D (Entropy-preserving RL, arXiv 2603.11682, section 5.1): A - zeta logp (logp detached, the
    raw log-prob standing in for the centred L as in appendix D.2); |zeta| in [1e-3, 10]."""

    def __init__(
        self, *, zeta0: float = 1e-3, zeta_min: float = 1e-3, zeta_max: float = 10.0, target: float | None = None
    ) -> None:
        super().__init__(zeta0=zeta0, zeta_min=zeta_min, zeta_max=zeta_max, target=target)

    def transform_advantages(self, advantages: Tensor, logp: Tensor, response_mask: Tensor) -> Tensor:
        out = advantages - self.zeta * logp.detach()
        return torch.where(response_mask.bool(), out, advantages)


class AdapoController(EntropyController):
    """ADAPO (Entropy-preserving RL, arXiv 2603.11682, section 5.2): eps_low fixed 0.2, eps_high from 0.28 within [0.2, 0.32];
    each iteration H < H_init: eps_high *= 1.05 (capped), H > H_init: eps_high *= 0.95 (floored)."""

    def __init__(
        self,
        *,
        eps_low: float = 0.2,
        eps_high: float = 0.28,
        eps_high_min: float = 0.2,
        eps_high_max: float = 0.32,
        increase: float = 1.05,
        decrease: float = 0.95,
        target: float | None = None,
    ) -> None:
        super().__init__(target=target)
        if not eps_high_min <= eps_high <= eps_high_max:
            raise ValueError(
                f"eps_high={eps_high} must lie in [eps_high_min, eps_high_max] = [{eps_high_min}, {eps_high_max}]"
            )
        if not (increase > 1 and 0 < decrease < 1):
            raise ValueError(f"need increase > 1 and 0 < decrease < 1, got increase={increase}, decrease={decrease}")
        self.eps_low, self.eps_high = float(eps_low), float(eps_high)
        self.eps_high_min, self.eps_high_max = float(eps_high_min), float(eps_high_max)
        self.increase, self.decrease = float(increase), float(decrease)

    def _step(self, entropy: float) -> None:
        if entropy < self.target:
            self.eps_high = min(self.increase * self.eps_high, self.eps_high_max)
        elif entropy > self.target:
            self.eps_high = max(self.decrease * self.eps_high, self.eps_high_min)

    def objective_overrides(self) -> dict[str, float]:
        return {"clip_ratio_low": self.eps_low, "clip_ratio_high": self.eps_high}

    def metrics(self) -> dict[str, float]:
        return {ENTROPY_EPS_HIGH: self.eps_high, ENTROPY_TARGET: self.target}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "eps_high": self.eps_high}


class EntropyBonusController(EntropyController):
    """Entropy bonus J + beta H with an adaptive beta (loss term -beta H per token).

    Source: Entropy-preserving RL (arXiv 2603.11682) appendix C.3, "Entropy bonus baseline is implemented on top of GRPO with the
    adaptive coefficient described in section 5.1", i.e. beta follows the bidirectional controller
    of zeta (``bidirectional_zeta_step``), target = first-iteration entropy. The paper gives no
    bounds for beta; defaults are REPO-D's [1e-3, 10] and beta0 = 1e-3 because REPO-D is exactly
    this bonus with beta = zeta (appendix A.7). ``adaptive=False`` keeps beta fixed (plain bonus).
    """

    def __init__(
        self,
        *,
        beta0: float = 1e-3,
        beta_min: float = 1e-3,
        beta_max: float = 10.0,
        adaptive: bool = True,
        target: float | None = None,
    ) -> None:
        super().__init__(target=target)
        if adaptive and not (0 < beta_min <= abs(beta0) <= beta_max):
            raise ValueError(f"need 0 < beta_min <= |beta0| <= beta_max, got {beta_min}, {beta0}, {beta_max}")
        self.beta, self.beta_min, self.beta_max = float(beta0), float(beta_min), float(beta_max)
        self.adaptive = bool(adaptive)

    def _step(self, entropy: float) -> None:
        if self.adaptive:
            self.beta = bidirectional_zeta_step(self.beta, entropy, self.target, self.beta_min, self.beta_max)

    def loss_term(self, entropy: Tensor) -> Tensor:
        """entropy [B,T] differentiable -> -beta H [B,T] (loss to add; maximises beta H)."""
        return -self.beta * entropy

    def metrics(self) -> dict[str, float]:
        return {ENTROPY_BONUS_COEF: self.beta, ENTROPY_TARGET: self.target}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "beta": self.beta}


@torch.no_grad()
def entropy_covariance(
    logp: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    logits: Tensor | None = None,
    *,
    prob_weighted: bool = True,
) -> Tensor:
    """Corollary-1 diagnostic (Entropy-preserving RL, arXiv 2603.11682, section 3): C = E_{a~pi}[pi(a|s) A(s,a) L(s,a)], scalar.

    logp [B,T] log-prob of the sampled tokens, advantages [B,T], response_mask [B,T], optional
    logits [B,T,V] of the same policy. L = logp - E_a[log pi(.|s)]: with ``logits`` the exact per-state
    centring E_a[log pi] = -H(s); without, the batch estimate (masked token mean of logp). A is centred
    by its masked batch mean. The estimate is the token mean over the batch of
    pi(a_t|s_t) (A_t - mean A) L_t. A vanilla policy-gradient step of size alpha on a tabular softmax
    changes the entropy by about -alpha C (Corollary 2); with ``prob_weighted=False`` C is the plain
    covariance Cov(A, L), the first-order change of a natural-gradient step. C > 0: entropy falls.
    """
    mask = response_mask.to(logp.dtype)
    count = mask.sum().clamp(min=1)
    if logits is not None:
        centre = -entropy_from_logits(logits.double() if logp.dtype == torch.float64 else logits).to(logp.dtype)
    else:
        centre = (logp * mask).sum() / count
    centred_logp = logp - centre
    centred_adv = advantages - (advantages * mask).sum() / count
    terms = centred_adv * centred_logp
    if prob_weighted:
        terms = terms * logp.exp()
    return (terms * mask).sum() / count


__all__ = [
    "AdapoController",
    "EntropyBonusController",
    "EntropyController",
    "NoEntropyControl",
    "RepoDController",
    "RepoRController",
    "bidirectional_zeta_step",
    "entropy_covariance",
]
