"""TROLL's claims (arXiv 2510.03817), checked against Clip runs of the same recipe (``analysis.claim_checks``).

- troll_success (abstract, Table 1; section 4 and Figures 5, 17): TROLL's final success rate above Clip's,
  and more entropy kept at the end of the run;
- troll_kl_bound (section 3, eq. 3): fewer response tokens beyond the KL radius eps after the update than
  Clip leaves, measured from the centre of TROLL's region (the policy the tokens were sampled from).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from analysis.arms import arm_table, counterpart, per_seed, run_labels, run_params, select_arms
from analysis.claim_checks_common import SAME_RECIPE, SHOWN, entropy_kept, final_success, is_troll, paired
from analysis.claim_rules import CheckResult, Rule, not_checked
from analysis.frames import ExperimentData
from runners import metric_names


def _troll_pairs(data: ExperimentData) -> tuple[pd.DataFrame, list[tuple[str, str | None]]]:
    """(arm table, [(TROLL arm, its Clip counterpart of the same recipe or None)])."""
    arms = arm_table(data)
    clips = select_arms(arms, objective=lambda o: not is_troll(o))
    return arms, [(a, counterpart(arms, a, clips, SAME_RECIPE)) for a in select_arms(arms, objective=is_troll)]


def troll_success(data: ExperimentData, opts: Mapping) -> list[CheckResult]:
    part_success, part_entropy = "TROLL's final success rate above Clip's", "TROLL keeps more entropy than Clip"
    _, pairs = _troll_pairs(data)
    if not pairs:
        return [not_checked(part_success, "no TROLL run (objective troll*) in this sweep")]
    checks = []
    for arm, clip in pairs:
        checks.append(final_success(data, opts, part_success, arm, clip, f"Clip run with the recipe of {arm}"))
        checks.append(entropy_kept(data, part_entropy, arm, clip, f"Clip run with the recipe of {arm}"))
    return checks


def _troll_eps(data: ExperimentData, runs: pd.Series, default: float) -> tuple[float, str]:
    """(eps of a TROLL arm's runs, a note when it had to be assumed)."""
    eps_by_run = {r: float(v) for r, v in run_params(data, "objective.eps").items()}
    values = [eps_by_run[r] for r in runs if r in eps_by_run]
    if values:
        return float(np.median(values)), ""
    return default, f"objective.eps not logged: eps = {default:g} (the TROLL default)"


def troll_kl_bound(data: ExperimentData, opts: Mapping) -> list[CheckResult]:
    """TROLL bounds the KL of every token (eq. 3), so the statistic is per token: the share of response
    tokens whose KL after the update from the centre of TROLL's region exceeds eps, mean over steps,
    TROLL's minus Clip's (same eps, same recipe), paired by seed, claimed < 0. The paper guarantees the
    *projected* policy inside the region; the network after the optimiser step is what both methods leave,
    so no absolute tolerance is claimed. Both shares are shown beside it, not counted.

    The centre is the policy the tokens were sampled from (section 3.1). On-policy that is pi_old of the
    old-log-prob pass (``actor/post_update_kl_frac_above_<eps>``); with a separate sampling copy (stale
    rollouts, a lower-precision sampler) it is that copy (``actor/post_update_kl_sampler_frac_above_<eps>``,
    logged by every method there). Runs from before the sampler statistic existed fall back to pi_old's,
    and the note says so."""
    part = "TROLL leaves fewer tokens beyond eps than Clip"
    arms, pairs = _troll_pairs(data)
    if not pairs:
        return [not_checked(part, "no TROLL run (objective troll*) in this sweep")]
    labels, names = run_labels(data), set(data.metric_names())
    checks = []
    for arm, clip in pairs:
        runs = labels.loc[labels["arm"] == arm, "run_id"].astype(str)
        eps, eps_note = _troll_eps(data, runs, float(opts["eps_default"]))
        if clip is None:
            checks.append(not_checked(part, f"no Clip run with the recipe of {arm}", arm))
            continue
        metric, centre, centre_note = _kl_centre(names, eps, _off_policy(data, runs))
        if metric not in names:
            logged = ", ".join(f"{e:g}" for e in metric_names.POST_UPDATE_KL_THRESHOLDS)
            why = f"no run logs {metric} (thresholds logged: {logged}; runs from before the metric existed lack it)"
            checks.append(not_checked(part, why, f"{arm} − {clip}"))
            continue
        share = per_seed(data, metric, "mean", labels=labels)
        stat = f"share of tokens with KL(π_new ‖ {centre}) > eps = {eps:g} after the update ({metric}), mean over steps"
        note = "; ".join(filter(None, [eps_note, centre_note]))
        diff = paired(share.get(arm, {}), share.get(clip, {}))
        checks.append(
            CheckResult(part, f"{arm} − {clip}", stat + ", paired by seed", diff, Rule("less", 0.0), note=note)
        )
        for who in (arm, clip):
            shown = CheckResult(f"share beyond eps ({who})", who, stat, share.get(who, {}), counts=False)
            shown.verdict = SHOWN
            checks.append(shown)
    return checks


def _off_policy(data: ExperimentData, runs: pd.Series) -> str:
    """How the runs' sampling policy differs from pi_old ("" on-policy): stale rollouts, a lower-precision
    sampler. Only the built-in trainer centres TROLL on its sampling copy; verl's TROLL keeps the top-K of its
    old-log-prob pass (``runners.backends.verl.plugins.sparse_old``), so pi_old is the centre there."""
    labels = data.labels()
    verl = set(labels.loc[labels[metric_names.TAG_BACKEND] == "verl", "run_id"].astype(str))
    ids = set(runs) - verl
    stale = [int(float(v)) for r, v in run_params(data, "rollout.staleness").items() if r in ids]
    dtypes = {str(v) for r, v in run_params(data, "rollout.dtype").items() if r in ids} - {"auto", "None", "nan"}
    k = max(stale, default=0)
    parts = [
        f"rollouts {k} iteration(s) stale" if k > 0 else "",
        f"a {'/'.join(sorted(dtypes))} sampler" if dtypes else "",
    ]
    return " and ".join(filter(None, parts))


def _kl_centre(names: set[str], eps: float, off_policy: str) -> tuple[str, str, str]:
    """(the share metric, the centre's symbol, a note) for runs sampled on-policy or ``off_policy``."""
    own = metric_names.post_update_kl_frac_above(eps)
    if not off_policy:
        return own, "π_old", ""
    sampler = metric_names.post_update_kl_frac_above(eps, sampler=True)
    if sampler in names:
        return sampler, "π_sampler", f"{off_policy}: measured from the sampling policy, the centre of TROLL's region"
    note = (
        f"{off_policy}: TROLL's region is centred on the sampling policy, the statistic's pi_old is the policy "
        f"before the update (these runs do not log {sampler})"
    )
    return own, "π_old", note
