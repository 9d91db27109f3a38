"""Log a built report directory to MLflow, as artifacts of the experiment's dedicated "report" run.

One run per experiment carries the tag ``trustbench.report=1`` (created on first use, reused after,
so rebuilding a report overwrites the same artifact paths instead of adding runs);
``analysis.load_experiment`` leaves such runs out of every table and figure.
"""

from __future__ import annotations

from pathlib import Path

from analysis.frames import TAG_REPORT


def log_report(tracking_uri: str, experiment: str, out_dir: str | Path) -> str | None:
    """Upload ``out_dir`` under artifact path ``report/``; returns the run id (None: no such experiment)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return None
    found = client.search_runs([exp.experiment_id], filter_string=f"tags.`{TAG_REPORT}` = '1'", max_results=1)
    if found:
        run_id = found[0].info.run_id
    else:
        run_id = client.create_run(exp.experiment_id, run_name="report", tags={TAG_REPORT: "1"}).info.run_id
    client.log_artifacts(run_id, str(out_dir), artifact_path="report")
    client.set_terminated(run_id)
    return run_id
