"""An MLflow tracking server for sweeps whose jobs run on other processes or nodes (``tracking=server``).

Many Slurm jobs writing one sqlite file over a shared filesystem is what sqlite handles worst
(file locks over NFS/Lustre). With ``tracking=server`` the sweep command talks to one
``mlflow server`` instead: it uses the server already answering at ``tracking.host:tracking.port``,
or (``tracking.start_server``) starts one there whose store is the sweep's sqlite file
(``$TRUSTBENCH_HOME/mlflow.db``, the same file ``tracking=sqlite`` uses, so reports and dry runs
read it either way) and whose artifacts go to ``$TRUSTBENCH_HOME/artifacts``, served over HTTP so
other machines reach them through the server. The sqlite schema is
created before the server starts (``tracking.ensure_store``), so nothing races the migration. Jobs
get the server's URI through ``MLFLOW_TRACKING_URI`` in their environment (sbatch exports the
submitting environment; the sweep also exports it in the job script's setup lines).

The server binds 127.0.0.1 by default: reachable from jobs on this machine only (the test
cluster). On a real cluster set ``tracking.host`` to an address of the login node that compute
nodes reach (the server has no authentication: keep it on a private network).

    from runners.tracking_server import ensure_server
    server = ensure_server("127.0.0.1", 5000)      # -> TrackingServer(url=..., started=True|False)
    ...
    server.stop()                                  # only stops a server it started
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from runners import paths, tracking

LOG_FILE = "mlflow-server.log"


def store_uri() -> str:
    """The server's backend store: the sqlite file of this trustbench home."""
    return f"sqlite:///{paths.trustbench_home() / 'mlflow.db'}"


def url_for(host: str, port: int) -> str:
    """The URI jobs use: a wildcard bind address is replaced by this machine's name."""
    if host in ("0.0.0.0", "::", ""):
        host = socket.getfqdn()
    return f"http://{host}:{int(port)}"


def is_up(url: str, timeout_s: float = 2.0) -> bool:
    """Whether an MLflow server answers ``/health`` at ``url``."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as resp:
            return resp.status == 200
    except OSError:
        return False


@dataclass
class TrackingServer:
    url: str
    started: bool  # True: this process started it (and ``stop`` ends it)
    process: subprocess.Popen | None = None
    log: Path | None = None

    def stop(self, timeout_s: float = 20.0) -> None:
        """End the server if this process started it (its whole process group); else nothing."""
        if not self.started or self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def ensure_server(host: str, port: int, *, start: bool = True, wait_s: float = 180.0) -> TrackingServer:
    """The server at ``host:port``: the one answering there, else one started here (``start``)."""
    url = url_for(host, port)
    if is_up(url):
        return TrackingServer(url=url, started=False)
    if not start:
        raise RuntimeError(f"no MLflow server answers at {url} and tracking.start_server=false")
    store = tracking.ensure_store(store_uri())  # schema first: the server and the jobs never race it
    artifacts = paths.artifact_root()
    artifacts.mkdir(parents=True, exist_ok=True)
    log = paths.trustbench_home() / LOG_FILE
    cmd = [
        sys.executable, "-m", "mlflow", "server",
        "--host", host, "--port", str(int(port)),
        "--backend-store-uri", store,
        # artifacts served over HTTP (mlflow-artifacts:/), so jobs and `trustbench report` on other
        # machines read and write them through the server (analysis reads run histories this way)
        "--artifacts-destination", artifacts.as_uri(),
        "--workers", "1",
    ]  # fmt: skip
    # no background job runner (GenAI scorers): it forks seven more Python processes
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    server = TrackingServer(url=url, started=True, process=proc, log=log)
    deadline = time.monotonic() + wait_s
    while not is_up(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            server.stop()
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"mlflow server did not come up at {url} (log {log}):\n{tail}")
        time.sleep(0.5)
    return server
