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
``not checked`` when none of its counted checks could run ("partly checked" when some could not). Checks,
rules and the registry of claims are in ``analysis.claim_rules``; the claims themselves in ``analysis.claim_checks``.

    from analysis.claims import check_claims
    for outcome in check_claims(data, ["troll_success", "tppo_time"]):
        print(outcome.claim.title, outcome.verdict_text)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from analysis.claim_rules import (  # noqa: F401  (re-exported: the claims' vocabulary, imported from here)
    CLAIMS,
    CONTRADICTED,
    N_MAX,
    NOT_CHECKED,
    NOT_EVIDENCE,
    SUPPORTED,
    UNDERPOWERED,
    VERDICTS,
    CheckResult,
    Claim,
    Rule,
    not_checked,
    register_claim,
    seeds_for,
    verdict_text,
)
from analysis.frames import ExperimentData


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
