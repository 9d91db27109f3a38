"""The papers' claims on synthetic sweeps with known effects: each claim is supported where the effect was
put in, contradicted where the opposite was, underpowered (with the seeds a t-test needs) where seeds cannot
decide, "not evidence" where the baseline passes the same check, and "not checked" without the runs.
Statistics are recomputed here with numpy from the logged curves, intervals with scipy's t distribution,
and the seeds needed by a Monte Carlo simulation of paired t-tests."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as st

from analysis.claim_checks import PINNED, SHOWN
from analysis.claims import (
    CONTRADICTED,
    NOT_CHECKED,
    NOT_EVIDENCE,
    SUPPORTED,
    UNDERPOWERED,
    CheckResult,
    Rule,
    check_claims,
    claim_keys,
)
from analysis.stats import MeanCI
from analysis.synthetic import ADAPO_CAPS, REPO_R_CAPS, SyntheticSpec, _m, synthetic_data
from analysis.tables.claims import ALL_CLAIMS, claims_table
from reports.registry import get_report
from runners import metric_names

FAMILIES = frozenset({"core", "timing", "claims", "trm"})
SHORT = {"rollout.max_response_length": 48}  # the demo's response length: TRM's bounds are taken at it
EVAL = metric_names.val_acc_mean("dapo_eval", 1)


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


def _check(outcome, part):
    (check,) = [c for c in outcome.checks if c.part == part]
    return check


def _final_eval(truth, label, seed):
    """The run's last evaluation, read from its curve (the step with the largest index)."""
    steps, values = truth[(label, seed)]["curves"][EVAL]
    return values[np.argmax(steps)]


def _last_tenth(truth, label, seed, metric):
    values = truth[(label, seed)]["curves"][metric][1]
    return values[-max(1, len(values) // 10) :].mean()


@pytest.mark.parametrize(
    "rule,lo,hi,expected",
    [
        (Rule("greater", 0.0), 0.05, 0.3, SUPPORTED),
        (Rule("greater", 0.0), -0.3, -0.05, CONTRADICTED),
        (Rule("greater", 0.0), -0.05, 0.3, UNDERPOWERED),
        (Rule("less", 1.0), 0.5, 0.9, SUPPORTED),
        (Rule("less", 1.0), 1.1, 2.0, CONTRADICTED),
        (Rule("less", 1.0), 0.9, 1.1, UNDERPOWERED),
    ],
)
def test_verdict_rules(rule, lo, hi, expected):
    assert rule.verdict(MeanCI((lo + hi) / 2, lo, hi, 3, 0.1)) == expected
    assert rule.verdict(MeanCI((lo + hi) / 2, float("nan"), float("nan"), 1, float("nan"))) == UNDERPOWERED
    with pytest.raises(ValueError, match="greater or less"):
        Rule("within", 0.0)


def _mc_power(n, delta, sd, reps=40_000, seed=0):
    """Monte Carlo power of a two-sided one-sample t-test at alpha 0.05 with n seeds."""
    x = np.random.default_rng(seed).normal(delta, sd, size=(reps, n))
    t = x.mean(1) / (x.std(1, ddof=1) / np.sqrt(n))
    return float(np.mean(np.abs(t) > st.t.ppf(0.975, n - 1)))


def test_underpowered_names_the_seeds_a_paired_t_test_needs_checked_by_monte_carlo():
    values = {0: 0.03, 1: -0.01, 2: 0.05}  # interval contains 0
    check = CheckResult("x", "A − B", "diff", values, Rule("greater", 0.0)).evaluate()
    assert check.verdict == UNDERPOWERED
    x = np.array(list(values.values()))
    n = check.needs
    assert check.verdict_text == f"underpowered (needs {n} seeds)"
    assert _mc_power(n, x.mean(), x.std(ddof=1)) >= 0.79 > _mc_power(n - 1, x.mean(), x.std(ddof=1))
    one = CheckResult("x", "A", "v", {0: 0.1}, Rule("greater", 0.0)).evaluate()
    assert one.verdict_text == "underpowered (1 seed: needs at least 2)"
    tiny = CheckResult("x", "A", "v", {0: 1e-6, 1: -1e-3, 2: 1e-3}, Rule("greater", 0.0)).evaluate()
    assert tiny.verdict_text == "underpowered (needs > 1000 seeds)"
    same = CheckResult("x", "A − B", "v", {0: 0.0, 1: 0.0, 2: 0.0}, Rule("greater", 0.0)).evaluate()
    assert same.verdict_text == "underpowered (exactly 0 on every seed: no seed count decides)"


def test_a_check_the_baseline_also_passes_is_not_evidence():
    """GTPO's conflict tokens gain probability: evidence only while GRPO's lose it. When GRPO's gain it too
    (the same rule supported on the baseline) the check is 'not evidence' whatever GTPO's interval says."""
    _, data, _ = _data([_m("GRPO", "grpo"), _m("GTPO", "gtpo", "gtpo")])
    keep = _check(_outcome(data, "gtpo_conflict"), "GTPO's conflict tokens gain probability")
    assert (keep.verdict, keep.baseline_verdict, keep.baseline_runs) == (SUPPORTED, CONTRADICTED, "GRPO")
    _, data, _ = _data([_m("GRPO", "grpo", conflict_delta=0.01), _m("GTPO", "gtpo", "gtpo", conflict_delta=0.01)])
    outcome = _outcome(data, "gtpo_conflict")
    keep = _check(outcome, "GTPO's conflict tokens gain probability")
    assert keep.ci.lo > 0 and keep.baseline_ci.lo > 0 and keep.verdict == NOT_EVIDENCE
    assert _check(outcome, "they gain more under GTPO than under GRPO").verdict == UNDERPOWERED


def test_final_means_the_last_evaluation_of_each_run():
    spec, data, truth = _data([_m("GRPO", "grpo", final=0.5), _m("GRPO+TROLL", "grpo", "troll", final=0.8)])
    check = _check(_outcome(data, "troll_success"), "TROLL's final success rate above Clip's")
    diffs = [_final_eval(truth, "GRPO+TROLL", s) - _final_eval(truth, "GRPO", s) for s in spec.seeds]
    assert (check.ci.lo, check.ci.mean, check.ci.hi) == pytest.approx(_ci(diffs), rel=1e-9)
    assert "step 40 (last eval)" in check.statistic and EVAL in check.statistic
    assert check.verdict == SUPPORTED


@pytest.mark.parametrize(
    "troll_final,decay,expected",
    [(0.8, 0.0, SUPPORTED), (0.3, 0.05, CONTRADICTED), (0.6, 0.01, UNDERPOWERED)],
)
def test_troll_success_and_entropy(troll_final, decay, expected):
    spec, data, truth = _data(
        [_m("GRPO", "grpo", final=0.6, entropy_decay=0.01), _m("GRPO+TROLL", "grpo", "troll", final=troll_final,
                                                             entropy_decay=decay)]
    )  # fmt: skip
    outcome = _outcome(data, "troll_success")
    entropy = _check(outcome, "TROLL keeps more entropy than Clip")
    diffs = [_last_tenth(truth, "GRPO+TROLL", s, metric_names.ENTROPY) - _last_tenth(truth, "GRPO", s, metric_names.ENTROPY)
             for s in spec.seeds]  # fmt: skip
    assert (entropy.ci.lo, entropy.ci.mean, entropy.ci.hi) == pytest.approx(_ci(diffs), rel=1e-9)
    assert outcome.verdict == expected
    if expected == UNDERPOWERED:
        assert outcome.verdict_text.startswith("underpowered (needs ")


def _troll_methods(troll_share=None, clip_share=None):
    return [_m("GRPO", "grpo", kl_over_eps=clip_share), _m("GRPO+TROLL", "grpo", "troll", kl_over_eps=troll_share)]


SHARE = metric_names.post_update_kl_frac_above(0.05)


def test_troll_trust_region_is_the_paired_share_beyond_eps_against_clip():
    spec, data, truth = _data(_troll_methods())
    outcome = _outcome(data, "troll_kl_bound")
    diff = _check(outcome, "TROLL leaves fewer tokens beyond eps than Clip")
    paired = [truth[("GRPO+TROLL", s)]["curves"][SHARE][1].mean() - truth[("GRPO", s)]["curves"][SHARE][1].mean()
              for s in spec.seeds]  # fmt: skip
    assert (diff.ci.lo, diff.ci.mean, diff.ci.hi) == pytest.approx(_ci(paired), rel=1e-9)
    assert outcome.verdict == SUPPORTED and diff.counts and "stale" not in diff.note
    shown = [c for c in outcome.checks if not c.counts]
    assert [c.verdict for c in shown] == [SHOWN, SHOWN]  # both shares beside it, no tolerance claimed
    _, data, _ = _data(_troll_methods(troll_share=0.1))  # TROLL looser than Clip
    assert _outcome(data, "troll_kl_bound").verdict == CONTRADICTED
    _, data, _ = _data(_troll_methods(), seeds=(0,))
    assert _outcome(data, "troll_kl_bound").verdict_text == "underpowered (1 seed: needs at least 2)"


def test_troll_trust_region_uses_the_runs_eps_and_says_when_rollouts_are_stale():
    _, data, _ = _data([_m("GRPO", "grpo"), _m("GRPO+TROLL", "grpo", "troll", params={"objective.eps": 0.03})])
    outcome = _outcome(data, "troll_kl_bound")
    assert outcome.verdict == NOT_CHECKED and "actor/post_update_kl_frac_above_0.03" in outcome.checks[0].note
    stale = {"rollout.staleness": 1}
    _, data, _ = _data([_m("GRPO", "grpo", params=stale), _m("GRPO+TROLL", "grpo", "troll", params=stale)])
    diff = _outcome(data, "troll_kl_bound").checks[0]
    assert "1 iteration(s) stale" in diff.note and "sampling policy" in diff.note
    assert "do not log actor/post_update_kl_sampler_frac_above_0.05" in diff.note


def test_stale_runs_are_measured_from_the_sampling_policy_troll_projects_onto():
    """With a sampling copy, TROLL's region is centred on it: the check reads the share from the sampler
    (here TROLL below Clip) and not the share from pi_old (here the other way round)."""
    for params in ({"rollout.staleness": 2}, {"rollout.dtype": "bfloat16"}):
        methods = [
            _m("GRPO", "grpo", params=params, kl_over_eps=0.01, kl_over_eps_sampler=0.08),
            _m("GRPO+TROLL", "grpo", "troll", params=params, kl_over_eps=0.05, kl_over_eps_sampler=0.02),
        ]
        spec, data, truth = _data(methods)
        outcome = _outcome(data, "troll_kl_bound")
        diff = _check(outcome, "TROLL leaves fewer tokens beyond eps than Clip")
        sampler = metric_names.post_update_kl_frac_above(0.05, sampler=True)
        paired = [truth[("GRPO+TROLL", s)]["curves"][sampler][1].mean() - truth[("GRPO", s)]["curves"][sampler][1].mean()
                  for s in spec.seeds]  # fmt: skip
        assert (diff.ci.lo, diff.ci.mean, diff.ci.hi) == pytest.approx(_ci(paired), rel=1e-9)
        assert outcome.verdict == SUPPORTED and sampler in diff.statistic and "π_sampler" in diff.statistic
        assert "measured from the sampling policy" in diff.note
        assert ("stale" in diff.note) == ("rollout.staleness" in params)
    # on-policy runs that happen to log both are read from pi_old: one policy, one centre
    methods = [_m("GRPO", "grpo", kl_over_eps=0.01, kl_over_eps_sampler=0.08),
               _m("GRPO+TROLL", "grpo", "troll", kl_over_eps=0.05, kl_over_eps_sampler=0.02)]  # fmt: skip
    _, data, _ = _data(methods)
    assert _outcome(data, "troll_kl_bound").verdict == CONTRADICTED


def test_claims_without_their_runs_are_not_checked_and_say_why():
    _, data, _ = _data([_m("GRPO", "grpo")])
    for key in ALL_CLAIMS:
        outcome = _outcome(data, key)
        assert outcome.verdict == NOT_CHECKED
        assert outcome.checks[0].note.startswith(("no ", "not run in this sweep"))
    assert "sweeps/tppo_table1_cpu.yaml" in _outcome(data, "tppo_time").checks[0].note


def test_trm_bound_at_the_real_response_length_and_the_baseline():
    """At T = 48 (the demo's length) and TRM-Max's divergence the bound is non-vacuous; GRPO with a large
    mismatch (violation 0.05) and long responses has a vacuous one, so the check is evidence. With the same
    small mismatch and length GRPO's bound is non-vacuous too: not evidence."""
    trm = _m("TRM-Max", "grpo", "token_is", mask="trm_max", params=SHORT)
    long = {"rollout.max_response_length": 4096}
    spec, data, truth = _data([_m("GRPO", "grpo", violation_p=0.05, params=long), trm])
    outcome = _outcome(data, "trm_bound")
    bound = _check(outcome, "TRM-Max's error bound is non-vacuous (below 1, the largest reward)")
    assert "T)" in bound.statistic and bound.ci.hi < 0 and bound.baseline_ci.lo > 0
    assert bound.verdict == SUPPORTED and bound.baseline_verdict == CONTRADICTED
    length = _check(outcome, "length bias (appendix D.1, a limitation the paper concedes)")
    assert not length.counts and length.verdict == SHOWN
    _, data, _ = _data([_m("GRPO", "grpo", params=SHORT), trm])
    assert _check(_outcome(data, "trm_bound"), bound.part).verdict == NOT_EVIDENCE
    _, data, _ = _data(
        [_m("GRPO", "grpo"), _m("TRM-Max", "grpo", "token_is", mask="trm_max", violation_p=0.05, params=long)]
    )
    assert _check(_outcome(data, "trm_bound"), bound.part).verdict == CONTRADICTED  # vacuous at T = 4096


def test_trm_bound_statistic_is_the_bound_at_the_runs_largest_kl_and_length():
    """The statistic is the bound (eq. 42-45, ``runners.algorithms.bounds``, checked against the paper's own
    figures in tests/algorithms) at T = the run's response length and delta = its largest logged trm/max_kl, with
    the per-position TV read from its buckets: recomputed here from the curves."""
    from runners.algorithms.bounds import error_bounds

    for cap in (None, 1e-5):  # TRM-Max trains only on sequences whose max KL is at most its mask.delta
        params = SHORT if cap is None else {**SHORT, "mask.delta": cap}
        spec, data, truth = _data([_m("TRM-Max", "grpo", "token_is", mask="trm_max", params=params)])
        bound = _outcome(data, "trm_bound").checks[0]
        for seed in spec.seeds:
            curves = truth[("TRM-Max", seed)]["curves"]
            dbar = np.full(48, np.nan)
            for lo, hi in ((0, 64),):
                dbar[lo : min(hi, 48)] = curves[metric_names.trm_tv_position_bucket(lo, hi)][1].mean()
            delta = curves[metric_names.TRM_MAX_KL][1].max()
            assert cap is None or cap < delta
            expected = error_bounds(48, delta if cap is None else cap, dbar=dbar)["best"]
            assert bound.values[seed] == pytest.approx(np.log10(expected), rel=1e-9)


def test_repo_r_and_adapo_entropy_success_and_pinned_controllers():
    grpo = _m("GRPO", "grpo", final=0.5, entropy_decay=0.03)
    repo = _m("REPO-R", "repo_r", final=0.8, entropy_decay=0.0, entropy_control="repo_r", zeta_growth=10.0,
              params=dict(REPO_R_CAPS))  # fmt: skip
    dapo = _m("DAPO", "dapo", final=0.6, entropy_decay=0.01)
    adapo = _m("ADAPO", "adapo", final=0.4, entropy_decay=0.05, entropy_control="adapo", params=dict(ADAPO_CAPS))
    _, data, _ = _data([grpo, repo, dapo, adapo])
    outcome = _outcome(data, "repo_r_entropy")
    assert outcome.verdict == SUPPORTED
    pinned = _check(outcome, "repo_r controller off its caps (entropy/zeta)")
    assert pinned.verdict == PINNED and not pinned.counts and "3 of 3" in pinned.statistic
    outcome = _outcome(data, "adapo_success")
    assert outcome.verdict == CONTRADICTED
    assert _check(outcome, "adapo controller off its caps (entropy/eps_high)").verdict == SHOWN  # drifts, not pinned


def _time_to_target(truth, label, seed, target, metric):
    steps, values = truth[(label, seed)]["curves"][metric]
    t_steps, t = truth[(label, seed)]["curves"][metric_names.TIMING_STEP]
    hit = np.flatnonzero(values >= target - 1e-12)
    step = steps[hit[0]] if len(hit) else steps[-1]
    return t[t_steps <= step].sum()


@pytest.mark.parametrize("tppo_rate", [0.3, 0.1, 0.05])
def test_tppo_claim_time_to_ppo_final_reward_against_the_papers_60_percent(tppo_rate):
    """T-PPO steps are ~0.68x PPO's (generation 2.5x shorter); learning faster per step it reaches PPO's final
    reward sooner. The verdict follows the interval of the ratio against the paper's 0.4 (a 60% reduction)."""
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
    lo, mean, hi = _ci(ratios, log=True)
    assert (wall.ci.lo, wall.ci.mean, wall.ci.hi) == pytest.approx((lo, mean, hi), rel=1e-9)
    expected = SUPPORTED if hi < 0.4 else CONTRADICTED if lo > 0.4 else UNDERPOWERED
    assert wall.verdict == expected and outcome.verdict == expected
    assert not cpu.counts and "CPU" in cpu.part
    assert "seconds per step (wall / CPU)" in wall.note and "gen" in wall.note


def test_tppo_cases_reach_both_decided_verdicts():
    verdicts = set()
    for rate in (0.3, 0.1, 0.05):
        methods = [_m("PPO", "ppo", final=0.5, rate=0.05), _m("T-PPO", "tppo", final=0.5, rate=rate)]
        _, data, _ = _data(methods, steps=60, eval_sets=("aime24",))
        verdicts.add(_outcome(data, "tppo_time").verdict)
    assert SUPPORTED in verdicts and CONTRADICTED in verdicts


def test_every_registered_claim_is_offered_to_the_reports():
    """The generic report's claims table asks for every claim ``register_claim`` registered, each once."""
    (offered,) = [i.options["claims"] for i in get_report("generic").items if i.target.endswith(":claims_table")]
    assert sorted(offered) == sorted(claim_keys())


def test_claims_table_shows_verdicts_with_classes():
    _, data, _ = _data(_troll_methods())
    table = claims_table(data, claims=("troll_kl_bound", "tppo_time"))
    verdicts = list(table.display["verdict"])
    assert verdicts == [SUPPORTED, SUPPORTED, SHOWN, SHOWN, NOT_CHECKED, NOT_CHECKED]
    html = table.to_html()
    assert 'class="verdict-supported"' in html and 'class="verdict-not-checked"' in html
    only = claims_table(data, claims=("troll_kl_bound", "tppo_time"), show_unchecked=False)
    assert len(only.display) == 4
    assert "not evidence" in table.caption and "underpowered" in table.caption


def test_a_claim_whose_method_ran_without_its_baseline_stays_and_says_what_is_missing():
    """A single TROLL run (no Clip run of its recipe): the generic report keeps TROLL's claims, "not checked"
    with the reason, and drops the claims of methods that did not run."""
    _, data, _ = _data([_m("GRPO+TROLL", "grpo", "troll")])
    table = claims_table(data, show_unchecked=False)
    claims = {c.split(" (arXiv")[0] for c in table.display.index.get_level_values(0)}
    assert claims == {"TROLL against Clip", "TROLL trust region"}
    assert set(table.display["verdict"]) == {NOT_CHECKED}
    assert any("no Clip run with the recipe of GRPO+TROLL" in n for n in table.notes)
