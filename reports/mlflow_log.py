"""Log a built report directory to MLflow, as artifacts of the report's run in the reports experiment.

The runs of a report live in an experiment of their own, ``runners.mlflow_ui.REPORTS_EXPERIMENT``
("trustbench reports"): one run per reported experiment, named after it and tagged
``trustbench.report=<experiment>`` (created on first use, reused after, so rebuilding a report
overwrites the same artifact paths instead of adding runs). The experiment's own runs table then
holds its training runs only, and the reports experiment lists every report of the store.

A store written before reports moved holds a "report" run (tag ``trustbench.report=1``) inside the
experiment itself: it is deleted (MLflow's soft delete, out of the runs table) once the report is
in the reports experiment. ``analysis.load_experiment`` leaves runs with the tag out of every table
and figure either way.
"""

from __future__ import annotations

from pathlib import Path

from analysis.frames import TAG_REPORT
from runners.mlflow_ui import REPORTS_EXPERIMENT, tag_experiment


def report_run(client, experiment: str) -> str:
    """The run id of ``experiment``'s report in the reports experiment, created if missing."""
    from runners.tracking import get_or_create_experiment

    reports_id = get_or_create_experiment(client.tracking_uri, REPORTS_EXPERIMENT, group_by=None)
    quoted = experiment.replace("'", "\\'")
    found = client.search_runs([reports_id], filter_string=f"tags.`{TAG_REPORT}` = '{quoted}'", max_results=1)
    if found:
        return found[0].info.run_id
    return client.create_run(reports_id, run_name=experiment, tags={TAG_REPORT: experiment}).info.run_id


def log_report(tracking_uri: str, experiment: str, out_dir: str | Path) -> str | None:
    """Upload ``out_dir`` under artifact path ``report/``; returns the run id (None: no such experiment)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None or experiment == REPORTS_EXPERIMENT:
        return None
    tag_experiment(client, exp)  # an experiment from before the runs view gets it (runners.mlflow_ui)
    run_id = report_run(client, experiment)
    client.log_artifacts(run_id, str(out_dir), artifact_path="report")
    client.set_terminated(run_id)
    for old in client.search_runs([exp.experiment_id], filter_string=f"tags.`{TAG_REPORT}` = '1'"):
        client.delete_run(old.info.run_id)  # the report run of an older trustbench, inside the experiment
    return run_id
