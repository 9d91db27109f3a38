"""Which rows of the papers' tables describe the same setting as an arm of a sweep.

A sweep without a dedicated report (a user's own sweep of Qwen3-8B with GRPO and TROLL on DAPO-Math) can
still contain arms that ran exactly a setting a paper reports. ``paper_matches(data)`` finds them, so the
generic report prints the paper's number beside ours there, and nowhere else.

An arm (``analysis.arms.run_labels``) matches a row of a paper table when every key of that table agrees:

- **model**: our ``model`` tag and the paper's model name are the same name (``analysis.names.match_name``:
  ``qwen3_8b`` = ``Qwen/Qwen3-8B`` = "Qwen3-8B"; ``qwen3_8b_base`` or ``qwen3_4b`` are not). No nearest model
  is ever substituted (the paper tables' own fallback to a default model is not used here);
- **method**: the paper name of the arm's ``algorithm`` tag (``analysis.names.algorithm_name``) is the paper's
  method, and the run's components are its preset's own, as the run logged them (the params
  ``algorithm.components.<group>``): the preset's estimator (a run without an ``estimator`` tag takes the
  preset's), mask and entropy control, and no rollout correction; runs that did not log them are not matched;
- **objective**: the preset's own policy objective is the TROLL paper's "Clip" (GSPO's is its sequence clip,
  DAPO's its clip-higher); TROLL's objective for that preset (``troll``, for GSPO ``troll_seq``) is "TROLL".
  A table without an objective column (Entropy-preserving RL, T-PPO) reports each method with its own
  objective, so only "Clip" arms match it;
- **benchmark**: the paper's benchmark maps to a key of ``analysis.names.EVAL_ALIASES`` and the sweep logs
  ``val-core/<data>/acc/mean_at_<n>`` for a ``<data>`` named as that benchmark (``find_eval``), with a
  final value in the arm's runs. The in-domain fallback of ``analysis.tables.common.resolve_eval`` is not
  used: an evaluation set named otherwise is not taken for the paper's;
- **training data**, where the paper names it: DAPO-Math for TROLL (arXiv 2510.03817) Tables 1 and 4,
  AppWorld for Entropy-preserving RL (arXiv 2603.11682) Tables 1-2 (our ``dataset`` tag, any spelling of
  the name). The AIME tables of Entropy-preserving RL and T-PPO's table are not keyed on it (the
  transcription in ``analysis/data`` names only the evaluation), which the report's caption says;
- **rollouts**: the arm's ``regime`` tag has no stale rollouts and no sampler at another precision than the
  model (the papers' runs sample from the current policy); a run without the tag is taken as on-policy.

All runs of an arm must agree on these tags; an arm whose runs differ is never matched.

``PAPER_KEYS`` is the one mapping from a paper table to its key columns and how our tags map to them
(paper column -> what of ours it is compared with):

- ``troll_table1``: ``model`` -> model tag; ``method`` / ``objective`` -> preset and Clip/TROLL; ``split`` ->
  evaluation set (DAPO Eval: dapo_eval, MATH Eval: math_eval; DAPO Train is training success, not an
  evaluation: never matched); trained on DAPO-Math;
- ``troll_table4``: as Table 1, ``benchmark`` -> evaluation set (AIME24, AIME25, AMC, MATH = math500,
  Omni-Math, Olympiad, Minerva); trained on DAPO-Math;
- ``entropy_tables`` (two entries: the AppWorld rows of Tables 1-2, the AIME rows of Tables 3-4; the ``mean``
  rows, with the ``std`` rows beside them): ``model`` -> model tag; ``algorithm`` -> preset with its own
  objective; ``test_set`` -> evaluation set (Test Normal, Test Challenge; AIME 2024, AIME 2025); Tables 1-2
  trained on AppWorld;
- ``tppo_table1``: the model is fixed (Qwen2.5-32B, the table's header), the benchmark too (AIME24, the
  paper's percent / 100); ``method`` -> preset with its own objective, T-PPO only: the other rows are other
  systems' published scores (its DAPO row is the DAPO system, with dynamic sampling and overlong reward
  shaping that our ``dapo`` preset, clip-higher with token-mean, does not have).

Not matched: TROLL Table 5 (memory and time on the paper's hardware, not an evaluation) and the TRM tables
(analytical bounds, not runs). ``paper_matches`` returns one tidy row per (arm, paper cell).

    from analysis.paper_match import paper_matches
    paper_matches(data)[["arm", "metric", "title", "method", "objective", "benchmark", "value"]]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis.aggregate import final_evals
from analysis.arms import run_labels, run_params
from analysis.frames import LABEL_TAGS, ExperimentData
from analysis.names import algorithm_name, find_eval, match_name, norm
from analysis.paper_data import paper_source, paper_table
from runners import metric_names

CLIP, TROLL = "Clip", "TROLL"


# the component groups a run's algorithm preset declares (``conf/algorithm/<preset>.yaml``: ``algorithm.components``,
# logged by every run as the ``algorithm.components.<group>`` params): a paper method is its preset with these
# components unswapped
COMPONENT_GROUPS = ("estimator", "objective", "mask", "entropy_control")
# the objective of a preset's TROLL variant (TROLL, arXiv 2510.03817, eq. 5): ``troll``, or the sequence form for
# a preset whose own objective is sequence-level (``conf/method/gspo_troll.yaml``)
TROLL_OF = {"gspo": "troll_seq"}


def component_param(group: str) -> str:
    return f"algorithm.components.{group}"


# the canonical keys of a paper row (``PaperKeys.columns`` / ``PaperKeys.fixed`` give each one)
KEYS = ("model", "method", "objective", "benchmark")


@dataclass(frozen=True)
class PaperKeys:
    """How the rows of one paper table are matched (module docstring)."""

    table: str  # analysis/data/<table>.csv
    title: str  # the printed table, formatted with the paper row (e.g. "{table}" of entropy_tables)
    columns: Mapping[str, str]  # canonical key (KEYS) -> the paper's column holding it
    benchmarks: Mapping[str, str]  # the paper's benchmark -> key of analysis.names.EVAL_ALIASES
    statistic: str  # what the paper's number is
    differs: str  # what a match does not control (for the caption)
    value: str = "value"
    fixed: Mapping[str, str] = field(default_factory=dict)  # canonical key -> the one value the table has
    rows: Mapping[str, str] = field(default_factory=dict)  # the paper rows kept (column -> value)
    std_rows: Mapping[str, str] = field(default_factory=dict)  # where its std is, beside those rows
    train_data: tuple[str, ...] | None = None  # our dataset tags it trained on (any spelling); None: not keyed
    scale: float = 1.0  # the paper's unit -> pass@1 in [0, 1]
    methods: tuple[str, ...] | None = None  # the paper's methods that are ours (None: every method)
    digits: int = 3  # as printed in the paper


DAPO_MATH = ("dapo_math", "dapo_math_17k", "DAPO-Math-17k")
TROLL_DIFFERS = (
    "batch size, learning rate and response length against the paper's (TROLL, arXiv 2510.03817, Table 3) and the "
    "size of the evaluation set"
)
ENTROPY_DIFFERS = (
    "the statistic: the paper's score is at each run's best checkpoint (arXiv 2603.11682, appendix C.3), ours at "
    "its last evaluation; the context (the AIME tables: 4K tokens) and hyperparameters"
)


def _entropy_keys(benchmark: str, tests: dict[str, str], train_data: tuple[str, ...] | None) -> PaperKeys:
    """The rows of Entropy-preserving RL's tables on ``benchmark`` (Tables 1-2: AppWorld; 3-4: AIME), mean rows
    with their std rows beside them; keyed on the training data only where the transcription names it."""
    differs = (
        ENTROPY_DIFFERS
        if train_data
        else ENTROPY_DIFFERS + "; the training data (the tables name only the AIME evaluation)"
    )
    return PaperKeys(
        "entropy_tables",
        "Entropy-preserving RL (arXiv 2603.11682) Table {table}",
        {"model": "model", "method": "algorithm", "benchmark": "test_set"},
        tests,
        "score at the best checkpoint, mean ± std over three seeds",
        differs,
        rows={"benchmark": benchmark, "stat": "mean"},
        std_rows={"stat": "std"},
        train_data=train_data,
        digits=2,
    )


PAPER_KEYS: tuple[PaperKeys, ...] = (
    PaperKeys(
        "troll_table1",
        "TROLL (arXiv 2510.03817) Table 1",
        {"model": "model", "method": "method", "objective": "objective", "benchmark": "split"},
        {"DAPO Eval": "dapo_eval", "MATH Eval": "math_eval"},
        "final evaluation success rate",
        TROLL_DIFFERS,
        train_data=DAPO_MATH,
    ),
    PaperKeys(
        "troll_table4",
        "TROLL (arXiv 2510.03817) Table 4",
        {"model": "model", "method": "method", "objective": "objective", "benchmark": "benchmark"},
        {
            "AIME24": "aime24",
            "AIME25": "aime25",
            "AMC": "amc",
            "MATH": "math500",
            "Omni-Math": "omni_math",
            "Olympiad": "olympiad",
            "Minerva": "minerva",
        },
        "final success rate on the benchmark",
        TROLL_DIFFERS,
        train_data=DAPO_MATH,
    ),
    _entropy_keys("AppWorld", {"Test Normal": "test_normal", "Test Challenge": "test_challenge"}, ("appworld",)),
    _entropy_keys("AIME", {"AIME 2024": "aime24", "AIME 2025": "aime25"}, None),
    PaperKeys(
        "tppo_table1",
        "T-PPO (arXiv 2506.15050) Table 1",
        {"method": "method"},
        {"AIME24": "aime24"},
        "AIME24 avg@32 (the paper's percent / 100)",
        "the training data and hyperparameters; the paper averages 32 samples per problem, ours the N of mean_at_N",
        value="aime24_avg32_pct",
        fixed={"model": "Qwen2.5-32B", "benchmark": "AIME24"},
        scale=0.01,
        digits=2,
        methods=("T-PPO",),
    ),
)

# what the report says was looked for when nothing matches
LOOKED_FOR = "TROLL Table 1/4, Entropy-preserving RL Tables 1-4, T-PPO Table 1"

MATCH_COLUMNS = [
    "arm",
    "metric",
    "table",
    "title",
    "model",
    "method",
    "objective",
    "benchmark",
    "statistic",
    "value",
    "std",
    "digits",
    "differs",
    "source",
    "run_ids",
]

# the tags an arm's runs must agree on to be matched at all: every label tag but the run's own (method label,
# seed, backend, sweep)
SETTING_TAGS = tuple(
    t
    for t in LABEL_TAGS
    if t not in (metric_names.TAG_METHOD, metric_names.TAG_SEED, metric_names.TAG_BACKEND, metric_names.TAG_SWEEP)
)


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def arm_settings(data: ExperimentData, labels: pd.DataFrame) -> dict[str, dict[str, str] | None]:
    """{arm: its SETTING_TAGS and preset components (``component_param``)} (``run_labels`` rows); None for an
    arm whose runs disagree on them."""
    labels = labels.copy()
    keys = [*SETTING_TAGS, *map(component_param, COMPONENT_GROUPS)]
    for group in COMPONENT_GROUPS:
        logged = run_params(data, component_param(group))
        labels[component_param(group)] = [logged.get(str(r), "") for r in labels["run_id"]]
    out: dict[str, dict[str, str] | None] = {}
    for arm, g in labels.groupby("arm", sort=True):
        settings = {tuple(_text(v) for v in row) for row in g[keys].itertuples(index=False)}
        out[str(arm)] = dict(zip(keys, settings.pop())) if len(settings) == 1 else None
    return out


def fresh_rollouts(regime: str) -> bool:
    """True unless the regime tag names stale rollouts or a sampler at another precision (``regime_label``)."""
    return "stale" not in regime and "sampler" not in regime


def paper_identity(setting: Mapping[str, str]) -> tuple[str, str] | None:
    """(the paper's method name, "Clip" or "TROLL") of an arm's setting; None when it is no paper method: a
    component swapped from its preset's (or not logged), a rollout correction, or stale / other-precision rollouts."""
    own = {group: setting[component_param(group)] for group in COMPONENT_GROUPS}
    if not all(own.values()):  # runs that did not log their preset's components: never matched
        return None
    if setting[metric_names.TAG_ESTIMATOR] not in ("", own["estimator"]):
        return None
    if (
        setting[metric_names.TAG_MASK] != own["mask"]
        or setting[metric_names.TAG_ENTROPY_CONTROL] != own["entropy_control"]
        or setting[metric_names.TAG_ROLLOUT_CORRECTION] != "none"
        or not fresh_rollouts(setting[metric_names.TAG_REGIME])
    ):
        return None
    troll = TROLL_OF.get(own["objective"], "troll")
    objective = {own["objective"]: CLIP, troll: TROLL}.get(setting[metric_names.TAG_OBJECTIVE])
    if objective is None:
        return None
    return algorithm_name(setting[metric_names.TAG_ALGORITHM]), objective


def paper_rows(spec: PaperKeys) -> pd.DataFrame:
    """The rows of ``spec.table`` it matches on: the canonical KEYS, title, value and std (NaN if none)."""
    paper = paper_table(spec.table)
    keep = np.ones(len(paper), dtype=bool)
    for col, want in spec.rows.items():
        keep &= (paper[col].astype(str) == want).to_numpy()
    rows = paper[keep]
    std = pd.Series(np.nan, index=rows.index)
    if spec.std_rows:
        key_cols = [c for c in paper.columns if c not in (spec.value, *spec.std_rows)]
        where = {**spec.rows, **spec.std_rows}
        mask = np.logical_and.reduce([(paper[c].astype(str) == v).to_numpy() for c, v in where.items()])
        lookup = {tuple(r[key_cols].astype(str)): float(r[spec.value]) for _, r in paper[mask].iterrows()}
        std = pd.Series(
            [lookup.get(tuple(r[key_cols].astype(str)), np.nan) for _, r in rows.iterrows()], index=rows.index
        )
    out = pd.DataFrame(index=rows.index)
    for key in KEYS:
        out[key] = rows[spec.columns[key]].astype(str) if key in spec.columns else spec.fixed.get(key, "")
    out["title"] = [spec.title.format(**r) for r in rows.to_dict("records")]
    out["value"] = pd.to_numeric(rows[spec.value], errors="coerce") * spec.scale
    out["std"] = std * spec.scale
    return out[out["value"].notna()].reset_index(drop=True)


def _trained_on(spec: PaperKeys, dataset: str) -> bool:
    return spec.train_data is None or norm(dataset) in {norm(d) for d in spec.train_data}


def _arm_cells(spec: PaperKeys, paper: pd.DataFrame, setting: Mapping[str, str]) -> pd.DataFrame:
    """The paper rows of ``spec`` with the arm's model, method and objective (before the benchmark)."""
    identity = paper_identity(setting)
    if identity is None or not _trained_on(spec, setting[metric_names.TAG_DATASET]):
        return paper.iloc[:0]
    method, objective = identity
    if spec.methods is not None and method not in spec.methods:
        return paper.iloc[:0]
    if "objective" not in spec.columns:
        if objective != CLIP:
            return paper.iloc[:0]
        objective = ""
    model = match_name(setting[metric_names.TAG_MODEL], sorted(set(paper["model"])))
    if model is None:
        return paper.iloc[:0]
    return paper[(paper["model"] == model) & (paper["method"] == method) & (paper["objective"] == objective)]


class _Evaluated:
    """Which arms have a final value of a metric (``final_evals``, computed once per metric)."""

    def __init__(self, data: ExperimentData, labels: pd.DataFrame) -> None:
        self.data, self.labels, self.cache = data, labels[["run_id", "arm"]], {}

    def arms(self, metric: str) -> set[str]:
        if metric not in self.cache:
            finals = final_evals(self.data, metric).merge(self.labels, on="run_id")
            finite = np.isfinite(finals["value"].to_numpy(dtype=float))
            self.cache[metric] = set(finals.loc[finite, "arm"].astype(str))
        return self.cache[metric]


def paper_matches(data: ExperimentData, tables: list[str] | tuple[str, ...] | None = None) -> pd.DataFrame:
    """One row per (arm, paper cell) of the same setting (module docstring); columns ``MATCH_COLUMNS``.

    ``tables`` restricts the paper tables looked at (names of ``analysis/data/*.csv``)."""
    labels = run_labels(data)
    names = data.metric_names()
    settings = arm_settings(data, labels)
    run_ids = {str(a): tuple(g["run_id"].astype(str)) for a, g in labels.groupby("arm")}
    evaluated = _Evaluated(data, labels)
    rows = []
    for spec in PAPER_KEYS:
        if tables is not None and spec.table not in tables:
            continue
        paper = paper_rows(spec)
        for arm, setting in settings.items():
            if setting is None:
                continue
            for cell in _arm_cells(spec, paper, setting).to_dict("records"):
                metric = (
                    find_eval(names, spec.benchmarks[cell["benchmark"]])
                    if cell["benchmark"] in spec.benchmarks
                    else None
                )
                if metric is None or arm not in evaluated.arms(metric):
                    continue
                rows.append(
                    {
                        **cell,
                        "arm": arm,
                        "metric": metric,
                        "table": spec.table,
                        "statistic": spec.statistic,
                        "digits": spec.digits,
                        "differs": spec.differs,
                        "source": paper_source(spec.table),
                        "run_ids": run_ids[arm],
                    }
                )
    # grouped by arm (sorted), each arm's cells in the order of PAPER_KEYS and of the paper's rows
    return pd.DataFrame(rows, columns=MATCH_COLUMNS).sort_values("arm", kind="stable").reset_index(drop=True)


def unmatched_arms(data: ExperimentData) -> list[str]:
    """Arms never matched because their runs disagree on a SETTING_TAGS tag (the table's notes name them)."""
    return [arm for arm, setting in arm_settings(data, run_labels(data)).items() if setting is None]
