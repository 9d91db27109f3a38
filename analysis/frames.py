"""The tidy data every table and figure is built from: one run frame and one long metric frame.

Design: MLflow data is held as two pandas frames rather than one wide frame, so a sweep of
100 runs x 10 metrics x 1000 steps stays ~1M small rows instead of 1M rows x every param:

- ``runs``: one row per run. Columns ``run_id, experiment, experiment_id, run_name, status,
  start_time, end_time`` (ms since epoch) and, following ``mlflow.search_runs``'s convention,
  ``tags.<name>`` and ``params.<dotted.key>`` (strings).
- ``metrics``: one row per logged point. Columns ``run_id, metric, step, value, timestamp``
  (``run_id`` and ``metric`` categorical, ``step``/``timestamp`` int64, ``value`` float64).

``ExperimentData.tidy()`` joins them into the single long frame the analysis code uses
(run_id, the run tags of ``runners.metric_names`` as columns, optionally params, step, metric, value,
timestamp), adding a display ``method`` label and an integer ``seed``.

    from analysis import load_experiment
    data = load_experiment("troll_table1")
    df = data.tidy()          # columns: run_id, method, algorithm, ..., seed, metric, step, value, timestamp
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from runners import metric_names

RUN_COLUMNS = ["run_id", "experiment", "experiment_id", "run_name", "status", "start_time", "end_time"]
METRIC_COLUMNS = ["run_id", "metric", "step", "value", "timestamp"]

# Run tags that become columns of the tidy frame (display label first).
LABEL_TAGS = [
    metric_names.TAG_METHOD,
    metric_names.TAG_ALGORITHM,
    metric_names.TAG_ESTIMATOR,
    metric_names.TAG_OBJECTIVE,
    metric_names.TAG_MASK,
    metric_names.TAG_ENTROPY_CONTROL,
    metric_names.TAG_ROLLOUT_CORRECTION,
    metric_names.TAG_REGIME,
    metric_names.TAG_MODEL,
    metric_names.TAG_DATASET,
    metric_names.TAG_SEED,
    metric_names.TAG_BACKEND,
    metric_names.TAG_SWEEP,
]

# Tag marking the run that holds a report's artifacts (excluded from analysis).
TAG_REPORT = "trustbench.report"


def empty_runs() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="object") for c in RUN_COLUMNS})


def empty_metrics() -> pd.DataFrame:
    return normalize_metrics(pd.DataFrame({c: [] for c in METRIC_COLUMNS}))


def normalize_metrics(df: pd.DataFrame) -> pd.DataFrame:
    """Coerce a metric frame to the canonical columns and dtypes (NaN strings -> float NaN).

    Columns already in their canonical dtype are kept as they are (a cached 1M-row frame costs
    nothing here; converting categories back to strings would cost seconds).
    """
    out = {}
    for col in ("run_id", "metric"):
        x = df[col]
        if not isinstance(x.dtype, pd.CategoricalDtype):
            x = x.astype(str).astype("category")
        out[col] = x
    for col, dtype in (("step", "int64"), ("value", "float64"), ("timestamp", "int64")):
        x = df[col]
        if x.dtype != dtype:
            x = pd.to_numeric(x, errors="coerce" if col == "value" else "raise").astype(dtype)
        out[col] = x
    return pd.DataFrame({c: out[c].reset_index(drop=True) for c in METRIC_COLUMNS})


def method_label(row: pd.Series) -> str:
    """Display label of a run: the ``method`` tag, else algorithm(+objective), else the run name."""
    value = row.get(f"tags.{metric_names.TAG_METHOD}")
    if isinstance(value, str) and value:
        return value
    algorithm = row.get(f"tags.{metric_names.TAG_ALGORITHM}")
    objective = row.get(f"tags.{metric_names.TAG_OBJECTIVE}")
    if isinstance(algorithm, str) and algorithm:
        if isinstance(objective, str) and objective and objective not in ("clip", algorithm):
            return f"{algorithm}+{objective}"
        return algorithm
    name = row.get("run_name")
    return name if isinstance(name, str) and name else str(row["run_id"])[:8]


@dataclass
class ExperimentData:
    """Runs and metric points of one or more MLflow experiments (see module docstring)."""

    runs: pd.DataFrame
    metrics: pd.DataFrame
    # what the loader fetched and from where (``analysis.load``)
    load_info: dict = field(default_factory=dict)

    def labels(self) -> pd.DataFrame:
        """One row per run: run_id, every LABEL_TAGS column (method filled in), seed as int (-1 if absent)."""
        runs = self.runs
        out = pd.DataFrame({"run_id": runs["run_id"].astype(str).to_numpy()})
        for tag in LABEL_TAGS:
            col = f"tags.{tag}"
            out[tag] = runs[col].to_numpy() if col in runs else None
        out[metric_names.TAG_METHOD] = [method_label(r) for _, r in runs.iterrows()] if len(runs) else []
        seeds = pd.to_numeric(out[metric_names.TAG_SEED], errors="coerce")
        if seeds.isna().any() and "params.seed" in runs:
            seeds = seeds.fillna(pd.to_numeric(runs["params.seed"], errors="coerce").reset_index(drop=True))
        out[metric_names.TAG_SEED] = seeds.fillna(-1).astype("int64")
        for col in ("experiment", "run_name", "status"):
            out[col] = runs[col].to_numpy() if col in runs else None
        return out

    def code_versions(self) -> list[tuple[str, int]]:
        """The code the runs came from: (``metric_names.code_version_label``: package version @ git
        revision, number of runs), most runs first; runs that recorded neither count as ``unrecorded``."""

        def column(tag: str) -> list:
            col = f"tags.{tag}"
            return list(self.runs[col]) if col in self.runs else [None] * len(self.runs)

        labels = [
            metric_names.code_version_label(v if isinstance(v, str) else None, r if isinstance(r, str) else None)
            for v, r in zip(column(metric_names.TAG_PACKAGE_VERSION), column(metric_names.TAG_GIT_REVISION))
        ]
        counts = pd.Series(labels, dtype="object").value_counts(sort=False)
        return sorted(((str(k), int(n)) for k, n in counts.items()), key=lambda kv: (-kv[1], kv[0]))

    def tidy(self, params: bool | list[str] = False) -> pd.DataFrame:
        """The single long frame: labels of each run joined onto its metric points.

        ``params=True`` adds every ``params.*`` column; a list adds only those dotted keys.
        """
        labels = self.labels()
        if params is not False and len(self.runs):
            cols = [c for c in self.runs.columns if c.startswith("params.")]
            if params is not True:
                wanted = {f"params.{p}" for p in params}
                missing = wanted - set(cols)
                if missing:
                    raise KeyError(f"params not logged by any run: {sorted(missing)}")
                cols = [c for c in cols if c in wanted]
            labels = labels.join(self.runs[cols].reset_index(drop=True))
        metrics = self.metrics.copy()
        metrics["run_id"] = metrics["run_id"].astype(str)
        df = metrics.merge(labels, on="run_id", how="inner")
        front = ["run_id", *[c for c in labels.columns if c != "run_id"]]
        return df[front + ["metric", "step", "value", "timestamp"]]

    def metric_names(self) -> list[str]:
        return sorted(map(str, self.metrics["metric"].unique()))

    def series(self, run_id: str, metric: str) -> pd.Series:
        """Values of one metric of one run indexed by step (last logged value wins on repeats)."""
        m = self.metrics
        sel = m[(m["run_id"] == run_id) & (m["metric"] == metric)].sort_values(["step", "timestamp"])
        return sel.drop_duplicates("step", keep="last").set_index("step")["value"]

    def select(self, **tags: object) -> ExperimentData:
        """Runs whose label columns equal the given values (e.g. ``select(objective="troll")``)."""
        labels = self.labels()
        keep = np.ones(len(labels), dtype=bool)
        for key, value in tags.items():
            if key not in labels:
                raise KeyError(f"unknown run label {key!r}; valid: {', '.join(labels.columns)}")
            keep &= (labels[key] == value).to_numpy()
        return self.subset(labels.loc[keep, "run_id"])

    def subset(self, run_ids) -> ExperimentData:
        """The runs whose id is in ``run_ids`` and their metric points (e.g. the runs of one regime)."""
        ids = {str(r) for r in run_ids}
        runs = self.runs[self.runs["run_id"].astype(str).isin(ids)].reset_index(drop=True)
        metrics = self.metrics[self.metrics["run_id"].astype(str).isin(ids)].reset_index(drop=True)
        return ExperimentData(runs=runs, metrics=metrics, load_info=dict(self.load_info))
