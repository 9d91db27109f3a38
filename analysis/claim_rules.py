"""What a paper's claim is made of: its checks, the rule each check is judged by, and the registry of claims.

A ``Claim`` quotes its paper and names the function that turns a sweep's runs into ``CheckResult``s: a
per-seed statistic with the ``Rule`` (the direction the paper claims, against a null) it is judged by.
``CheckResult.evaluate`` gives a check its verdict and ``register_claim`` adds a claim to ``CLAIMS``; the
verdicts and how a claim's checks add up to its verdict are described in ``analysis.claims``, which looks
claims up and runs them. The papers' claims (``analysis.claim_checks``) are built from this module alone,
so they never import the module that imports them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from analysis.frames import ExperimentData
from analysis.stats import MeanCI, seeds_needed, t_interval

SUPPORTED, CONTRADICTED, UNDERPOWERED, NOT_EVIDENCE, NOT_CHECKED = (
    "supported",
    "contradicted",
    "underpowered",
    "not evidence",
    "not checked",
)
VERDICTS = (SUPPORTED, CONTRADICTED, UNDERPOWERED, NOT_EVIDENCE, NOT_CHECKED)
N_MAX = 1000  # seeds_needed's search limit, printed as "> 1000"


@dataclass(frozen=True)
class Rule:
    """The direction a paper claims for a statistic, against a null (``analysis.claims``' module docstring)."""

    kind: str  # greater | less
    null: float

    def __post_init__(self) -> None:
        if self.kind not in ("greater", "less"):
            raise ValueError(f"rule kind must be greater or less, got {self.kind!r}")

    def verdict(self, ci: MeanCI) -> str:
        if not ci.has_interval:
            return UNDERPOWERED
        above, below = ci.lo > self.null, ci.hi < self.null
        if self.kind == "greater":
            return SUPPORTED if above else (CONTRADICTED if below else UNDERPOWERED)
        return SUPPORTED if below else (CONTRADICTED if above else UNDERPOWERED)

    def describe(self) -> str:
        c = f"{self.null:g}"
        sign, other = (">", "<") if self.kind == "greater" else ("<", ">")
        return f"supported: CI {sign} {c}; contradicted: CI {other} {c}"


def seeds_for(ci: MeanCI, null: float, log: bool = False) -> int | None:
    """Seeds a paired t-test needs (alpha 0.05, power 0.8) to tell the observed mean from ``null``
    (on the log scale for ratios); None above ``N_MAX`` or without an spread estimate."""
    if ci.n < 2 or not np.isfinite(ci.std):
        return None
    delta = np.log(ci.mean) - np.log(null) if log else ci.mean - null
    return seeds_needed(abs(float(delta)), float(ci.std), n_max=N_MAX)


@dataclass
class CheckResult:
    part: str  # what is checked, in words
    runs: str  # which runs, e.g. "GRPO+TROLL" or "GTPO − GRPO"
    statistic: str  # the per-seed statistic, in words
    values: dict[int, float] = field(default_factory=dict)
    rule: Rule | None = None
    log: bool = False  # interval on log values, shown as ratios
    counts: bool = True  # False: shown, not part of the claim's verdict
    lower_bounds: bool = False  # some values are only lower bounds: a "less" claim cannot be supported on them
    note: str = ""
    # a check on one method's own numbers: the same statistic on the baseline, under the same rule
    baseline_runs: str = ""
    baseline_values: dict[int, float] | None = None
    interval: bool = True  # False: values are per-seed flags, shown in the statistic, no interval
    verdict: str = NOT_CHECKED
    needs: int | None = None  # underpowered: the seeds needed (None: more than N_MAX, or unknown)
    identical: bool = False  # underpowered: every seed gives exactly the null (e.g. two arms ran the same updates)
    ci: MeanCI | None = None
    baseline_ci: MeanCI | None = None
    baseline_verdict: str = ""

    def _interval(self, values: Mapping[int, float]) -> MeanCI:
        x = np.array(list(values.values()), dtype=float)
        if not self.log:
            return t_interval(x)
        ci = t_interval(np.log(x[x > 0]))
        return MeanCI(*(float(np.exp(v)) for v in (ci.mean, ci.lo, ci.hi)), ci.n, ci.std, ci.level)

    def evaluate(self) -> CheckResult:
        if self.rule is None:  # shown, not judged: the verdict its maker set
            if self.values:
                self.ci = self._interval(self.values) if self.interval else None
            else:
                self.verdict = NOT_CHECKED
            return self
        if not self.values:
            self.verdict = NOT_CHECKED
            return self
        self.ci = self._interval(self.values)
        self.verdict = self.rule.verdict(self.ci)
        if self.lower_bounds and self.verdict == SUPPORTED and self.rule.kind == "less":
            self.verdict = UNDERPOWERED
        if self.verdict == UNDERPOWERED:
            self.needs = seeds_for(self.ci, self.rule.null, self.log)
            self.identical = self.ci.n >= 2 and self.ci.std == 0 and self.ci.mean == self.rule.null
        if self.baseline_values:
            self.baseline_ci = self._interval(self.baseline_values)
            self.baseline_verdict = self.rule.verdict(self.baseline_ci)
            if self.baseline_verdict == SUPPORTED and self.verdict == SUPPORTED:
                self.verdict = NOT_EVIDENCE
        return self

    @property
    def verdict_text(self) -> str:
        if self.identical:
            return f"{UNDERPOWERED} (exactly {self.rule.null:g} on every seed: no seed count decides)"
        return verdict_text(self.verdict, self.needs, self.ci.n if self.ci is not None else 0)


def verdict_text(verdict: str, needs: int | None, have: int) -> str:
    """'underpowered (needs 9 seeds)', '(needs > 1000 seeds)', '(1 seed: needs at least 2)'; others as they are."""
    if verdict != UNDERPOWERED:
        return verdict
    if have < 2:
        return f"{UNDERPOWERED} ({have} seed{'s' if have != 1 else ''}: needs at least 2)"
    return f"{UNDERPOWERED} (needs {'> ' + str(N_MAX) if needs is None else needs} seeds)"


def not_checked(part: str, reason: str, runs: str = "–", counts: bool = True) -> CheckResult:
    return CheckResult(part, runs, "–", note=reason, counts=counts)


@dataclass(frozen=True)
class Claim:
    key: str
    title: str
    paper: str  # arXiv id and section or figure
    statement: str  # the paper's claim, quoted or closely paraphrased
    check: Callable[[ExperimentData, Mapping], list[CheckResult]]
    options: Mapping = field(default_factory=dict)


CLAIMS: dict[str, Claim] = {}


def register_claim(claim: Claim) -> Claim:
    if claim.key in CLAIMS:
        raise ValueError(f"claim {claim.key!r} is already registered")
    CLAIMS[claim.key] = claim
    return claim
