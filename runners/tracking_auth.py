"""Authentication of the MLflow tracking server that ``tracking=server`` starts off loopback.

A server that trustbench starts on an address other than loopback (``tracking.host`` set to a
login node's address, ``0.0.0.0``) runs MLflow's basic-auth app (``mlflow server --app-name
basic-auth``): every request but ``/health`` needs a user and password. The credentials come from
the environment only, from the variables MLflow's own clients read, so the command, its jobs and
``mlflow`` itself use the same ones:

    export MLFLOW_TRACKING_USERNAME=alice
    read -rs MLFLOW_TRACKING_PASSWORD && export MLFLOW_TRACKING_PASSWORD   # 12 characters or more

The first start creates that user as the server's admin in ``$TRUSTBENCH_HOME/mlflow-auth.db``
(MLflow stores a salted hash of the password there), configured by
``$TRUSTBENCH_HOME/mlflow-auth.ini`` (no credentials in it); both are mode 0600. The server gets the
credentials through its environment (MLflow's ``MLFLOW_AUTH_ADMIN_USERNAME`` /
``MLFLOW_AUTH_ADMIN_PASSWORD``), never on its command line, and nothing prints them. A later start
with another password is refused (the database keeps the first one): use the first, or delete
``mlflow-auth.db`` to start anew. Without the variables the start is refused (exit 2) unless
``tracking.trusted_network=true`` says the network is private (the server then runs without
authentication). Loopback (``127.0.0.0/8``, ``::1``, ``localhost``, or a name that resolves only to
those) needs no credentials: the server starts without authentication, as on one machine.

A server that is already running and answers 401 to a request without (or with wrong) credentials
is an error naming the variables to set (``check_access``).
"""

from __future__ import annotations

import base64
import ipaddress
import os
import secrets
import socket
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from runners import paths
from runners.config.validate import ConfigError
from runners.redact import redact

USER, PASSWORD = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"
CONFIG_FILE, DB_FILE = "mlflow-auth.ini", "mlflow-auth.db"
MIN_PASSWORD = 12  # MLflow's basic-auth rule (mlflow.utils.validation._validate_password)
# a request every MLflow server answers, which basic auth protects (GET, reads one experiment at most)
PROBE = "/api/2.0/mlflow/experiments/search?max_results=1"


def is_loopback(host: str) -> bool:
    """Whether a server bound to ``host`` is reachable from this machine only: an address of
    ``127.0.0.0/8`` or ``::1``, ``localhost``, or a name all of whose addresses are loopback. A
    wildcard (``0.0.0.0``, ``::``, empty) or a name that does not resolve is not."""
    name = host.strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        pass
    if not name:
        return False
    try:
        infos = socket.getaddrinfo(name, None)
    except (OSError, UnicodeError):
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback for i in infos)


def credentials() -> tuple[str, str] | None:
    """``(user, password)`` from ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``, or None
    when either is unset or empty."""
    user, password = os.environ.get(USER), os.environ.get(PASSWORD)
    return (user, password) if user and password else None


def server_env(host: str, url: str, trusted_network: bool) -> tuple[dict[str, str], bool]:
    """What starts a server on ``host`` (reached at ``url``): the variables added to its environment,
    and whether it runs the basic-auth app.

    Loopback: nothing, no auth. Otherwise the Host headers it accepts (``allowed_hosts``) and the
    credentials of the environment (``ConfigError`` naming the variable to set when there are none
    and ``trusted_network`` is false, or the password is too short for MLflow); the auth config file
    is written (mode 0600) before the server starts."""
    if is_loopback(host):
        return {}, False
    env = {"MLFLOW_SERVER_ALLOWED_HOSTS": ",".join(allowed_hosts(host, url))}
    creds = credentials()
    if creds is None:
        if trusted_network:
            return env, False
        missing = USER if not os.environ.get(USER) else PASSWORD
        raise ConfigError(
            missing,
            f"tracking.host={host} is not a loopback address, so the tracking server starts with "
            f"authentication: set {USER} and {PASSWORD} (or tracking.trusted_network=true on a private network)",
        )
    if len(creds[1]) < MIN_PASSWORD:
        raise ConfigError(PASSWORD, f"the tracking server needs a password of at least {MIN_PASSWORD} characters")
    env |= {
        "MLFLOW_AUTH_CONFIG_PATH": str(write_config()),
        "MLFLOW_AUTH_ADMIN_USERNAME": creds[0],
        "MLFLOW_AUTH_ADMIN_PASSWORD": creds[1],
        # CSRF key of the server's one worker; a new one each start (MLflow requires one)
        "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(32),
    }
    return env, True


def allowed_hosts(host: str, url: str) -> list[str]:
    """The ``Host`` headers a server bound to ``host`` accepts (MLflow's ``--allowed-hosts`` patterns):
    MLflow's default (loopback and the private ranges) plus the bound address and the name in
    ``url`` (what the jobs use), with any port. Without them MLflow answers 403 to every request
    addressed to a public address or a host name."""
    names = {host.strip("[]"), urllib.parse.urlsplit(url).hostname or ""}
    if host in ("0.0.0.0", "::", ""):
        names |= {socket.gethostname(), socket.getfqdn()}
    patterns = ["localhost", "localhost:*", "127.0.0.1", "127.0.0.1:*", "[::1]", "[[]::1]:*", "0.0.0.0", "0.0.0.0:*"]
    patterns += ["10.*", "192.168.*", *(f"172.{i}.*" for i in range(16, 32)), "fc00:*", "fd00:*"]
    for name in sorted(n for n in names if n and n not in ("0.0.0.0", "::")):
        patterns += [f"[{name}]", f"[[]{name}]:*"] if ":" in name else [name, f"{name}:*"]
    return patterns


def _private_file(path: Path) -> Path:
    """``path`` created if absent, mode 0600 either way."""
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    os.chmod(path, 0o600)
    return path


def write_config() -> Path:
    """``$TRUSTBENCH_HOME/mlflow-auth.ini`` (MLflow's basic-auth config; no credentials in it) and
    its empty user database, both mode 0600; returns the config's path."""
    home = paths.trustbench_home()
    home.mkdir(parents=True, exist_ok=True)
    db = _private_file(home / DB_FILE)  # sqlite fills the empty file; its journals take its mode
    config = _private_file(home / CONFIG_FILE)
    config.write_text(
        "[mlflow]\n"
        "# written by trustbench: the admin user comes from MLFLOW_TRACKING_USERNAME/PASSWORD\n"
        "default_permission = READ\n"
        f"database_uri = sqlite:///{db}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    return config


def protect_files() -> None:
    """Mode 0600 for the auth database and the journals sqlite may have left beside it."""
    home = paths.trustbench_home()
    for path in home.glob(f"{DB_FILE}*"):
        os.chmod(path, 0o600)


def authorization(url: str) -> str | None:
    """The ``Authorization`` header for ``url``: its own ``user:password@``, else the environment's."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is not None:
        pair = (urllib.parse.unquote(parts.username), urllib.parse.unquote(parts.password or ""))
    else:
        pair = credentials()
    if pair is None:
        return None
    return "Basic " + base64.b64encode(f"{pair[0]}:{pair[1]}".encode()).decode()


def without_userinfo(url: str) -> str:
    """``url`` without ``user:password@`` (urllib would not send it as a header anyway)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc)).rstrip("/")


def status(url: str, path: str, timeout_s: float = 5.0) -> int | None:
    """The HTTP status of ``GET url+path`` sent with ``authorization(url)``; None if nothing answers."""
    request = urllib.request.Request(without_userinfo(url) + path)
    header = authorization(url)
    if header is not None:
        request.add_header("Authorization", header)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code
    except (OSError, ValueError):
        return None


def check_access(url: str, source: str) -> None:
    """``ConfigError`` naming ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` when the
    server at ``url`` answers 401 (``source``: the key or variable the URI came from, named when the
    credentials it carries are refused)."""
    if status(url, PROBE) != 401:
        return
    shown = redact(without_userinfo(url))
    if urllib.parse.urlsplit(url).username is not None:
        raise ConfigError(source, f"the MLflow server at {shown} refused the credentials in the URI")
    if credentials() is None:
        missing = USER if not os.environ.get(USER) else PASSWORD
        raise ConfigError(missing, f"the MLflow server at {shown} requires authentication: set {USER} and {PASSWORD}")
    raise ConfigError(PASSWORD, f"the MLflow server at {shown} refused the credentials of {USER} and {PASSWORD}")
