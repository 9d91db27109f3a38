"""How trustbench's experiments open in the MLflow UI: on their training runs, grouped by method.

MLflow 3's UI treats an experiment as a GenAI one (opening it on a trace "Overview") or as a
machine-learning one (opening it on its runs table):

- every trustbench experiment carries MLflow's experiment-kind tag, ``mlflow.experimentKind =
  custom_model_development`` (the kind the UI's selector names "Machine learning"); MLflow 3.17's
  landing page follows the browser's workflow switch ("GenAI" by default) rather than the tag, so
- ``runs_page_url`` is the runs page itself with ``workflowType=machine_learning`` (the page
  ``trustbench ui`` prints), and
- every experiment carries one shared view of its runs table (MLflow's ``viewStateShareKey``,
  stored as the experiment tag ``mlflow.sharedViewState.<key>``): runs grouped by their ``method``
  tag, with the seed, regime, model and dataset tags as columns. The URL opens it.

Run names start with the method and the seed (``runners.config.run_name``), so the narrow name
column shows both. The tags are set when trustbench creates an experiment and when it next uses an
existing one (``runners.tracking.get_or_create_experiment``). Reports live in an experiment of their
own (``REPORTS_EXPERIMENT``, ``reports.mlflow_log``), out of the runs they compare.

Imports neither mlflow nor torch.
"""

from __future__ import annotations

import json
from urllib.parse import urlencode

from runners import metric_names

TAG_EXPERIMENT_KIND = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
VIEW_KEY = "trustbench-by-method"
TAG_VIEW = f"mlflow.sharedViewState.{VIEW_KEY}"
# the experiment holding one run per report (named after the reported experiment)
REPORTS_EXPERIMENT = "trustbench reports"
# tag columns of the runs view, after the run name
VIEW_COLUMNS = (metric_names.TAG_SEED, metric_names.TAG_REGIME, metric_names.TAG_MODEL, metric_names.TAG_DATASET)


def runs_view(group_by: str | None = metric_names.TAG_METHOD) -> str:
    """The shared view state (JSON, as MLflow's runs page stores it): grouped by tag ``group_by``."""
    state: dict = {"selectedColumns": [f"tags.`{tag}`" for tag in VIEW_COLUMNS]}
    if group_by:
        state["groupBy"] = {"aggregateFunction": "average", "groupByKeys": [{"mode": "tag", "groupByData": group_by}]}
    return json.dumps(state, separators=(",", ":"))


def experiment_tags(group_by: str | None = metric_names.TAG_METHOD) -> dict[str, str]:
    """The tags of a trustbench experiment: MLflow's experiment kind and the runs view."""
    return {TAG_EXPERIMENT_KIND: EXPERIMENT_KIND, TAG_VIEW: runs_view(group_by)}


def tag_experiment(client, experiment, group_by: str | None = metric_names.TAG_METHOD) -> None:
    """Set the tags of ``experiment`` (an MLflow ``Experiment``) that it lacks or holds otherwise."""
    for key, value in experiment_tags(group_by).items():
        if (experiment.tags or {}).get(key) != value:
            client.set_experiment_tag(experiment.experiment_id, key, value)


def runs_page_url(base_url: str, experiment_id: str, view: bool = True) -> str:
    """The runs page of an experiment in the MLflow UI at ``base_url`` (``http://127.0.0.1:5000``),
    as a machine-learning experiment, in trustbench's view (``view``) of it."""
    query = {"workflowType": "machine_learning"}
    if view:
        query["viewStateShareKey"] = VIEW_KEY
    return f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs?{urlencode(query)}"


def ui_experiment(client, name: str | None = None):
    """The experiment ``trustbench ui`` points at: ``name`` (None if it does not exist), else the one
    whose newest run started last (reports and MLflow's empty Default left out; None: no run yet).
    It gets the tags of its runs view if it lacks them."""
    if name is not None:
        exp = client.get_experiment_by_name(name)
        if exp is None or exp.lifecycle_stage != "active":
            return None
    else:
        ids = [e.experiment_id for e in client.search_experiments() if e.name != REPORTS_EXPERIMENT]
        newest = client.search_runs(ids, order_by=["attributes.start_time DESC"], max_results=1) if ids else []
        if not newest:
            return None
        exp = client.get_experiment(newest[0].info.experiment_id)
    tag_experiment(client, exp, None if exp.name == REPORTS_EXPERIMENT else metric_names.TAG_METHOD)
    return exp
