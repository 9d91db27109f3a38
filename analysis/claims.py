"""The papers' claims, checked on a sweep's runs: a statistic per seed, its 95% t interval, a verdict.

Each claim is a few *checks*. A check reduces every seed to one number (for a comparison, the
difference of two methods on the same seed), takes the t interval over seeds (``analysis.stats``)
and applies its ``Rule``:

- ``greater`` (the claim says statistic > null): pass if the interval lies above the null; fail if it
  lies below, or inside null +- margin (the claimed effect is absent, with a tight interval);
  otherwise inconclusive. ``less`` mirrors it.
- ``within`` (statistic stays within null +- margin): pass if the interval lies inside the band;
  fail if it lies outside it; otherwise inconclusive.
- ``differs`` (statistic != null): pass if the interval excludes the null; fail if it lies inside
  null +- margin; otherwise inconclusive.
- fewer than two seeds: no interval, inconclusive.

A claim passes when every counted check passes, fails when one fails, and is inconclusive otherwise
(a check that cannot run, e.g. a metric not logged, makes it inconclusive and says why); a claim
with no run to check is "not checked". The claims themselves are in ``analysis.claim_checks``.

    from analysis.claims import check_claims
    for outcome in check_claims(data, ["troll_kl_bound", "tppo_time"]):
        print(outcome.claim.title, outcome.verdict)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from analysis.frames import ExperimentData
from analysis.stats import MeanCI, t_interval

PASS, FAIL, INCONCLUSIVE, NOT_CHECKED = "pass", "fail", "inconclusive", "not checked"


@dataclass(frozen=True)
class Rule:
    """How a statistic's interval becomes a verdict (module docstring)."""

    kind: str  # greater | less | within | differs
    null: float
    margin: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in ("greater", "less", "within", "differs"):
            raise ValueError(f"rule kind must be greater, less, within or differs, got {self.kind!r}")
        if self.margin < 0 or (self.kind == "within" and self.margin == 0):
            raise ValueError(f"bad margin {self.margin} for a {self.kind} rule")

    def _band(self, lo: float, hi: float) -> bool:
        return self.margin > 0 and self.null - self.margin <= lo and hi <= self.null + self.margin

    def verdict(self, ci: MeanCI) -> str:
        if not ci.has_interval:
            return INCONCLUSIVE
        lo, hi, c, m = ci.lo, ci.hi, self.null, self.margin
        if self.kind == "greater":
            return PASS if lo > c else (FAIL if hi < c or self._band(lo, hi) else INCONCLUSIVE)
        if self.kind == "less":
            return PASS if hi < c else (FAIL if lo > c or self._band(lo, hi) else INCONCLUSIVE)
        if self.kind == "within":
            return PASS if self._band(lo, hi) else (FAIL if hi < c - m or lo > c + m else INCONCLUSIVE)
        return PASS if lo > c or hi < c else (FAIL if self._band(lo, hi) else INCONCLUSIVE)

    def describe(self) -> str:
        c, m = f"{self.null:g}", f"{self.margin:g}"
        band = f"inside {c} ± {m}"
        if self.kind == "greater":
            absent = f" or {band}" if self.margin else ""
            return f"pass: CI > {c}; fail: CI < {c}{absent}"
        if self.kind == "less":
            absent = f" or {band}" if self.margin else ""
            return f"pass: CI < {c}; fail: CI > {c}{absent}"
        if self.kind == "within":
            return f"pass: CI {band}; fail: CI outside {c} ± {m}"
        return f"pass: CI excludes {c}; fail: CI {band}" if self.margin else f"pass: CI excludes {c}"


@dataclass
class CheckResult:
    part: str  # what is checked, in words
    runs: str  # which runs, e.g. "GRPO+TROLL" or "GTPO − GRPO"
    statistic: str  # the per-seed statistic, in words
    values: dict[int, float] = field(default_factory=dict)
    rule: Rule | None = None
    log: bool = False  # interval on log values, shown as ratios
    counts: bool = True  # False: shown, not part of the claim's verdict
    lower_bounds: bool = False  # some values are only lower bounds: a "less" claim cannot pass on them
    note: str = ""
    verdict: str = NOT_CHECKED
    ci: MeanCI | None = None

    def evaluate(self) -> CheckResult:
        if self.rule is None or not self.values:
            self.verdict = NOT_CHECKED
            return self
        x = np.array(list(self.values.values()), dtype=float)
        if self.log:
            ci = t_interval(np.log(x[x > 0]))
            self.ci = MeanCI(*(float(np.exp(v)) for v in (ci.mean, ci.lo, ci.hi)), ci.n, ci.std, ci.level)
        else:
            self.ci = t_interval(x)
        self.verdict = self.rule.verdict(self.ci)
        if self.lower_bounds and self.verdict == PASS and self.rule.kind == "less":
            self.verdict = INCONCLUSIVE
        return self


def not_checked(part: str, reason: str, runs: str = "–", counts: bool = True) -> CheckResult:
    return CheckResult(part, runs, "–", note=reason, counts=counts)


@dataclass(frozen=True)
class Claim:
    key: str
    title: str
    paper: str  # arXiv id and section
    statement: str
    check: Callable[[ExperimentData, Mapping], list[CheckResult]]
    options: Mapping = field(default_factory=dict)


@dataclass
class ClaimOutcome:
    claim: Claim
    checks: list[CheckResult]

    @property
    def verdict(self) -> str:
        counted = [c.verdict for c in self.checks if c.counts]
        if not counted or all(v == NOT_CHECKED for v in counted):
            return NOT_CHECKED
        if FAIL in counted:
            return FAIL
        return PASS if all(v == PASS for v in counted) else INCONCLUSIVE


CLAIMS: dict[str, Claim] = {}


def register_claim(claim: Claim) -> Claim:
    if claim.key in CLAIMS:
        raise ValueError(f"claim {claim.key!r} is already registered")
    CLAIMS[claim.key] = claim
    return claim


def claim_keys() -> list[str]:
    """Keys of every registered claim (the papers' claims of ``analysis.claim_checks`` included)."""
    import analysis.claim_checks  # noqa: F401

    return sorted(CLAIMS)


def get_claim(key: str) -> Claim:
    import analysis.claim_checks  # noqa: F401  (registers the papers' claims)

    if key not in CLAIMS:
        raise KeyError(f"unknown claim {key!r}; valid: {', '.join(sorted(CLAIMS))}")
    return CLAIMS[key]


def check_claims(
    data: ExperimentData, keys: list[str], options: Mapping[str, Mapping] | None = None
) -> list[ClaimOutcome]:
    """Evaluate the claims ``keys`` on ``data`` (``options``: per-claim overrides of its defaults)."""
    outcomes = []
    for key in keys:
        claim = get_claim(key)
        opts = {**claim.options, **((options or {}).get(key, {}))}
        checks = [c.evaluate() for c in claim.check(data, opts)]
        outcomes.append(ClaimOutcome(claim, checks))
    return outcomes
