"""Hostile and innocent programs for tests/data/test_sandbox_escapes.py (no pytest import: the
escape tests also run them from a trainer started with the system interpreter)."""


def daemon_program(marker: str, ending: str) -> str:
    """Double-fork a setsid daemon (which carries ``marker`` in its command line and lives 30 s),
    wait until it runs, then exit or spin until the time limit."""
    return f"""
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        code = "import pathlib, time; pathlib.Path('started').touch(); time.sleep(30)"
        os.execv(sys.executable, [sys.executable, "-c", code, "{marker}"])
    os._exit(0)
os.wait()
for _ in range(500):
    if os.path.exists("started"):
        break
    time.sleep(0.01)
print("daemon started", flush=True)
while {ending == "timeout"}:
    pass
"""


LEFTOVERS = """
import os, time
n = 0
for _ in range(1000):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.setsid()
        time.sleep(30)
        os._exit(0)
    n += 1
print(n)
"""
INNOCENT = """
import os
children = []
for code in range(4):
    pid = os.fork()
    if pid == 0:
        os._exit(code)
    children.append(pid)
print(sorted(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children))
"""


HOSTILE = """
import os, signal, time
try:
    open("/tmp/{marker}", "w").write("hostile")
except OSError:  # refused under Landlock: go on with the rest
    pass
end = time.monotonic() + 2.5
while time.monotonic() < end:
    for _ in range(100):  # fork to the process limit
        try:
            if os.fork() == 0:
                time.sleep(30)
                os._exit(0)
        except OSError:
            break
    try:
        os.kill(-1, signal.SIGKILL)  # every process it may signal (its own children included)
    except OSError:
        pass
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
"""
NEIGHBOUR = """
import os, time
time.sleep(1.0)  # the hostile program is busy by now
seen = os.path.exists("/tmp/{marker}")
children = []
for code in range(4):
    pid = os.fork()
    if pid == 0:
        time.sleep(0.2)
        os._exit(code)
    children.append(pid)
print(seen, sorted(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children))
"""


FILES = """
import errno, json, os
outcome = {}
for d in ("/tmp", "/var/tmp", "/dev/shm", "."):
    try:
        with open(os.path.join(d, "{marker}"), "w") as f:
            f.write("left behind")
        outcome[d] = "written"
    except OSError as e:  # refused where the sandbox confines writes to the working directory (Landlock)
        outcome[d] = errno.errorcode[e.errno]
try:
    os.makedirs("/tmp/{marker}-dir/sub")
    open("/tmp/{marker}-dir/sub/f", "w").write("x")
    os.chmod("/tmp/{marker}-dir/sub", 0)
    outcome["/tmp/-dir"] = "written"
except OSError as e:
    outcome["/tmp/-dir"] = errno.errorcode[e.errno]
print(os.getcwd())
print(json.dumps(outcome))
"""


def fill_program(where: str, marker: str, what: str) -> str:
    """Create up to 5000 empty files, or up to 128 MiB in 1 MiB files, in ``where``; print how many
    and the error that stopped it."""
    limit, chunk = (5000, b"") if what == "files" else (128, b"x" * (1 << 20))
    return f"""
import errno, os
d = os.path.join({where!r}, "{marker}")
os.mkdir(d)
n, stop = 0, "none"
try:
    while n < {limit}:
        with open(os.path.join(d, str(n)), "wb") as f:
            f.write({chunk!r})
        n += 1
except OSError as e:
    stop = errno.errorcode[e.errno]
print(n, stop)
"""


ELSEWHERE = """
import json, sys
sys.path.insert(0, sys.argv[2])
from runners.data.sandbox import SandboxConfig, isolation, run_python
from tests.data.sandbox_programs import FILES, HOSTILE, LEFTOVERS, daemon_program
marker, mode = sys.argv[1], sys.argv[3]
report = {"isolation": isolation(SandboxConfig(namespaces=mode))}
def run(code, **limits):
    return run_python(code.replace("{marker}", marker), config=SandboxConfig(namespaces=mode, **limits))
report["daemon"] = run(daemon_program(marker, "timeout"), timeout_s=3.0).stdout
report["files"], report["written"] = run(FILES).stdout.splitlines()
report["hostile"] = run(HOSTILE, timeout_s=4.0).status  # kill(-1) and kill of every pid: this process must live
report["bomb"] = run(LEFTOVERS, timeout_s=5.0).stdout.strip()
umount = "import ctypes\\nprint(ctypes.CDLL(None, use_errno=True).umount2(b'/tmp', 2), ctypes.get_errno())"
report["umount"] = run(umount).stdout.split()
try:
    run_python("print(1)", config=SandboxConfig(namespaces="require"))
except RuntimeError as exc:
    report["require"] = str(exc)
print(json.dumps(report))
"""
