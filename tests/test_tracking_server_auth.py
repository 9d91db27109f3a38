"""`tracking=server` off loopback: a real `mlflow server --app-name basic-auth` started by trustbench.

The server binds a non-loopback address of this machine (the first one `hostname -I` lists). The
reference for "authenticated" is raw HTTP against the server (urllib, with and without a Basic
header: MLflow answers 401 or serves), for "logged" MLflow's own client reading the run back, for
"one clear message" the command's stderr, for "stored nowhere" the bytes of every file the test
left. Loopback is 127.0.0.0/8 and ::1 (RFC 1122 section 3.2.1.3, RFC 4291 section 2.5.3) and the
name `localhost` (RFC 6761 section 6.3).
"""

from __future__ import annotations

import base64
import configparser
import json
import os
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from runners import tracking_auth, tracking_server
from runners.config.validate import ConfigError
from tests.reliability import FAST, command_env, free_port, one_message

USER, PASSWORD = "alice", "pa:ss@W0rd'$x!9-long"  # a ':' and URI delimiters: basic auth splits at the first ':'
CREDS = {"MLFLOW_TRACKING_USERNAME": USER, "MLFLOW_TRACKING_PASSWORD": PASSWORD}
SEARCH = "/api/2.0/mlflow/experiments/search?max_results=5"


def _public_ip() -> str | None:
    """A non-loopback IPv4 address of this machine (``hostname -I``), or None."""
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return next((a for a in out.split() if "." in a and not a.startswith("127.")), None)


IP = _public_ip()
needs_ip = pytest.mark.skipif(IP is None, reason="this machine has no non-loopback IPv4 address")


def _env(home: Path, creds: dict[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in command_env(home).items() if k not in CREDS}
    return {**env, **(creds or {})}


def _trustbench(args: list[str], home: Path, creds: dict[str, str] | None) -> subprocess.CompletedProcess:
    home.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "runners.cli", *args], cwd=home.parent, env=_env(home, creds),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _get(url: str, user: str | None = None, password: str | None = None, method: str = "GET", body=None) -> int:
    """The HTTP status of one request to ``url`` (Basic credentials when ``user`` is given)."""
    request = urllib.request.Request(url, method=method, data=body)
    if body is not None:
        request.add_header("Content-Type", "application/json")
    if user is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True), ("127.0.0.2", True), ("127.255.255.254", True), ("::1", True), ("[::1]", True),
        ("localhost", True), ("LocalHost", True),
        ("0.0.0.0", False), ("::", False), ("", False), ("192.0.2.2", False), ("10.1.2.3", False),
        ("fd00::2", False), ("128.0.0.1", False), ("no-such-host.invalid", False),
    ],
)  # fmt: skip
def test_loopback_is_127_slash_8_ipv6_one_and_localhost(host, loopback):
    """What needs no credentials: the loopback block, ``::1`` and ``localhost``; a wildcard bind, any
    other address and a name that does not resolve (``.invalid`` never does) need them."""
    assert tracking_auth.is_loopback(host) is loopback


@pytest.mark.slow
@pytest.mark.e2e
@needs_ip
def test_no_credentials_off_loopback_is_exit_2_one_line_nothing_created(tmp_path):
    """`trustbench run tracking=server tracking.host=<this machine's address>` without the
    variables: exit 2, one line naming both, no server, no store, no run directory."""
    home, port = tmp_path / "home", free_port()
    proc = _trustbench(["run", "tracking=server", f"tracking.host={IP}", f"tracking.port={port}", *FAST], home, None)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = one_message(proc.stderr, "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "tracking.trusted_network")
    assert "environment variable MLFLOW_TRACKING_USERNAME:" in line, line
    _nothing_ran(home)
    assert not (home / tracking_auth.DB_FILE).exists()
    assert not tracking_server.is_up(f"http://{IP}:{port}", timeout_s=1)


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory):
    """A basic-auth server started by trustbench on this machine's address, the credentials in the
    environment (as a user exports them); stopped at the end."""
    if IP is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    root = tmp_path_factory.mktemp("auth")
    home, port = root / "home", free_port()
    saved = {k: os.environ.get(k) for k in ("TRUSTBENCH_HOME", *CREDS)}
    os.environ.update({"TRUSTBENCH_HOME": str(home), **CREDS})
    try:
        server = tracking_server.ensure_server(IP, port)
    except BaseException:
        _restore(saved)
        raise
    try:
        cmdline = Path(f"/proc/{server.process.pid}/cmdline").read_bytes()
        yield server, home, root, cmdline
    finally:
        server.stop()
        _restore(saved)


def _restore(saved: dict[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.mark.slow
@pytest.mark.e2e
def test_the_server_refuses_requests_without_the_right_credentials(auth_server):
    """Raw HTTP: no credentials, a wrong password, an unknown user: 401 (reads and writes alike);
    the right ones: served. ``/health`` stays open (MLflow's choice; trustbench's liveness check)."""
    server, _, _, _ = auth_server
    assert server.started and server.url == f"http://{IP}:{server.port}"
    create = json.dumps({"name": "intruder"}).encode()
    assert _get(server.url + SEARCH) == 401
    assert _get(server.url + "/api/2.0/mlflow/experiments/create", method="POST", body=create) == 401
    assert _get(server.url + SEARCH, USER, PASSWORD + "x") == 401
    assert _get(server.url + SEARCH, "mallory", PASSWORD) == 401
    assert _get(server.url + SEARCH, USER, PASSWORD) == 200
    assert _get(server.url + "/health") == 200


@pytest.mark.slow
@pytest.mark.e2e
def test_a_sweep_job_logs_through_the_authenticated_server(auth_server):
    """`trustbench sweep ... launcher=submitit_local tracking=server` at that address, the credentials
    in its environment: the sweep finds the server, its job (another process, as a Slurm job would
    be) logs the cell through it; MLflow's client (same credentials) reads the run back FINISHED
    with its metrics; the password is in neither output stream."""
    server, home, _, _ = auth_server
    args = ["sweep", "demo", "+method=choice(grpo)", "seed=0", "launcher=submitit_local", "tracking=server",
            f"tracking.host={IP}", f"tracking.port={server.port}", *FAST]  # fmt: skip
    proc = _trustbench(args, home, CREDS)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert PASSWORD not in proc.stdout + proc.stderr
    from mlflow import MlflowClient

    client = MlflowClient(server.url)  # sends MLFLOW_TRACKING_USERNAME/PASSWORD (this process's environment)
    ids = [e.experiment_id for e in client.search_experiments()]
    (run,) = client.search_runs(ids)
    assert run.info.status == "FINISHED" and run.data.metrics
    assert list((home / "hydra" / "multirun").rglob("*_submitted.pkl"))  # a submitit job ran it


def _nothing_ran(home: Path) -> None:
    """No store, no MLflow run, no status or checkpoint: at most the cell's lock file (``run`` takes
    it before it reaches the tracking store)."""
    assert not (home / "mlflow.db").exists()
    left = [p for p in (home / "runs").rglob("*") if p.is_file()] if (home / "runs").exists() else []
    assert all(p.name == "run.lock" for p in left), left


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize(
    ("creds", "via_env", "key"),
    [
        (None, False, "MLFLOW_TRACKING_USERNAME"),  # tracking=server finds it, no credentials
        ({**CREDS, "MLFLOW_TRACKING_PASSWORD": "not-the-password"}, True, "MLFLOW_TRACKING_PASSWORD"),
    ],
)  # fmt: skip
def test_a_server_answering_401_is_exit_2_one_line(auth_server, tmp_path, creds, via_env, key):
    """The server exists and wants credentials: none (through `tracking=server`) or a wrong password
    (through `$MLFLOW_TRACKING_URI`) is exit 2 and one line naming the variable, and nothing ran."""
    server, _, _, _ = auth_server
    home = tmp_path / "other"
    if via_env:
        creds, args = {**creds, "MLFLOW_TRACKING_URI": server.url}, ["run", *FAST]
    else:
        args = ["run", "tracking=server", f"tracking.host={IP}", f"tracking.port={server.port}", *FAST]
    proc = _trustbench(args, home, creds)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = one_message(proc.stderr, f"environment variable {key}:", "MLFLOW_TRACKING_PASSWORD", server.url)
    assert "not-the-password" not in line
    _nothing_ran(home)


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize(
    ("creds", "uri", "key", "says"),
    [
        ({}, None, "MLFLOW_TRACKING_USERNAME", "requires authentication"),
        ({"MLFLOW_TRACKING_USERNAME": USER}, None, "MLFLOW_TRACKING_PASSWORD", "requires authentication"),
        ({**CREDS, "MLFLOW_TRACKING_PASSWORD": PASSWORD[:-1]}, None, "MLFLOW_TRACKING_PASSWORD", "refused"),
        ({"MLFLOW_TRACKING_USERNAME": "mallory", "MLFLOW_TRACKING_PASSWORD": PASSWORD}, "{url}", "MLFLOW_TRACKING_PASSWORD", "refused"),
        ({}, "http://mallory:{pw}@{host}", "MLFLOW_TRACKING_URI", "refused the credentials in the URI"),
        (CREDS, "{url}", None, None),
        (CREDS, None, None, None),
    ],
)  # fmt: skip
def test_connect_names_the_missing_or_refused_variable(auth_server, monkeypatch, creds, uri, key, says):
    """``connect`` (what `run` and `sweep` call) against the authenticated server: each way the
    credentials are missing or wrong is a ``ConfigError`` naming that variable; the right ones connect."""
    server, _, _, _ = auth_server
    for name in CREDS:
        monkeypatch.delenv(name, raising=False)
    for name, value in creds.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    if uri:
        host = f"{IP}:{server.port}"
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri.format(url=server.url, host=host, pw="Long-enough-pw-1"))
    node = {"kind": "server", "host": IP, "port": server.port, "start_server": False, "uri": None}
    if key is None:
        url, held = tracking_server.connect(node)
        # a generous limit: the server checks the password hash on every request, which took over the
        # default 5 s beside the whole suite on 2 cores (status None: nothing answered in time)
        assert url == server.url and tracking_auth.status(url, SEARCH, timeout_s=120) == 200
        if held is not None:
            held.stop()  # leaves it: the fixture holds it too
        return
    with pytest.raises(ConfigError) as err:
        tracking_server.connect(node)
    assert err.value.key == key and says in err.value.reason and PASSWORD not in str(err.value)


@pytest.mark.slow
@pytest.mark.e2e
def test_a_second_start_with_another_password_is_refused_and_ended(auth_server, monkeypatch):
    """The user database keeps the password of the first start: a server started from the same home
    with another password is ended again (nothing answers on its port) and the error names
    `MLFLOW_TRACKING_PASSWORD` and the database file; the other password is in no file."""
    _, home, root, _ = auth_server
    other, port = "another-password-42", free_port()
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", other)
    with pytest.raises(ConfigError) as err:
        tracking_server.ensure_server(IP, port)
    assert err.value.key == "MLFLOW_TRACKING_PASSWORD" and str(home / tracking_auth.DB_FILE) in err.value.reason
    assert other not in str(err.value)
    assert not tracking_server.is_up(f"http://{IP}:{port}", timeout_s=1)
    assert not [p for p in root.rglob("*") if p.is_file() and other.encode() in p.read_bytes()]


@pytest.mark.slow
@pytest.mark.e2e
def test_the_password_is_stored_nowhere_but_as_a_hash(auth_server):
    """After the start and a sweep: no file of the test's directory (the store, the server's log, the
    auth config, run directories, the sweep's submitit pickles and logs) holds the password or its base64 Basic token, the server's
    command line does not; the auth database and config are mode 0600 and the database has the
    user with a salted hash (MLflow's users table)."""
    server, home, root, cmdline = auth_server
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode())
    assert PASSWORD.encode() not in cmdline and b"basic-auth" in cmdline
    leaks = [
        p for p in root.rglob("*") if p.is_file() and (PASSWORD.encode() in p.read_bytes() or token in p.read_bytes())
    ]
    assert not leaks, leaks
    for name in (tracking_auth.DB_FILE, tracking_auth.CONFIG_FILE):
        assert (home / name).stat().st_mode & 0o777 == 0o600, name
    config = configparser.ConfigParser()
    config.read(home / tracking_auth.CONFIG_FILE)
    assert set(config["mlflow"]) == {"default_permission", "database_uri", "authorization_function"}  # no user
    with sqlite3.connect(f"file:{home / tracking_auth.DB_FILE}?mode=ro", uri=True) as con:
        ((username, digest, is_admin),) = con.execute("SELECT username, password_hash, is_admin FROM users").fetchall()
    assert username == USER and is_admin and PASSWORD not in digest and len(digest) > 40


@pytest.mark.slow
@pytest.mark.e2e
@needs_ip
def test_trusted_network_starts_without_authentication(tmp_path, monkeypatch):
    """`tracking.trusted_network` (no credentials set): the server starts without the auth app, and
    an unauthenticated request is served; no auth files are written."""
    home, port = tmp_path / "home", free_port()
    monkeypatch.setenv("TRUSTBENCH_HOME", str(home))
    for key in CREDS:
        monkeypatch.delenv(key, raising=False)
    server = tracking_server.ensure_server(IP, port, trusted_network=True)
    try:
        assert server.started and b"basic-auth" not in Path(f"/proc/{server.process.pid}/cmdline").read_bytes()
        assert _get(server.url + SEARCH) == 200
    finally:
        server.stop()
    assert not (home / tracking_auth.DB_FILE).exists() and not (home / tracking_auth.CONFIG_FILE).exists()
