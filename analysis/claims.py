"""The papers' claims, checked on a sweep's runs: a statistic per seed, its 95% t interval, a verdict.

Each claim quotes its paper (arXiv id, section or figure) and is a few *checks*. A check reduces every
seed to one number with the paper's own metric (for a comparison, the difference of two methods on the
same seed), takes the t interval over seeds (``analysis.stats``) and applies its ``Rule``, which states
only the direction the paper claims (``greater`` or ``less`` than a null taken from the paper: 0 for a
difference, the paper's own figure for a ratio). No tolerance band is invented:

- ``supported``: the interval lies on the claimed side of the null;
- ``contradicted``: it lies on the other side;
- ``underpowered``: it contains the null, or there are fewer than two seeds. The verdict says how many
  seeds a paired t-test at alpha = 0.05 needs for 80% power if the true effect were the one observed
  (``analysis.stats.seeds_needed``): "underpowered (needs 9 seeds)"; "> 1000" when the observed effect
  is negligible beside the seed-to-seed spread;
- ``not evidence``: a check on one method's own numbers (not a paired comparison) is run on the baseline
  too, with the same rule; when the baseline is also supported, the check cannot tell the method from
  the baseline, whatever its interval says;
- ``not checked``: the runs or metrics the check needs are missing, and the note says which.

A check with ``counts=False`` is shown (a diagnostic, a limitation the paper concedes, a controller
pinned at its cap) but takes no part in the claim's verdict. A claim is ``contradicted`` when a counted
check is, ``supported`` when all are, ``underpowered`` (with the largest seed count its checks
need) when one is and none is contradicted, ``not evidence`` when one is and none of the above, and
``not checked`` when none of its counted checks could run ("partly checked" when some could not). The claims themselves are in ``analysis.claim_checks``.

    from analysis.claims import check_claims
    for outcome in check_claims(data, ["troll_success", "tppo_time"]):
        print(outcome.claim.title, outcome.verdict_text)
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
    """The direction a paper claims for a statistic, against a null (module docstring)."""

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


@dataclass
class ClaimOutcome:
    claim: Claim
    checks: list[CheckResult]

    @property
    def verdict(self) -> str:
        ran = [c.verdict for c in self.checks if c.counts and c.verdict != NOT_CHECKED]
        if not ran:
            return NOT_CHECKED
        for v in (CONTRADICTED, UNDERPOWERED, NOT_EVIDENCE):
            if v in ran:
                return v
        return SUPPORTED

    @property
    def verdict_text(self) -> str:
        """The verdict; underpowered with the most seeds any of its checks needs; "(partly checked)" when a
        counted check could not run."""
        verdict, text = self.verdict, self.verdict
        if verdict == UNDERPOWERED:
            under = [c for c in self.checks if c.counts and c.verdict == UNDERPOWERED]
            if all(c.identical for c in under):
                return under[0].verdict_text
            under = [c for c in under if not c.identical]
            have = min(c.ci.n if c.ci is not None else 0 for c in under)
            needs = [c.needs for c in under]
            text = verdict_text(UNDERPOWERED, None if None in needs else max(needs), have)
        counted = [c for c in self.checks if c.counts]
        if verdict != NOT_CHECKED and any(c.verdict == NOT_CHECKED for c in counted):
            text += " (partly checked)"
        return text


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
