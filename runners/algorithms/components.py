"""Config dataclasses of the algorithm components, with the checks each field must pass.

Each class types the config node of one or more registry entries (``Registry.register(...,
schema=...)`` in ``runners.algorithms``): Hydra rejects unknown keys and wrong types at compose time,
and ``runners.config.validate`` applies the checks declared here, naming the offending key::

    config key 'objective.eps': must be > 0 (got -0.1)

A field's own checks are ``checked(default, CHECK, ...)`` metadata; rules that relate fields are a
``cross_checks(node)`` classmethod yielding ``(field, ok, message)``. Fields other than ``name`` are the
keyword arguments of the registered function, except the entry's ``trainer_keys``. A schema written on
the registry line as ``{field: (type, default, *checks)}`` becomes a dataclass through
``component_dataclass`` (the algorithm registries' ``schema_builder``).

These are the algorithm library's own facts (its functions check their arguments with them:
``runners.checks.check_arguments``); the config layer (``runners.config.schema``, ``validate``) reads
them from here, never the other way round.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, make_dataclass
from typing import Any, Optional

from omegaconf import MISSING

from runners.checks import (  # noqa: F401  (the checks' home; re-exported for the schemas and validate)
    BELOW_ONE,
    DUAL_CLIP,
    GREATER_THAN_ONE,
    NON_NEGATIVE,
    OPEN_UNIT,
    OPEN_UNIT_OR_ONE,
    POSITIVE,
    UNIT,
    Check,
    at_least,
    one_of,
)


def checked(default: Any, *checks: Check) -> Any:
    """A dataclass field with ``default`` and the checks ``runners.config.validate`` applies."""
    return field(default=default, metadata={"checks": checks})


def component_dataclass(name: str, fields: Mapping[str, tuple]) -> type:
    """A component's config dataclass from ``{field: (type, default, *checks)}`` (a registry line's schema)."""
    spec = [(key, typ, checked(default, *checks)) for key, (typ, default, *checks) in fields.items()]
    return make_dataclass(name.title().replace("_", ""), spec, bases=(NamedComponent,))


def field_checks(schema: type) -> Iterator[tuple[str, Check]]:
    """(field name, check) of every declared field check of ``schema``."""
    for f in getattr(schema, "__dataclass_fields__", {}).values():
        for check in f.metadata.get("checks", ()):
            yield f.name, check


# ----------------------------------------------------------------------------------------------
@dataclass
class NamedComponent:
    # registry name of the component (runners.algorithms registries)
    name: str = MISSING


# -- estimators (runners/algorithms/estimators.py) ---------------------------------------------
@dataclass
class GrpoEstimator(NamedComponent):
    # added to the group std before dividing
    std_eps: float = checked(1e-6, POSITIVE)
    # divide by the group std (False gives Dr.GRPO's advantage)
    norm_by_std: bool = True


@dataclass
class RfppEstimator(NamedComponent):
    # discount factor of token returns
    gamma: float = checked(1.0, UNIT, POSITIVE)
    # subtract the batch mean before the global std normalisation
    center: bool = True


# GPG's advantage rescaling alpha (runners.algorithms.estimators.compute_gpg_advantages): "verl" = B / responses
# with a non-zero score (verl 0.9.1); "groups" = B / responses in groups whose rewards differ (the GPG paper's
# B / (B - M), arXiv 2504.02546); "none" = 1
GPG_RESCALE = ("verl", "groups", "none")


@dataclass
class GpgEstimator(NamedComponent):
    # rescaling of the advantage: a GPG_RESCALE value
    rescale: str = checked("verl", one_of(*GPG_RESCALE))
    # GPG's normalisation constant f_norm
    f_norm: float = checked(1.0, POSITIVE)


@dataclass
class GaeEstimator(NamedComponent):
    # discount factor
    gamma: float = checked(1.0, UNIT, POSITIVE)
    # GAE lambda (bias-variance trade-off)
    lam: float = checked(1.0, UNIT)
    # whiten advantages over the batch (verl's GAE does)
    whiten: bool = True


@dataclass
class EgaeEstimator(GaeEstimator):
    # GAE lambda of the truncated-rollout estimator (T-PPO, arXiv 2506.15050: 0.95)
    lam: float = checked(0.95, UNIT)


# -- objectives (runners/algorithms/objectives.py, troll.py, gtpo.py) --------------------------
@dataclass
class ClipObjective(NamedComponent):
    # lower clip range: ratio >= 1 - clip_ratio_low
    clip_ratio_low: float = checked(0.2, POSITIVE, BELOW_ONE)
    # upper clip range: ratio <= 1 + clip_ratio_high (DAPO: 0.28)
    clip_ratio_high: float = checked(0.2, POSITIVE)
    # dual-clip bound c > 1 for negative advantages (None = off)
    clip_ratio_c: Optional[float] = checked(None, DUAL_CLIP)


@dataclass
class GspoObjective(NamedComponent):
    # sequence-ratio clip ranges (GSPO: 3e-4 / 4e-4)
    clip_ratio_low: float = checked(3e-4, POSITIVE, BELOW_ONE)
    clip_ratio_high: float = checked(4e-4, POSITIVE)


@dataclass
class BapoObjective(NamedComponent):
    # target share of the loss from positive-advantage tokens (BAPO rho_0)
    rho: float = checked(0.5, OPEN_UNIT)
    # lower ratio bound: start value and upper limit of its search
    ratio_low_start: float = 0.6
    ratio_low_max: float = 0.9
    # upper ratio bound: start value and upper limit of its search
    ratio_high_start: float = 1.2
    ratio_high_max: float = 3.0
    # search steps of the two bounds
    ratio_low_step: float = checked(0.05, POSITIVE)
    ratio_high_step: float = checked(0.05, POSITIVE)
    # "paper" (BAPO Algorithm 1) | "recipe" (the authors' training recipe)
    rule: str = checked("paper", one_of("paper", "recipe"))
    # optional dual-clip bound for negative advantages
    clip_ratio_c: Optional[float] = checked(None, DUAL_CLIP)


@dataclass
class TrollObjective(NamedComponent):
    # trust-region radius: KL(q_new || q_old) <= eps per token (TROLL, arXiv 2510.03817: 0.05)
    eps: float = checked(0.05, POSITIVE)
    # weight of the regression term KL(q_new || stopgrad(q_proj)) (eq. 5)
    alpha: float = checked(1.0, NON_NEGATIVE)
    # GSPO variant: sequence geometric mean of the projected ratios
    sequence: bool = False
    # sparse storage of the old distribution: at most top_k kept tokens per position (section 3.2)
    top_k: int = checked(64, at_least(1))
    # kept tokens cover probability mass 1 - tail_mass (the paper's delta)
    tail_mass: float = checked(1e-5, OPEN_UNIT)
    # default probability of tokens outside the kept set
    p_default: float = checked(1e-12, Check(lambda v: 0 < v < 1e-3, "must be in (0, 1e-3)"))
    # tokens per chunk when sparsifying / projecting
    chunk_size: int = checked(1024, at_least(1))
    # dual solver (Listing 3): interior points per bracketing step, max steps, stop width
    num_points: int = checked(8, at_least(2))
    max_steps: int = checked(20, at_least(1))
    tol: float = checked(1e-5, POSITIVE)
    # search range of the dual variable eta
    eta_min: float = checked(1e-7, POSITIVE)
    eta_max: float = 100.0


@dataclass
class GtpoObjective(NamedComponent):
    # entropy coefficient gamma of eq. 7
    gamma: float = checked(0.1, NON_NEGATIVE)
    # how forward and backward conflict weights combine: "or" (paper) | "product" (authors' code)
    combine: str = checked("or", one_of("or", "product"))
    # "penalty" (eq. 7, paper) | "advantage_shift" (authors' code)
    entropy_term: str = checked("penalty", one_of("penalty", "advantage_shift"))
    # entropy filter threshold (ln 2) on a response's mean token entropy
    entropy_threshold: float = checked(0.6931471805599453, POSITIVE)
    # weight of positive-advantage tokens on a conflict span (negative ones get 0)
    conflict_weight: float = checked(2.0, POSITIVE)
    # prompts used to measure the initial model's entropy H_ini for the entropy filter
    h_ini_prompts: int = checked(100, at_least(1))


# -- sequence masks (runners/algorithms/trm.py) ---------------------------------------------------
# thresholds are inclusive (keep iff score <= threshold; spec section 4): 0 keeps divergence-free sequences only
@dataclass
class TrmMaxMask(NamedComponent):
    # max token KL threshold (TRM-Max: 0.05)
    delta: float = checked(0.05, NON_NEGATIVE)


@dataclass
class TrmAvgMask(NamedComponent):
    # mean token KL threshold (TRM-Avg: 0.001)
    delta_avg: float = checked(0.001, NON_NEGATIVE)


@dataclass
class TrmMaxAvgMask(NamedComponent):
    # both criteria (Max&Avg: 0.1 and 0.002)
    delta: float = checked(0.1, NON_NEGATIVE)
    delta_avg: float = checked(0.002, NON_NEGATIVE)


# the exact-KL masks read the stored sparse rollout distribution: its size, as TROLL's (must agree
# with the objective's when both store it)
@dataclass
class TrmMaxExactMask(TrmMaxMask):
    # kept tokens per position of the stored distribution
    top_k: int = checked(64, at_least(1))
    # kept tokens cover probability mass 1 - tail_mass
    tail_mass: float = checked(1e-5, OPEN_UNIT)


@dataclass
class TrmAvgExactMask(TrmAvgMask):
    top_k: int = checked(64, at_least(1))
    tail_mass: float = checked(1e-5, OPEN_UNIT)


@dataclass
class TrmMaxAvgExactMask(TrmMaxAvgMask):
    top_k: int = checked(64, at_least(1))
    tail_mass: float = checked(1e-5, OPEN_UNIT)


@dataclass
class LnTrmMask(NamedComponent):
    # per-token divergence scale of the weights w_t
    delta: float = checked(1e-4, POSITIVE)
    # threshold on the normalised weighted deviation
    delta_w: float = checked(0.05, NON_NEGATIVE)


@dataclass
class SerMask(NamedComponent):
    # threshold on the mean |r - 1| of a sequence (0.03 .. 0.10)
    delta_ser: float = checked(0.05, NON_NEGATIVE)


# -- entropy control (runners/algorithms/entropy.py) ---------------------------------------------
@dataclass
class RepoControl(NamedComponent):
    # initial zeta
    zeta0: float = 1e-3
    # |zeta| bounds of the bidirectional controller (REPO-R [1e-4, 0.05], REPO-D [1e-3, 10])
    zeta_min: float = checked(1e-4, POSITIVE)
    zeta_max: float = checked(0.05, POSITIVE)
    # target entropy; None = the first iteration's entropy
    target: Optional[float] = None


@dataclass
class RepoDControl(RepoControl):
    # REPO-D's |zeta| bounds [1e-3, 10]
    zeta_min: float = checked(1e-3, POSITIVE)
    zeta_max: float = checked(10.0, POSITIVE)


@dataclass
class AdapoControl(NamedComponent):
    # fixed lower clip range
    eps_low: float = checked(0.2, OPEN_UNIT)
    # initial upper clip range and its bounds
    eps_high: float = 0.28
    eps_high_min: float = 0.2
    eps_high_max: float = 0.32
    # multiplicative steps when entropy is below / above the target
    increase: float = checked(1.05, Check(lambda v: v > 1, "must be > 1"))
    decrease: float = checked(0.95, OPEN_UNIT)
    # target entropy; None = the first iteration's entropy
    target: Optional[float] = None


@dataclass
class BonusControl(NamedComponent):
    # initial entropy-bonus coefficient beta and its bounds
    beta0: float = checked(1e-3, NON_NEGATIVE)
    beta_min: float = 1e-3
    beta_max: float = 10.0
    # adapt beta towards the target entropy
    adaptive: bool = True
    # target entropy; None = the first iteration's entropy
    target: Optional[float] = None


# -- loss aggregation --------------------------------------------------------------------------
@dataclass
class LossAggConfig(NamedComponent):
    # constant divisor of seq-mean-token-sum-norm (None: rollout.max_response_length)
    norm_len: Optional[int] = checked(None, Check(lambda v: v is None or v >= 1, "must be >= 1 (or null)"))


# -- cross-field rules -------------------------------------------------------------------------
def _bapo_cross(node) -> Iterator[tuple[str, bool, str]]:
    yield (
        "ratio_low_start",
        0 < node.ratio_low_start <= node.ratio_low_max < 1,
        ("needs 0 < ratio_low_start <= ratio_low_max < 1"),
    )
    yield (
        "ratio_high_start",
        1 < node.ratio_high_start <= node.ratio_high_max,
        ("needs 1 < ratio_high_start <= ratio_high_max"),
    )


def _troll_cross(node) -> Iterator[tuple[str, bool, str]]:
    yield "eta_max", node.eta_max > node.eta_min, "must be > objective.eta_min"


def _repo_cross(node) -> Iterator[tuple[str, bool, str]]:
    yield "zeta_max", node.zeta_max >= node.zeta_min, "must be >= entropy_control.zeta_min"
    yield "zeta0", node.zeta_min <= abs(node.zeta0) <= node.zeta_max, "|zeta0| must lie in [zeta_min, zeta_max]"


def _adapo_cross(node) -> Iterator[tuple[str, bool, str]]:
    yield (
        "eps_high",
        node.eps_high_min <= node.eps_high <= node.eps_high_max,
        "must lie in [eps_high_min, eps_high_max]",
    )


def _bonus_cross(node) -> Iterator[tuple[str, bool, str]]:
    yield "beta_max", node.beta_max >= node.beta_min >= 0, "needs 0 <= beta_min <= beta_max"
    # the adaptive controller moves |beta| inside [beta_min, beta_max] (runners.algorithms.entropy)
    yield (
        "beta0",
        not node.adaptive or 0 < node.beta_min <= abs(node.beta0) <= node.beta_max,
        "adaptive needs 0 < beta_min <= |beta0| <= beta_max",
    )


for _cls, _rule in (
    (BapoObjective, _bapo_cross),
    (TrollObjective, _troll_cross),
    (RepoControl, _repo_cross),
    (RepoDControl, _repo_cross),
    (AdapoControl, _adapo_cross),
    (BonusControl, _bonus_cross),
):
    _cls.cross_checks = staticmethod(_rule)
