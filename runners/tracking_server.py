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

Several commands may share one server (two ``trustbench run tracking=server`` on one port, a
run and a sweep): a server is used while its users hold a shared ``flock`` on a file of this
machine (``/tmp/trustbench-<uid>/mlflow-server-<port>.users``), and checking for a server and
starting one, or stopping one, happen under an exclusive lock (``...<port>.lock``), so two first
starts never race (the second finds the first's server) and nobody stops a server in use. The
last user leaving stops a server that a trustbench command started (its pid in ``...<port>.json``),
whichever command started it; a server started otherwise is never stopped; a sweep whose jobs
outlive it leaves its server running (``detach``).

The server binds 127.0.0.1 by default: reachable from jobs on this machine only (the test
cluster), without authentication. On a real cluster set ``tracking.host`` to an address of the
login node that compute nodes reach: a server started there runs MLflow's basic-auth app, the user
and password taken from ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` (which the jobs
inherit and MLflow's client sends), and without them it is not started unless
``tracking.trusted_network=true`` (``runners.tracking_auth``). A server answering 401 is an error
naming those variables.

``trustbench run`` and ``trustbench sweep`` reach the store the same way (``connect``): an explicit
``tracking.uri`` or ``$MLFLOW_TRACKING_URI`` must answer (checked in seconds, not after MLflow's
minutes of retries); ``tracking=server`` uses or starts the server; otherwise the sqlite file. A
server that cannot be reached or started is a ``ConfigError`` naming the key to change. The server
(and ``trustbench ui``) runs one worker and no job runner: MLflow's GenAI job runner would fork
seven more Python processes.

    from runners.tracking_server import ensure_server
    server = ensure_server("127.0.0.1", 5000)      # -> TrackingServer(url=..., started=True|False)
    ...
    server.stop()                                  # leave it; the last user stops one trustbench started
    with serving(cfg.tracking) as uri: ...         # a run: the URI, a server started here stopped after
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from runners import paths, tracking, tracking_auth
from runners.config.validate import ConfigError
from runners.redact import redact
from runners.sqlite_store import BrokenStore

LOG_FILE = "mlflow-server.log"
# no background job runner (GenAI scorers): it forks seven more Python processes
SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def server_command(kind: str, store: str, host: str, port: int) -> list[str]:
    """``mlflow server`` (``kind="server"``) or ``mlflow ui`` on ``store`` with one worker."""
    return [sys.executable, "-m", "mlflow", kind, "--backend-store-uri", store,
            "--host", host, "--port", str(int(port)), "--workers", "1"]  # fmt: skip


def store_uri() -> str:
    """The server's backend store: the sqlite file of this trustbench home."""
    return f"sqlite:///{paths.trustbench_home() / 'mlflow.db'}"


def url_for(host: str, port: int) -> str:
    """The URI jobs use: a wildcard bind address is replaced by this machine's name."""
    if host in ("0.0.0.0", "::", ""):
        host = socket.getfqdn()
    return f"http://{host}:{int(port)}"


def is_up(url: str, timeout_s: float = 2.0) -> bool:
    """Whether an MLflow server answers ``/health`` at ``url`` (basic auth: its ``user:password@``, else
    ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``; MLflow leaves ``/health`` open)."""
    return tracking_auth.status(url, "/health", timeout_s) == 200


@dataclass
class TrackingServer:
    url: str
    started: bool  # True: this process started it
    process: subprocess.Popen | None = None
    log: Path | None = None
    port: int | None = None
    hold: IO | None = field(default=None, repr=False)  # this user's shared lock on the server (module docstring)

    def stop(self, timeout_s: float = 20.0) -> None:
        """Leave the server: if no other command uses it and a trustbench command started it, end it
        (its whole process group), whoever started it; else leave it running."""
        if self.hold is None:
            return
        with _exclusive(self.port, "lock"):
            self.hold.close()
            self.hold = None
            try:
                with _exclusive(self.port, "users", wait=False):
                    _stop_recorded(self.port, self.process, timeout_s)
            except BlockingIOError:
                pass  # another command uses it: the last one out stops it

    def detach(self) -> None:
        """Leave the server running for others (a sweep's jobs that outlive the sweep): nobody stops it."""
        if self.hold is not None:
            with _exclusive(self.port, "lock"):
                _state_file(self.port).unlink(missing_ok=True)
                self.hold.close()
                self.hold = None


def _lock_dir() -> Path:
    """This user's directory for the locks of servers on this machine (ports are machine-wide)."""
    path = Path("/tmp") / f"trustbench-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    if path.is_symlink() or path.stat().st_uid != os.getuid():
        raise RuntimeError(f"{path} must be a directory of uid {os.getuid()}")
    return path


def _state_file(port: int | None) -> Path:
    return _lock_dir() / f"mlflow-server-{port}.json"


def _open_lock(port: int | None, kind: str) -> IO:
    return open(_lock_dir() / f"mlflow-server-{port}.{kind}", "a+")


@contextmanager
def _exclusive(port: int | None, kind: str, wait: bool = True) -> Iterator[None]:
    """An exclusive flock on ``mlflow-server-<port>.<kind>`` (``BlockingIOError`` if taken and not ``wait``)."""
    with _open_lock(port, kind) as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        yield


def _hold(port: int) -> IO:
    """A shared lock for one user of the server at ``port``, released when the file is closed."""
    fh = _open_lock(port, "users")
    fcntl.flock(fh, fcntl.LOCK_SH)
    return fh


def _stop_recorded(port: int | None, process: subprocess.Popen | None, timeout_s: float) -> None:
    """End the server recorded as started by a trustbench command on ``port`` (nobody uses it)."""
    state = _state_file(port)
    try:
        pid = int(json.loads(state.read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return  # none recorded: not ours to stop
    cmdline = _cmdline(pid)
    if b"mlflow" in cmdline and str(port).encode() in cmdline.split(b"\0"):
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with suppress(ProcessLookupError):
                os.killpg(pid, sig)
            if _gone(pid, process, timeout_s):
                break
    state.unlink(missing_ok=True)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _gone(pid: int, process: subprocess.Popen | None, timeout_s: float) -> bool:
    """Wait until ``pid`` ended (reaped if it is our child, else gone or a zombie from /proc)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.pid == pid:
            if process.poll() is not None:
                return True
        else:
            try:
                stat = Path(f"/proc/{pid}/stat").read_bytes()
            except OSError:
                return True
            if stat.rsplit(b")", 1)[1].split()[0] in (b"Z", b"X"):
                return True
        time.sleep(0.1)
    return False


def ensure_server(
    host: str, port: int, *, start: bool = True, trusted_network: bool = False, wait_s: float = 180.0
) -> TrackingServer:
    """The server at ``host:port``: the one answering there, else one started here (``start``), with
    basic auth off loopback (``tracking_auth.server_env``; none on a ``trusted_network``).

    The caller holds it (a shared lock) until ``stop``. ``ConfigError`` (naming
    ``tracking.start_server``, ``tracking.host`` or ``tracking.port``) when none answers and none
    may be started, or the one started here exits or never answers; naming
    ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` when credentials are missing or refused."""
    url = url_for(host, port)
    with _exclusive(port, "lock"):  # one check-and-start (or stop) at a time for this port
        hold = _hold(port)
        try:
            if is_up(url):
                tracking_auth.check_access(url, "tracking.host")
                return TrackingServer(url=url, started=False, port=port, hold=hold)
            if not start:
                raise ConfigError(
                    "tracking.start_server",
                    f"no MLflow server answers at {url} and tracking.start_server=false: start one there, "
                    "or set tracking.start_server=true, or another tracking.host / tracking.port",
                )
            env, auth = tracking_auth.server_env(host, url, trusted_network)  # refused before anything is created
            server = _start(url, host, port, wait_s, env, auth)
        except BaseException:
            hold.close()
            raise
        server.hold = hold
        if server.started:
            _state_file(port).write_text(json.dumps({"pid": server.process.pid, "url": url, "log": str(server.log)}))
        return server


def _start(url: str, host: str, port: int, wait_s: float, env: dict[str, str], auth: bool) -> TrackingServer:
    """Start ``mlflow server`` at ``host:port`` on this home's store (``env`` added to its
    environment; MLflow's basic-auth app if ``auth``) and wait until it answers; a server that
    someone outside these locks started there meanwhile (port in use) is used."""
    store = open_store(store_uri())  # schema first: the server and the jobs never race it
    artifacts = paths.artifact_root()
    artifacts.mkdir(parents=True, exist_ok=True)
    log = paths.trustbench_home() / LOG_FILE
    # artifacts served over HTTP (mlflow-artifacts:/), so jobs and `trustbench report` on other
    # machines read and write them through the server (analysis reads run histories this way)
    cmd = [*server_command("server", store, host, port), "--artifacts-destination", artifacts.as_uri()]
    if auth:
        cmd += ["--app-name", "basic-auth"]
    with open(log, "ab") as out:
        start_at = out.tell()
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, **SERVER_ENV, **env},
        )  # fmt: skip
    server = TrackingServer(url=url, started=True, process=proc, log=log, port=port)
    deadline = time.monotonic() + wait_s
    while not is_up(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            end_group(proc)
            error = _last_error(log, start_at)
            if "in use" in error and is_up(url):
                return TrackingServer(url=url, started=False, port=port)
            why = "exited" if proc.poll() is not None else f"did not answer within {wait_s:.0f} s"
            raise ConfigError(
                "tracking.port" if "in use" in error else "tracking.host",
                f"could not start an MLflow server at {url}: it {why} ({error}; log {log})",
            )
        time.sleep(0.5)
    if auth:
        tracking_auth.protect_files()
        try:  # the user database keeps the password of its first start
            tracking_auth.check_access(url, "tracking.host")
        except ConfigError as err:
            end_group(proc)
            db = paths.trustbench_home() / tracking_auth.DB_FILE
            raise ConfigError(err.key, f"{err.reason} ({db} keeps the password its user was created with)") from None
    return server


def end_group(proc: subprocess.Popen, timeout_s: float = 20.0) -> None:
    """End the process group of ``proc`` (started with ``start_new_session``): SIGTERM, then SIGKILL
    after ``timeout_s`` (a server start that failed; ``trustbench ui`` ending)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _last_error(log: Path, start_at: int) -> str:
    """The last line of the server's log (this start's part) that says what went wrong."""
    try:
        with open(log, "rb") as fh:
            fh.seek(start_at)
            lines = [ln.strip() for ln in fh.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    errors = [ln for ln in lines if "rror" in ln or "in use" in ln]
    return (errors or lines or ["no output"])[-1][:300]


def open_store(uri: str) -> str:
    """``tracking.ensure_store``, a store left half-built by an older run being a ``ConfigError``."""
    try:
        return tracking.ensure_store(uri)
    except BrokenStore as err:
        raise ConfigError("tracking.uri", str(err)) from None


def connect(t: Mapping[str, Any]) -> tuple[str, TrackingServer | None]:
    """The tracking URI a run or sweep logs to, reachable, and the server started for it (or None).

    ``t`` is the ``tracking`` config node. In order: ``tracking.uri``; ``$MLFLOW_TRACKING_URI``;
    ``tracking=server``: the server at ``tracking.host:tracking.port`` (started when none answers
    and ``tracking.start_server``); else this home's sqlite file. An HTTP URI that does not answer
    is a ``ConfigError`` naming where it came from."""
    if t.get("uri"):
        uri, source = str(t["uri"]), "tracking.uri"
    elif os.environ.get("MLFLOW_TRACKING_URI"):
        uri, source = os.environ["MLFLOW_TRACKING_URI"], "MLFLOW_TRACKING_URI"
    elif t.get("kind") == "server":
        trusted = bool(t.get("trusted_network", False))
        server = ensure_server(str(t["host"]), int(t["port"]), start=bool(t["start_server"]), trusted_network=trusted)
        return server.url, server
    else:
        return paths.default_tracking_uri(), None
    if uri.startswith(("http://", "https://")):
        if not is_up(uri):
            raise ConfigError(source, f"no MLflow server answers at {redact(uri)}")
        tracking_auth.check_access(uri, source)
    return uri, None


@contextmanager
def serving(t: Mapping[str, Any]) -> Iterator[str]:
    """``connect`` for one run: yields the URI; then leaves the server (the last user stops it)."""
    uri, server = connect(t)
    try:
        yield uri
    finally:
        if server is not None:
            server.stop()
