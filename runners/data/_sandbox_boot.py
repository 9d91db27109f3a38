"""Bootstrap that runs INSIDE the sandbox child, before the untrusted program (see sandbox.py).

It is passed to the interpreter as ``python -I -c <this file's text> <json config>`` (no file of
ours needs to be readable by the sandbox user) and, in this order: lowers resource limits, drops
root privileges to the configured uid/gid, disables the socket module (defence in depth on top of
the network namespace; the only barrier when no namespace is available), then runs the program:
``stdin`` mode executes it as ``__main__``; ``call`` mode executes it as a module, calls
``fn_name`` (a top-level function or a method of ``Solution()``) with the JSON arguments and writes
``<nonce><json result>`` on a private duplicate of stdout.

Standard library only; keep it small: everything here runs for every test case.
"""

import json
import os
import resource
import sys

cfg = json.loads(sys.argv[1])

for _name, _value in cfg["limits"].items():
    _res = getattr(resource, _name)
    _soft, _hard = _value if isinstance(_value, list) else (_value, _value)
    resource.setrlimit(_res, (_soft, _hard))

if cfg.get("drop_uid") is not None:
    os.setgroups([])
    os.setgid(cfg["drop_gid"])
    os.setuid(cfg["drop_uid"])

if cfg.get("socket_guard", True):
    import socket

    def _no_network(*_args, **_kwargs):
        raise OSError(101, "network is disabled in the trustbench sandbox")

    for _attr in ("socket", "create_connection", "create_server", "socketpair", "fromfd", "getaddrinfo"):
        setattr(socket, _attr, _no_network)
    sys.modules.pop("_socket", None)
    sys.modules["_socket"] = None  # a later `import _socket` fails

_result_fd = os.dup(1) if cfg["mode"] == "call" else None
_path = cfg["program"]
with open(_path, encoding="utf-8") as _f:
    _source = _f.read()
_code = compile(_source, _path, "exec")

if cfg["mode"] == "stdin":
    _globals = {"__name__": "__main__", "__file__": _path, "__builtins__": __builtins__}
    exec(_code, _globals)
    sys.stdout.flush()
else:
    _globals = {"__name__": "solution", "__file__": _path, "__builtins__": __builtins__}
    exec(_code, _globals)
    _fn = _globals.get(cfg["fn_name"])
    if _fn is None and "Solution" in _globals:
        _fn = getattr(_globals["Solution"](), cfg["fn_name"], None)
    if _fn is None:
        raise NameError(f"the program defines no function or Solution method {cfg['fn_name']!r}")
    _value = _fn(*cfg["args"])
    if isinstance(_value, tuple):
        _value = list(_value)
    try:
        _text = json.dumps(_value)
    except (TypeError, ValueError):
        _text = json.dumps(repr(_value))
    sys.stdout.flush()
    os.write(_result_fd, ("\n" + cfg["nonce"] + _text + "\n").encode())
