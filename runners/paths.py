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


# tracking-store schemes MLflow opens: a sqlite file, a tracking server, or another SQL database
TRACKING_SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks")


def tracking_uri_problem(uri: str) -> str | None:
    """Why ``uri`` cannot be a tracking store (one rule for ``tracking.uri``, ``$MLFLOW_TRACKING_URI`` and
    ``--tracking-uri``), or None: MLflow opens a path or ``file:`` URI (its file store, in maintenance
    mode) only with ``MLFLOW_ALLOW_FILE_STORE=true``, other schemes are unknown to it, and a sqlite URI
    names its file after three slashes."""
    if uri == "databricks":  # Databricks' default profile
        return None
    scheme, sep, rest = uri.partition(":")
    base = scheme.split("+")[0].lower() if sep else ""
    if base in ("", "file") or len(scheme) == 1:  # a path (or a Windows drive letter) or file:
        if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() in ("true", "1"):
            return None
        return (
            "a path or file: URI is MLflow's file store, which MLflow refuses without MLFLOW_ALLOW_FILE_STORE=true: "
            "use sqlite:///PATH or http://HOST:PORT"
        )
    if base not in TRACKING_SCHEMES:
        return f"unsupported scheme {scheme!r}: use sqlite:///PATH, http(s)://HOST:PORT or a SQL database URI"
    if base == "sqlite" and not rest.startswith("///"):
        return "a sqlite URI is sqlite:/// followed by the file's path"
    if base in ("http", "https") and not rest.removeprefix("//").split("/")[0].rpartition("@")[2]:
        return "no host after http(s)://"
    return None


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


# the Hydra config tree (one folder per config group) and the sweep files
CONF_DIR: Path = repo_root() / "conf"
SWEEPS_DIR: Path = repo_root() / "sweeps"


def conf_options(group: str) -> list[str]:
    """The options of config group ``group``: the stems of ``conf/<group>/*.yaml``, sorted."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
