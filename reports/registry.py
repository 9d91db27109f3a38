"""Which tables and figures each experiment's report contains.

Design: a report is an ordered list of ``Item``s, each a lazy ``"module:attr"`` builder (imported only
when the report is built, so listing reports stays cheap) called with the loaded ``ExperimentData``
(or with nothing for items that need no runs, e.g. the paper's bound table). Experiments are the
sweep names of ``sweeps/`` (one MLflow experiment per sweep); an unknown experiment gets the
``generic`` report of whatever metrics are present. Registering a name twice raises.

    from reports.registry import get_report, register_report
    spec = get_report("troll_table1")        # ReportSpec(name, title, description, items)
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Literal

from analysis.claim_keys import ALL_CLAIMS  # imports nothing: listing reports stays cheap


@dataclass(frozen=True)
class Item:
    """One table or figure: ``target`` is ``"module:attr"``; ``uses_data=False`` builders take no runs."""

    kind: Literal["table", "figure"]
    target: str
    options: dict[str, Any] = field(default_factory=dict)
    uses_data: bool = True

    def builder(self):
        module, attr = self.target.split(":", 1)
        return getattr(importlib.import_module(module), attr)

    def build(self, data):
        fn = self.builder()
        return fn(data, **self.options) if self.uses_data else fn(**self.options)


@dataclass(frozen=True)
class ReportSpec:
    name: str
    title: str
    description: str
    items: tuple[Item, ...]

    def count(self, kind: str) -> int:
        return sum(1 for i in self.items if i.kind == kind)


_REPORTS: dict[str, ReportSpec] = {}


def register_report(spec: ReportSpec) -> ReportSpec:
    if spec.name in _REPORTS:
        raise ValueError(f"report {spec.name!r} is already registered")
    for item in spec.items:
        if item.kind not in ("table", "figure") or ":" not in item.target:
            raise ValueError(f"report {spec.name!r}: bad item {item!r} (kind table|figure, target 'module:attr')")
    _REPORTS[spec.name] = spec
    return spec


def get_report(experiment: str) -> ReportSpec:
    """The report registered for ``experiment``; the generic report for unknown names."""
    return _REPORTS.get(experiment, _REPORTS["generic"])


def report_names() -> list[str]:
    return sorted(_REPORTS)


def _t(target: str, uses_data: bool = True, **options) -> Item:
    return Item("table", f"analysis.tables.{target}", options, uses_data)


def _f(target: str, uses_data: bool = True, **options) -> Item:
    return Item("figure", f"analysis.figures.{target}", options, uses_data)


SETUP = _t("setup:setup_table")  # what the runs share: model, data, evaluation, budget, regime, code, machine
OVERVIEW = _t("generic:overview_table")
CONFIG_DIFF = _t("generic:config_diff_table")
SUCCESS = _f("curves:success_figure")
ENTROPY = _f("curves:entropy_figure")
CONTROLLERS = _f("controllers:controller_figure")  # ADAPO's eps_high, REPO-R's zeta and their caps
LENGTH = _f("curves:response_length_figure")
CLIP = _f("curves:clip_projection_figure")
TIMING = _f("timing:timing_figure")
TIMING_TABLE = _t("timing:timing_table")
SCALING = _t("scaling:scaling_table")
AGGREGATES = _t("aggregates:aggregate_table")  # IQM, mean, P(improvement) (arXiv 2108.13264)
LEARNING = _t("learning:learning_table")  # area under the evaluation curve, steps and CPU seconds to a target
EVAL_ERROR = _t("eval_error:eval_error_table")  # eval sampling error: prompts resampled, paired against the baseline
PAPER_NUMBERS = _t("paper_match:paper_numbers_table")  # the papers' numbers where an arm ran a paper table's setting


def _compare(tags: dict[str, str] | None = None, match: tuple[str, ...] = ()) -> Item:
    """The comparison with the sweep's baseline (``analysis.arms.Baseline``: tags, shared tags)."""
    return _t("compare:comparison_table", **({"baseline": {"tags": tags, "match": match}} if tags else {}))


def _claims(*keys: str, show_unchecked: bool = True) -> Item:
    return _t("claims:claims_table", claims=keys, show_unchecked=show_unchecked)


# each paper sweep's baseline and the claims its report checks (analysis/claim_checks.py)
TROLL_BASELINE = _compare({"objective": "!troll*"}, ("algorithm", "estimator", "mask", "entropy_control"))
TROLL_CLAIMS = _claims("troll_success", "troll_kl_bound")

register_report(
    ReportSpec(
        "generic",
        "Experiment report",
        "No dedicated report is registered for this experiment: final values and curves of every logged metric.",
        (
            SETUP,
            OVERVIEW,
            _compare(),
            PAPER_NUMBERS,
            EVAL_ERROR,
            AGGREGATES,
            LEARNING,
            _claims(*ALL_CLAIMS, show_unchecked=False),
            _t("generic:eval_start_end_table"),
            _t("generic:final_metrics_table"),
            _f("curves:all_metrics_figure"),
            CONTROLLERS,
            SCALING,
            TIMING_TABLE,
            CONFIG_DIFF,
        ),
    )
)
register_report(
    ReportSpec(
        "demo",
        "Demo sweep: GRPO with Clip, TROLL and TRM-Max, GTPO, REPO-R, DAPO and ADAPO on the embedded task",
        "The embedded default run end to end (a small warm-started model on generated arithmetic, 2 CPU cores): "
        "each method against GRPO over seeds, the papers' claims checked on the runs, success, entropy, response "
        "length, clipped vs projected tokens, TRM acceptance and time per phase.",
        (
            SETUP,
            OVERVIEW,
            _compare(),
            EVAL_ERROR,
            AGGREGATES,
            LEARNING,
            # every paper's headline claims; T-PPO's row says which sweep runs it
            _claims(*ALL_CLAIMS),
            _t("generic:eval_start_end_table"),
            _t(
                "generic:final_metrics_table",
                metrics=["critic/score/mean", "actor/entropy", "response_length/mean", "timing_s/step"],
            ),
            SUCCESS,
            ENTROPY,
            CONTROLLERS,
            LENGTH,
            CLIP,
            _f("trm:acceptance_figure"),
            # no reward-vs-compute fit: its 5 evaluations are fewer than the fit needs (analysis.scaling.MIN_POINTS)
            TIMING,
            TIMING_TABLE,
            CONFIG_DIFF,
        ),
    )
)
register_report(
    ReportSpec(
        "troll_table1",
        "TROLL vs Clip across advantage estimators",
        "Reproduces TROLL (arXiv 2510.03817) Table 1 (final train/eval success per estimator, Clip vs TROLL), its training curves "
        "(Figures 8-9), the token statistics of Figure 18 and the overhead of Table 5; TROLL is compared with Clip "
        "of the same estimator over seeds and its trust-region claim is checked.",
        (
            SETUP,
            OVERVIEW,
            _t("troll:troll_table1"),
            TROLL_BASELINE,
            TROLL_CLAIMS,
            _t("troll:troll_table5"),
            SUCCESS,
            CLIP,
            LENGTH,
            ENTROPY,
            SCALING,
            TIMING,
            TIMING_TABLE,
            CONFIG_DIFF,
        ),
    )
)
register_report(
    ReportSpec(
        "troll_table4",
        "TROLL vs Clip on the individual MATH benchmarks",
        "Reproduces TROLL (arXiv 2510.03817) Table 4 (AIME24, AIME25, AMC, MATH500, Omni-Math, OlympiadBench, Minerva).",
        (SETUP, OVERVIEW, _t("troll:troll_table4"), TROLL_BASELINE, TROLL_CLAIMS, SUCCESS, SCALING, CONFIG_DIFF),
    )
)
register_report(
    ReportSpec(
        "troll_table5",
        "Memory and runtime overhead of TROLL",
        "Reproduces TROLL (arXiv 2510.03817) Table 5 (peak memory and time per iteration of Clip, TROLL and chunked TROLL).",
        (SETUP, OVERVIEW, _t("troll:troll_table5"), TROLL_BASELINE, TROLL_CLAIMS, TIMING, TIMING_TABLE, CONFIG_DIFF),
    )
)
register_report(
    ReportSpec(
        "entropy_tables",
        "Entropy-preserving policy updates",
        "Reproduces Entropy-preserving RL (arXiv 2603.11682) Tables 1-4 (score at the best checkpoint, best score, entropy change) and the entropy "
        "dynamics of Figures 1 and 6; every method against GRPO over seeds; REPO-R's and ADAPO's claims checked.",
        (
            SETUP,
            OVERVIEW,
            _t("entropy:entropy_table"),
            _compare({"algorithm": "grpo", "entropy_control": "none"}),
            _claims("repo_r_entropy", "adapo_success"),
            ENTROPY,
            SUCCESS,
            LENGTH,
            SCALING,
            CONFIG_DIFF,
        ),
    )
)
register_report(
    ReportSpec(
        "tppo_table1",
        "Truncated PPO: accuracy and efficiency",
        "Reproduces T-PPO (arXiv 2506.15050) Table 1 (AIME24 avg@N), the per-phase time breakdown of Figure 4, the Roofline of Figure 5 "
        "and the response-length dynamics of Figure 6; checks the time-to-reward claim against PPO.",
        (
            SETUP,
            OVERVIEW,
            _t("tppo:tppo_table1"),
            _compare({"algorithm": "ppo", "objective": "!troll*"}),
            _claims("tppo_time"),
            TIMING,
            TIMING_TABLE,
            _f("roofline:roofline_figure"),
            LENGTH,
            SUCCESS,
            SCALING,
            CONFIG_DIFF,
        ),
    )
)
register_report(
    ReportSpec(
        "trm_acceptance",
        "Trust Region Masking: acceptance, PPL gap and error bounds",
        "Reproduces TRM (arXiv 2512.23075) Table D.1 (acceptance vs length), the bound comparison of Table 1 / section 6.3, the monitoring "
        "curves of Figures 1-3, and evaluates the bounds at the runs' measured divergence; checks TRM-Max's bound and "
        "stability claims, with its length bias shown.",
        (
            SETUP,
            OVERVIEW,
            _t("trm:trm_table_d1", uses_data=False),
            _t("trm:trm_acceptance_table"),
            _claims("trm_bound"),
            _t("trm:trm_bounds_table", uses_data=False),
            _t("trm:trm_run_bounds_table"),
            _compare({"mask": "none", "rollout_correction": "none"}, ("algorithm",)),
            _f("trm:acceptance_figure"),
            _f("trm:acceptance_by_length_figure"),
            _f("bounds:bounds_figure"),
            SUCCESS,
            CONFIG_DIFF,
        ),
    )
)


def register_variant(base: str, name: str, note: str) -> ReportSpec:
    """Register ``name`` (e.g. a sweep's CPU-scale version) with the items of the report ``base``."""
    spec = _REPORTS[base]
    return register_report(ReportSpec(name, f"{spec.title} ({note})", spec.description, spec.items))


# the CPU-scale sweeps of sweeps/*_cpu.yaml get their paper's report
for _base in ("troll_table1", "entropy_tables", "tppo_table1", "trm_acceptance"):
    register_variant(_base, f"{_base}_cpu", "CPU scale")


# the stability map: every method against GRPO within each off-policy regime (sweeps/stability_map_cpu.yaml)
register_report(
    ReportSpec(
        "stability_map",
        "Stability map: trust-region methods against GRPO across off-policy regimes",
        "Each method against GRPO within each off-policy regime (on-policy, multi-epoch, stale rollouts, a bfloat16 "
        "sampler): the final pass@1 as IQM and P(improvement) with stratified-bootstrap intervals (arXiv 2108.13264), "
        "a paired-by-seed verdict that says when the seeds cannot decide and how many would (seed variance: arXiv "
        "2504.07086), how often each arm's runs become unstable (entropy or reward collapse, training-inference gap "
        "blow-up, an entropy controller pinned at a cap), and the papers' claims read per regime.",
        (
            SETUP,
            OVERVIEW,
            _t("stability:score_map_table"),
            _f("stability:score_map_figure"),
            _t("stability:stability_table"),
            _f("stability:stability_figure"),
            # the score map's answers, then each paper claim checked on each regime's runs alone
            _t("stability:regime_claims_table"),
            AGGREGATES,
            _compare(),
            _claims(*ALL_CLAIMS, show_unchecked=False),
            _f("stability:regime_curves_figure"),
            ENTROPY,
            CONTROLLERS,
            CONFIG_DIFF,
        ),
    )
)
register_variant("stability_map", "stability_map_cpu", "CPU scale")
