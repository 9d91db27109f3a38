"""The papers' claims on synthetic sweeps with known effects: each claim passes where the effect was put in,
fails where the opposite (or nothing) was, is inconclusive where seeds cannot decide, and is "not checked"
without the runs. Statistics are recomputed here with numpy from the logged curves, intervals with
scipy's t distribution (a generic solver)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as st

from analysis.claims import FAIL, INCONCLUSIVE, NOT_CHECKED, PASS, Rule, check_claims, claim_keys
from analysis.stats import MeanCI
from analysis.synthetic import SyntheticSpec, _m, synthetic_data
from analysis.tables.claims import ALL_CLAIMS, claims_table
from reports.registry import ALL_CLAIMS as REGISTRY_CLAIMS
from runners import metric_names

FAMILIES = frozenset({"core", "timing", "claims", "trm"})


def _data(methods, seeds=(0, 1, 2), steps=40, **kw):
    spec = SyntheticSpec("claims_test", methods, seeds=seeds, steps=steps, eval_every=5, families=FAMILIES, **kw)
    return spec, *synthetic_data(spec)


def _ci(values, log=False):
    x = np.log(values) if log else np.asarray(values, dtype=float)
    half = st.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
    lo, mean, hi = x.mean() - half, x.mean(), x.mean() + half
    return tuple(np.exp([lo, mean, hi])) if log else (lo, mean, hi)


def _outcome(data, key):
    (outcome,) = check_claims(data, [key])
    return outcome


@pytest.mark.parametrize(
    "rule,lo,hi,expected",
    [
        (Rule("greater", 0.0, 0.1), 0.05, 0.3, PASS),
        (Rule("greater", 0.0, 0.1), -0.3, -0.05, FAIL),
        (Rule("greater", 0.0, 0.1), -0.05, 0.08, FAIL),  # effect absent: tight interval inside 0 +- 0.1
        (Rule("greater", 0.0, 0.1), -0.05, 0.3, INCONCLUSIVE),
        (Rule("less", 1.0), 0.5, 0.9, PASS),
        (Rule("less", 1.0), 1.1, 2.0, FAIL),
        (Rule("less", 1.0), 0.9, 1.1, INCONCLUSIVE),
        (Rule("within", 0.0, 0.2), -0.1, 0.15, PASS),
        (Rule("within", 0.0, 0.2), 0.25, 0.4, FAIL),
        (Rule("within", 0.0, 0.2), 0.1, 0.3, INCONCLUSIVE),
        (Rule("differs", 0.0, 0.1), 0.2, 0.5, PASS),
        (Rule("differs", 0.0, 0.1), -0.05, 0.05, FAIL),
        (Rule("differs", 0.0, 0.1), -0.05, 0.5, INCONCLUSIVE),
    ],
)
def test_verdict_rules(rule, lo, hi, expected):
    assert rule.verdict(MeanCI((lo + hi) / 2, lo, hi, 3, 0.1)) == expected
    assert rule.verdict(MeanCI((lo + hi) / 2, float("nan"), float("nan"), 1, float("nan"))) == INCONCLUSIVE


def test_every_registered_claim_is_offered_to_the_reports():
    assert set(ALL_CLAIMS) == set(REGISTRY_CLAIMS) == set(claim_keys())


def _troll_methods(troll_share=None, clip_share=None):
    return [
        _m("GRPO", "grpo", kl_over_eps=clip_share),
        _m("GRPO+TROLL", "grpo", "troll", kl_over_eps=troll_share),
    ]


SHARE = metric_names.post_update_kl_frac_above(0.05)


def _shares(spec, truth, label):
    """Per seed: the mean over steps of the share of tokens above eps = 0.05, from the logged curves."""
    return [truth[(label, s)]["curves"][SHARE][1].mean() for s in spec.seeds]


def test_troll_claim_passes_with_the_per_token_statistic_recomputed_from_the_curves():
    """TROLL leaves eps on 0.2% of tokens, Clip on 4%: both checks pass against the 1% tolerance."""
    spec, data, truth = _data(_troll_methods())
    outcome = _outcome(data, "troll_kl_bound")
    assert outcome.verdict == PASS
    troll, clip, diff = outcome.checks
    for check, label in ((troll, "GRPO+TROLL"), (clip, "GRPO")):
        assert (check.ci.lo, check.ci.mean, check.ci.hi) == pytest.approx(_ci(_shares(spec, truth, label)), rel=1e-9)
        assert SHARE in check.statistic and "KL(π_new ‖ π_old)" in check.statistic
    assert troll.verdict == PASS and troll.ci.hi < 0.01 and clip.verdict == PASS and clip.ci.lo > 0.01
    assert "KL(π_new ‖ π_old)" in outcome.claim.statement
    paired = np.array(_shares(spec, truth, "GRPO+TROLL")) - np.array(_shares(spec, truth, "GRPO"))
    assert (diff.ci.lo, diff.ci.mean, diff.ci.hi) == pytest.approx(_ci(paired), rel=1e-9)
    assert not diff.counts and diff.verdict == PASS and "stale" not in troll.note


def test_troll_claim_fails_when_troll_leaves_eps_and_is_inconclusive_on_the_edge():
    spec, data, truth = _data(_troll_methods(troll_share=0.1))  # TROLL looser than Clip: fail
    troll = _outcome(data, "troll_kl_bound").checks[0]
    assert troll.verdict == FAIL and _ci(_shares(spec, truth, "GRPO+TROLL"))[0] > 0.01
    assert _outcome(data, "troll_kl_bound").verdict == FAIL
    _, data, _ = _data(_troll_methods(clip_share=0.001))  # Clip inside the region as well: its check fails
    assert [c.verdict for c in _outcome(data, "troll_kl_bound").checks][:2] == [PASS, FAIL]
    spec, data, truth = _data(_troll_methods(troll_share=0.01), seeds=(0, 1))  # at the tolerance: undecided
    troll = _outcome(data, "troll_kl_bound").checks[0]
    lo, _, hi = _ci(_shares(spec, truth, "GRPO+TROLL"))
    assert lo < 0.01 < hi and troll.verdict == INCONCLUSIVE
    assert _outcome(data, "troll_kl_bound").verdict == INCONCLUSIVE
    _, data, _ = _data(_troll_methods(), seeds=(0,))
    assert _outcome(data, "troll_kl_bound").verdict == INCONCLUSIVE  # one seed: no interval


def test_troll_claim_uses_the_runs_eps_and_says_when_its_share_is_not_logged():
    spec, data, truth = _data([_m("GRPO", "grpo"), _m("GRPO+TROLL", "grpo", "troll", params={"objective.eps": 0.1})])
    troll, clip, _ = _outcome(data, "troll_kl_bound").checks
    at_01 = metric_names.post_update_kl_frac_above(0.1)
    assert troll.note == "" and clip.note == ""
    assert at_01 in troll.statistic and at_01 in clip.statistic
    per_seed = [truth[("GRPO", s)]["curves"][at_01][1].mean() for s in spec.seeds]
    assert clip.ci.mean == pytest.approx(np.mean(per_seed), rel=1e-9)
    _, data, _ = _data([_m("GRPO", "grpo"), _m("GRPO+TROLL", "grpo", "troll", params={"objective.eps": 0.03})])
    outcome = _outcome(data, "troll_kl_bound")
    assert outcome.verdict == NOT_CHECKED
    assert all(c.verdict == NOT_CHECKED and "actor/post_update_kl_frac_above_0.03" in c.note for c in outcome.checks)


def test_troll_claim_says_when_rollouts_are_stale():
    """With stale rollouts TROLL's region (around the sampler) and the statistic's pi_old (the policy before
    the update) differ: the check says so."""
    stale = {"rollout.staleness": 1}
    _, data, _ = _data([_m("GRPO", "grpo", params=stale), _m("GRPO+TROLL", "grpo", "troll", params=stale)])
    troll = _outcome(data, "troll_kl_bound").checks[0]
    assert "1 iteration(s) stale" in troll.note and "sampling policy" in troll.note


def test_claims_without_their_runs_are_not_checked_and_say_why():
    _, data, _ = _data([_m("GRPO", "grpo")])
    for key in ("troll_kl_bound", "trm_length", "repo_r_entropy", "gtpo_conflict", "adapo_eps_high", "tppo_time"):
        outcome = _outcome(data, key)
        assert outcome.verdict == NOT_CHECKED
        assert outcome.checks[0].note.startswith("no ")


def test_trm_claim_pass_and_fail_on_known_violation_rates():
    spec, data, truth = _data([_m("GRPO", "grpo", violation_p=1e-3), _m("TRM-Max", "grpo", "token_is", mask="trm_max")])
    length, bound = _outcome(data, "trm_length").checks
    short, long_ = metric_names.trm_accept_rate_bucket(0, 256), metric_names.trm_accept_rate_bucket(4096, 8192)
    diffs = [
        truth[("TRM-Max", s)]["curves"][short][1].mean() - truth[("TRM-Max", s)]["curves"][long_][1].mean()
        for s in spec.seeds
    ]
    assert (length.ci.lo, length.ci.mean, length.ci.hi) == pytest.approx(_ci(diffs), rel=1e-9)
    assert length.verdict == PASS and bound.verdict == PASS and bound.ci.hi < 0
    _, data, _ = _data([_m("TRM-Max", "grpo", "token_is", mask="trm_max", violation_p=0.0)])
    outcome = _outcome(data, "trm_length")
    assert outcome.checks[0].verdict == FAIL  # no length bias: acceptance ~1 everywhere, tight interval inside +-0.02
    assert outcome.verdict == FAIL


def test_repo_r_claim():
    spec, data, truth = _data(
        [_m("GRPO", "grpo", entropy_decay=0.02), _m("REPO-R", "repo_r", entropy_decay=0.0, entropy_control="repo_r")]
    )
    outcome = _outcome(data, "repo_r_entropy")
    repo, grpo = outcome.checks
    k = 4  # a tenth of 40 steps
    rel = []
    for s in spec.seeds:
        h = truth[("REPO-R", s)]["curves"][metric_names.ENTROPY][1]
        rel.append((h[-k:].mean() - h[:k].mean()) / h[:k].mean())
    assert repo.ci.mean == pytest.approx(np.mean(rel), rel=1e-9)
    assert (outcome.verdict, repo.verdict, grpo.verdict) == (PASS, PASS, PASS)
    _, data, _ = _data([_m("GRPO", "grpo"), _m("REPO-R", "repo_r", entropy_decay=0.02, entropy_control="repo_r")])
    assert _outcome(data, "repo_r_entropy").checks[0].verdict == FAIL  # -55% over the run: outside +-20%


def test_gtpo_claim():
    _, data, _ = _data([_m("GRPO", "grpo"), _m("GTPO", "gtpo", "gtpo")])
    outcome = _outcome(data, "gtpo_conflict")
    assert outcome.verdict == PASS and outcome.checks[1].runs == "GTPO − GRPO"
    _, data, _ = _data([_m("GRPO", "grpo"), _m("GTPO", "gtpo", "gtpo", conflict_delta=-0.05)])
    outcome = _outcome(data, "gtpo_conflict")
    assert [c.verdict for c in outcome.checks] == [FAIL, FAIL] and outcome.verdict == FAIL


def test_adapo_claim():
    _, data, _ = _data([_m("DAPO", "dapo"), _m("ADAPO", "adapo", entropy_control="adapo", clipfrac=2.5e-3)])
    assert _outcome(data, "adapo_eps_high").verdict == PASS
    _, data, _ = _data([_m("DAPO", "dapo"), _m("ADAPO", "adapo", entropy_control="adapo", eps_high_drift=0.0)])
    outcome = _outcome(data, "adapo_eps_high")
    assert outcome.checks[0].verdict == FAIL  # eps_high never moved


def _time_to_target(truth, label, seed, target, metric):
    steps, values = truth[(label, seed)]["curves"][metric]
    t_steps, t = truth[(label, seed)]["curves"][metric_names.TIMING_STEP]
    hit = np.flatnonzero(values >= target - 1e-12)
    step = steps[hit[0]] if len(hit) else steps[-1]
    return t[t_steps <= step].sum()


@pytest.mark.parametrize("tppo_rate,expected", [(0.2, PASS), (0.1, INCONCLUSIVE), (0.05, FAIL)])
def test_tppo_claim_time_to_ppo_final_reward(tppo_rate, expected):
    """T-PPO steps are ~0.68x PPO's (generation 2.5x shorter). Learning four times as fast per step it reaches
    PPO's final reward in well under half the time (~0.2x); twice as fast, near half (~0.45x, three seeds
    cannot decide); at PPO's rate it needs ~0.68x: fail."""
    methods = [_m("PPO", "ppo", final=0.5, rate=0.05), _m("T-PPO", "tppo", final=0.5, rate=tppo_rate)]
    spec, data, truth = _data(methods, steps=60, eval_sets=("aime24",))
    outcome = _outcome(data, "tppo_time")
    wall, cpu = outcome.checks
    metric = metric_names.val_acc_mean("aime24")
    ratios = []
    for s in spec.seeds:
        target = truth[("PPO", s)]["curves"][metric][1][-3:].mean()
        ratios.append(
            _time_to_target(truth, "T-PPO", s, target, metric) / _time_to_target(truth, "PPO", s, target, metric)
        )
    assert (wall.ci.lo, wall.ci.mean, wall.ci.hi) == pytest.approx(_ci(ratios, log=True), rel=1e-9)
    assert wall.verdict == expected and outcome.verdict == expected
    lo, _, hi = _ci(ratios, log=True)
    assert {PASS: hi < 0.5, INCONCLUSIVE: lo < 0.5 < hi, FAIL: lo > 0.5}[expected]
    assert not cpu.counts and "CPU" in cpu.part
    assert "seconds per step (wall / CPU)" in wall.note and "gen" in wall.note


def test_claims_table_shows_verdicts_with_classes():
    _, data, _ = _data(_troll_methods())
    table = claims_table(data, claims=("troll_kl_bound", "tppo_time"))
    verdicts = list(table.display["verdict"])
    assert verdicts == [PASS, PASS, PASS, PASS, NOT_CHECKED, NOT_CHECKED]
    assert 'class="verdict-pass"' in table.to_html() and 'class="verdict-not-checked"' in table.to_html()
    only = claims_table(data, claims=("troll_kl_bound", "tppo_time"), show_unchecked=False)
    assert len(only.display) == 4
