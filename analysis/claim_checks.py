"""The papers' claims as checks on a sweep's runs (verdict rules: ``analysis.claims``), registered here.

Each claim quotes its paper and uses the paper's own metric; runs are chosen by their tags
(``analysis.arms``), comparisons are paired by seed, "final" is each run's last evaluation
(``analysis.aggregate.final_evals``), and a check that cannot run says which run or metric is missing.
A check on one method's own numbers is run on its baseline too (``CheckResult.baseline_values``).

- troll_success (arXiv 2510.03817 abstract, Table 1; section 4 and Figures 5, 17): TROLL's final success
  rate above Clip's, and more entropy kept.
- troll_kl_bound (arXiv 2510.03817 section 3, eq. 3): fewer tokens beyond the KL radius eps after the update
  than Clip leaves.
- trm_bound (arXiv 2512.23075 abstract, section 6, section 7; appendix D.1): the error bound at the runs'
  real response lengths and measured divergence is non-vacuous (below 1, the largest reward, section 4.1),
  training is stable (final success not below GRPO's); the length bias TRM concedes is shown, not counted.
- gtpo_conflict (arXiv 2508.03772 abstract, section 5): conflict tokens keep their probability (run on
  GRPO too), better than under GRPO, and a better final success rate.
- repo_r_entropy, adapo_success (arXiv 2603.11682 abstract, section 5): entropy kept better than the
  baseline's and a better final success rate; a controller pinned at its cap is flagged.
- tppo_time (arXiv 2506.15050 section 4.2, Figure 1): T-PPO matches PPO's final reward with 60% less
  wall-clock time (a ratio at most 0.4).

Each paper's checks are in a module of their own (``analysis.claim_checks_troll``, ``analysis.claim_checks_trm``,
``analysis.claim_checks_gtpo``, ``analysis.claim_checks_entropy``, ``analysis.claim_checks_tppo``), what they
share in ``analysis.claim_checks_common``; this module states each claim and registers it.
"""

from __future__ import annotations

from analysis.claim_checks_common import (  # noqa: F401  (re-exported)
    PINNED,
    SAME_RECIPE,
    SHOWN,
    entropy_kept,
    final_success,
    final_tenth,
)
from analysis.claim_checks_entropy import adapo_success, pinned_check, repo_r_entropy  # noqa: F401  (re-exported)
from analysis.claim_checks_gtpo import gtpo_conflict
from analysis.claim_checks_tppo import time_to_reach, tppo_time  # noqa: F401  (re-exported)
from analysis.claim_checks_trm import trm_bound
from analysis.claim_checks_troll import troll_kl_bound, troll_success
from analysis.claim_rules import Claim, register_claim

for _claim in (
    Claim("troll_success", "TROLL against Clip", "arXiv 2510.03817 abstract, Table 1; §4, Figures 5 and 17",
          "\"TROLL consistently outperforms PPO-like clipping in terms of training speed, stability, and final success "
          "rates\"; \"TROLL generally maintains more entropy during training while showing higher success rates\".",
          troll_success, {"eval": None}),
    Claim("troll_kl_bound", "TROLL trust region", "arXiv 2510.03817 §3, eq. 3",
          "The projection \"provides principled token-level KL constraints\": KL(π_new ‖ π_old) ≤ eps per token, where "
          "clipping is \"a crude approximation\".", troll_kl_bound, {"eps_default": 0.05}),
    Claim("trm_bound", "TRM: non-vacuous bounds, stable training", "arXiv 2512.23075 abstract, §4.1, §6, §7; App. D.1",
          "\"TRM enables the first non-vacuous monotonic improvement guarantees\" (a bound below 1, \"the maximum "
          "possible reward\") \"and demonstrates empirical training stability\".", trm_bound, {"eval": None}),
    Claim("gtpo_conflict", "GTPO protects conflict tokens", "arXiv 2508.03772 abstract, §5",
          "GTPO \"identifies conflict tokens ... and protects them by skipping negative updates, while amplifying positive "
          "ones\", \"ensuring greater training stability and improved performance\".", gtpo_conflict, {"eval": None}),
    Claim("repo_r_entropy", "REPO-R preserves entropy", "arXiv 2603.11682 abstract, §5",
          "\"Models trained with our entropy-preserving methods maintain diversity throughout training, yielding final "
          "policies that are more performant\".", repo_r_entropy, {"eval": None}),
    Claim("adapo_success", "ADAPO preserves entropy", "arXiv 2603.11682 abstract, §5.2",
          "ADAPO, \"an adaptive asymmetric clipping approach\", maintains diversity and yields more performant final "
          "policies than its base, DAPO.", adapo_success, {"eval": None}),
    Claim("tppo_time", "T-PPO efficiency", "arXiv 2506.15050 §4.2, Figure 1",
          "T-PPO matches PPO's final reward \"with 60% wall-clock time reduction\" (a time ratio of at most 0.4).",
          tppo_time, {"goal": 0.4, "last_n": 3, "reward": None}),
):  # fmt: skip
    register_claim(_claim)
