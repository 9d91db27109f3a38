"""Where trustbench keeps its state (torch-free).

Everything a run writes lives under one home directory, ``$TRUSTBENCH_HOME`` or ``./.trustbench``
of the directory the command is started from:

    .trustbench/mlflow.db          MLflow tracking store (sqlite), unless MLFLOW_TRACKING_URI is set
    .trustbench/artifacts/         MLflow artifact root
    .trustbench/runs/<run_key>/    checkpoints, resolved config, status markers of one run
    .trustbench/reports/<exp>/     report.html, report.pdf, figures
    .trustbench/cache/             analysis caches (parquet)

Model weights that are built or converted once (the embedded default, the SmolLM2 conversion) are
shared between projects in ``$TRUSTBENCH_CACHE`` (default ``~/.cache/trustbench``).
"""

from __future__ import annotations

import os
from pathlib import Path


def trustbench_home() -> Path:
    return Path(os.environ.get("TRUSTBENCH_HOME", Path.cwd() / ".trustbench")).resolve()


def model_cache_dir() -> Path:
    default = Path.home() / ".cache" / "trustbench"
    return Path(os.environ.get("TRUSTBENCH_CACHE", default)).resolve()


def default_tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` if set, else a sqlite file under the trustbench home."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    return f"sqlite:///{trustbench_home() / 'mlflow.db'}"


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI, else None."""
    return Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None


def artifact_root() -> Path:
    return trustbench_home() / "artifacts"


def run_dir(run_key: str) -> Path:
    return trustbench_home() / "runs" / run_key


def report_dir(experiment: str) -> Path:
    return trustbench_home() / "reports" / experiment


def analysis_cache_dir() -> Path:
    return trustbench_home() / "cache"


def repo_root() -> Path:
    """The source tree (holds conf/ and sweeps/); trustbench is installed editable from it."""
    return Path(__file__).resolve().parent.parent
