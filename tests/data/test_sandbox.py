"""The sandbox against hostile programs (correct, wrong, infinite loop, memory bomb, network
attempt, crash, huge output, environment leaks, filesystem writes) and the code reward built on it.
Each check compares with what the program would do unconfined (e.g. a local TCP server that must
receive no connection); the limits are checked in the namespace mode and in the fallback
(``namespaces="off"``). Escapes (daemons, leftovers, concurrent runs, files): test_sandbox_escapes.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
from pathlib import Path

import pytest

from runners.data.code_tests import code_reward, extract_code, parse_test_cases, stdout_matches, value_matches
from runners.data.sandbox import SandboxConfig, isolation, run_python

FAST = SandboxConfig(timeout_s=2.0, memory_mb=256)
MODES = ["auto", "off"]  # namespaces when the kernel allows them; the fallback, forced
REPO_ROOT = Path(__file__).resolve().parents[2]


def test_correct_and_wrong_programs():
    ok = run_python("a, b = map(int, input().split())\nprint(a + b)", stdin="2 3\n", config=FAST)
    assert (ok.status, ok.stdout) == ("ok", "5\n")
    wrong = run_python("print(0)", stdin="2 3\n", config=FAST)
    assert wrong.ok and not stdout_matches(wrong.stdout, "5")


def test_function_call_mode_top_level_and_solution_method():
    res = run_python("def f(xs, k):\n    return sorted(xs)[:k], k", fn_name="f", args=[[3, 1, 2], 2], config=FAST)
    assert res.ok and res.value == [[1, 2], 2]
    res = run_python(
        "class Solution:\n    def g(self, s):\n        print('noise')\n        return s[::-1]",
        fn_name="g",
        args=["abc"],
        config=FAST,
    )
    assert res.ok and res.value == "cba" and "noise" in res.stdout
    missing = run_python("x = 1", fn_name="g", args=[], config=FAST)
    assert missing.status == "error" and "NameError" in missing.stderr


@pytest.mark.parametrize("namespaces", MODES)
def test_ordinary_programs_work(namespaces):
    """What an honest solution may do: temp files, a multiprocessing pool of its own functions
    (semaphores in /dev/shm, pickling from __main__), a child interpreter, /dev/null."""
    code = (
        "import multiprocessing, subprocess, sys, tempfile\n"
        "def square(x):\n    return x * x\n"
        "with tempfile.NamedTemporaryFile('w+') as f:\n    f.write('3'); f.flush(); f.seek(0); n = int(f.read())\n"
        "with multiprocessing.Pool(2) as pool:\n    print(pool.map(square, range(n)))\n"
        "print(subprocess.run([sys.executable, '-c', 'print(7)'], capture_output=True, text=True).stdout, end='')\n"
        "open('/dev/null', 'w').write('x')\n"
    )
    res = run_python(code, config=SandboxConfig(timeout_s=10.0, namespaces=namespaces))
    assert (res.status, res.stdout) == ("ok", "[0, 1, 4]\n7\n"), res.stderr


@pytest.mark.parametrize("namespaces", MODES)
def test_infinite_loop_is_killed_at_the_time_limit(namespaces):
    res = run_python("while True:\n    pass", config=SandboxConfig(timeout_s=1.0, namespaces=namespaces))
    assert res.status == "timeout"


def _live_with_marker(marker: str) -> dict[int, bytes]:
    """Host pids (and command lines) of live, not zombie, processes whose command line holds ``marker``
    (read from /proc: a pid reused by another process does not carry the marker)."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            state = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker.encode() in cmdline and state not in (b"Z", b"X"):
            found[int(name)] = cmdline
    return found


def _sleeping_family(marker: str) -> str:
    """A child that starts a grandchild, both sleeping 60 s with ``marker`` in their command lines; the
    program says so once the grandchild runs, then spins until the time limit."""
    grandchild = "import pathlib, time; pathlib.Path('grandchild').touch(); time.sleep(60)"
    child = (
        "import subprocess, sys, time; "
        f"subprocess.Popen([sys.executable, '-c', {grandchild!r}, 'grandchild-{marker}']); time.sleep(60)"
    )
    return (
        "import os, subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {child!r}, 'child-{marker}'])\n"
        "for _ in range(1000):\n"
        "    if os.path.exists('grandchild'):\n"
        "        break\n"
        "    time.sleep(0.01)\n"
        "print('grandchild started', flush=True)\n"
        "while True:\n"
        "    pass\n"
    )


@pytest.mark.parametrize("namespaces", MODES)
def test_sleeping_child_processes_are_killed_with_the_program(namespaces):
    """The program's child and grandchild (sleeping 60 s) are seen from the host while the program
    spins, and are gone (not even zombies) when ``run_python`` returns at the time limit. The time
    limit leaves room for three interpreters to start on a loaded machine."""
    marker = f"trustbench-sleeper-{os.getpid()}-{threading.get_ident()}-{namespaces}"
    done, seen = threading.Event(), {}

    def run():
        seen["result"] = run_python(
            _sleeping_family(marker), config=SandboxConfig(timeout_s=3.0, namespaces=namespaces)
        )
        done.set()

    thread = threading.Thread(target=run)
    thread.start()
    while not done.wait(0.02):
        seen.update(_live_with_marker(marker))  # a forked child carries its parent's command line until exec
    thread.join()
    leftover = _live_with_marker(marker)
    for pid in leftover:  # do not leave them to the rest of the suite
        os.kill(pid, signal.SIGKILL)
    res = seen.pop("result")
    assert res.status == "timeout"
    assert "grandchild started" in res.stdout, res.stderr
    last_args = {cmdline.split(b"\0")[-2].decode() for cmdline in seen.values()}
    assert last_args == {f"child-{marker}", f"grandchild-{marker}"}, seen  # both ran, seen from here
    assert leftover == {}
    for pid, cmdline in seen.items():  # gone, or a zombie, or the pid already reused by another process
        try:
            state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
            assert state in (b"Z", b"X") or Path(f"/proc/{pid}/cmdline").read_bytes() != cmdline, pid
        except FileNotFoundError:
            pass


@pytest.mark.parametrize("namespaces", MODES)
@pytest.mark.parametrize(
    "code", ["x = bytearray(4 * 1024**3)", "xs = []\nwhile True:\n    xs.append(bytearray(10**7))"]
)
def test_memory_bomb_hits_the_memory_limit(code, namespaces):
    # the time limit only bounds a sandbox whose memory limit failed: under load (the suite runs in
    # parallel) starting the interpreter alone took over 5 s once, and the bomb then read "timeout"
    res = run_python(code, config=SandboxConfig(timeout_s=60.0, memory_mb=256, namespaces=namespaces))
    assert res.status == "memory"


@pytest.mark.parametrize("namespaces", MODES)
def test_huge_output_is_capped(namespaces):
    config = SandboxConfig(timeout_s=5.0, max_output_bytes=1 << 20, namespaces=namespaces)
    res = run_python("while True:\n    print('x' * 1000)", config=config)
    assert res.status == "output_limit"
    assert len(res.stdout) <= 1 << 20


@pytest.mark.parametrize("namespaces", MODES)
def test_crash_and_exit_codes(namespaces):
    config = SandboxConfig(timeout_s=5.0, namespaces=namespaces)
    res = run_python("1 / 0", config=config)
    assert res.status == "error" and "ZeroDivisionError" in res.stderr
    assert 'main.py", line 1' in res.stderr  # tracebacks name the program's file
    res = run_python("import os\nos.abort()", config=config)
    assert res.status == "error" and res.returncode == -6  # SIGABRT, as the program saw it
    res = run_python("raise SystemExit(3)", config=config)
    assert (res.status, res.returncode) == ("error", 3)


@pytest.fixture
def tcp_server():
    """A local TCP server recording whether anything connected."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.1)
    hits, stop = [], threading.Event()

    def accept():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            hits.append(True)
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], hits
    stop.set()
    thread.join(timeout=10)
    server.close()


def _connect_program(port: int) -> str:
    return f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')"


def test_unconfined_program_would_reach_the_server(tcp_server):
    """Control: the same program run normally does connect (so the sandbox checks mean something)."""
    port, hits = tcp_server
    exec(_connect_program(port), {})  # noqa: S102 - our own trusted snippet
    for _ in range(50):  # the accept thread records the hit asynchronously
        if hits:
            break
        threading.Event().wait(0.1)
    assert hits


@pytest.mark.parametrize("namespaces", MODES)
def test_network_attempt_fails(tcp_server, namespaces):
    port, hits = tcp_server
    res = run_python(_connect_program(port), config=SandboxConfig(timeout_s=5.0, namespaces=namespaces))
    assert res.status == "error" and "connected" not in res.stdout
    assert not hits


@pytest.mark.skipif(isolation()["network"] != "namespace", reason="no network namespace on this machine")
def test_network_namespace_alone_blocks_the_connection(tcp_server):
    """With the socket guard off, only the empty network namespace stands between program and server."""
    port, hits = tcp_server
    res = run_python(_connect_program(port), config=SandboxConfig(timeout_s=5.0, socket_guard=False))
    assert res.status == "error" and "connected" not in res.stdout
    assert "network is disabled" not in res.stderr  # the guard really was off
    assert not hits


@pytest.mark.parametrize("namespaces", MODES)
def test_clean_environment_and_private_working_directory(monkeypatch, namespaces):
    monkeypatch.setenv("TRUSTBENCH_TEST_SECRET", "s3cr3t")
    code = "import os, json\nopen('scratch.txt', 'w').write('x')\nprint(json.dumps([dict(os.environ), os.getcwd()]))"
    res = run_python(code, config=SandboxConfig(namespaces=namespaces))
    env, cwd = json.loads(res.stdout)
    assert "TRUSTBENCH_TEST_SECRET" not in env and "s3cr3t" not in json.dumps(env)
    assert cwd != os.getcwd() and not os.path.exists(os.path.join(cwd, "scratch.txt"))  # gone with the run


@pytest.mark.skipif(os.geteuid() != 0, reason="privilege drop applies when the trainer runs as root")
@pytest.mark.parametrize("namespaces", MODES)
def test_root_parent_runs_programs_unprivileged(namespaces):
    """Not root, and unable to write a root-owned directory the trainer can (namespaces: every
    mount but the private tmpfs is read-only as well)."""
    target = REPO_ROOT / "tests" / "data" / f"sandbox-owned-{os.getpid()}.txt"
    code = f"import os\nprint(os.getuid())\nopen({str(target)!r}, 'w').write('x')"
    res = run_python(code, config=SandboxConfig(timeout_s=5.0, namespaces=namespaces))
    assert int(res.stdout) != 0
    refusals = ["PermissionError", "Read-only file system"]
    if res.info.get("files") == "private_tmpfs" and _under_private_tmpfs(target):
        refusals.append("FileNotFoundError")  # a checkout under /tmp: the private tmpfs hides the directory
    assert res.status == "error" and any(r in res.stderr for r in refusals), res.stderr
    assert not target.exists()


def _under_private_tmpfs(path) -> bool:
    """Whether ``path`` lies in a world-writable directory the namespaces mode covers with its tmpfs."""
    from runners.data import _sandbox_uids

    real = os.path.realpath(path)
    return any(real.startswith(d.rstrip("/") + "/") for d in _sandbox_uids.world_writable_dirs())


def test_isolation_report_names_the_mechanism():
    report = isolation()
    assert report["network"] in ("namespace", "socket_guard")
    assert report["processes"] in ("pid_namespace", "subreaper")
    assert report["timeout_s"] == 10.0  # TROLL (arXiv 2510.03817) appendix C.2 default
    fallback = isolation(SandboxConfig(namespaces="off"))
    assert (fallback["namespaces"], fallback["processes"]) == ([], "subreaper")
    # not root: Landlock's TCP rules (ABI >= 4) besides the socket guard; root: a uid of the run's own
    assert fallback["network"] == ("landlock" if fallback["landlock"] >= 4 else "socket_guard")
    assert fallback["files"] == (
        "uid_sweep" if os.geteuid() == 0 else "landlock" if fallback["landlock"] else "workdir_only"
    )


def test_unknown_namespaces_setting_is_named():
    with pytest.raises(ValueError, match="namespaces must be one of"):
        run_python("print(1)", config=SandboxConfig(namespaces="maybe"))


# -- code reward ---------------------------------------------------------------------------------
ADD_CASES = json.dumps({"inputs": ["1 2\n", "5 7\n", "0 0\n", "10 -3\n"], "outputs": ["3\n", "12\n", "0\n", "7\n"]})
ADD_SOLUTION = "Read two ints.\n```python\na, b = map(int, input().split())\nprint(a + b)\n```\nDone."


def test_code_reward_fraction_of_tests_passed():
    assert code_reward(ADD_SOLUTION, ADD_CASES) == 1.0
    half = "```python\na, b = map(int, input().split())\nprint(a + b if a < 5 else 0)\n```"
    assert code_reward(half, ADD_CASES) == 0.5  # passes 1 2, 0 0; fails 5 7, 10 -3
    assert code_reward("I cannot solve this.", ADD_CASES) == 0.0
    assert code_reward("", ADD_CASES) == 0.0


def test_code_reward_is_zero_when_a_case_times_out():
    slow_on_zero = "```python\na, b = map(int, input().split())\nwhile a == 0: pass\nprint(a + b)\n```"
    assert code_reward(slow_on_zero, ADD_CASES, timeout_s=1.0) == 0.0


def test_code_reward_function_call_formats():
    apps_style = json.dumps({"fn_name": "add", "inputs": [[1, 2], [3, 4]], "outputs": [[3], [7]]})
    assert code_reward("```python\ndef add(a, b):\n    return a + b\n```", apps_style) == 1.0
    lines_style = json.dumps({"fn_name": "twoSum", "inputs": ["[2, 7, 11, 15]\n9"], "outputs": ["[0, 1]"]})
    solution = (
        "```python\nclass Solution:\n    def twoSum(self, nums, target):\n        seen = {}\n"
        "        for i, x in enumerate(nums):\n            if target - x in seen:\n"
        "                return [seen[target - x], i]\n            seen[x] = i\n```"
    )
    assert code_reward(solution, lines_style) == 1.0


def test_code_reward_only_the_first_ten_cases_count():
    cases = {"inputs": [f"{i}\n" for i in range(12)], "outputs": [f"{i}\n" for i in range(10)] + ["x\n", "x\n"]}
    assert code_reward("```python\nprint(input())\n```", json.dumps(cases)) == 1.0


def test_helpers_by_hand():
    assert extract_code("```py\nprint(1)\n```\ntext\n```python\nprint(2)\n```") == "print(2)\n"
    assert extract_code("```cpp\nint main(){}\n```") is None
    assert stdout_matches("1 2\n3\n\n", "1 2\n3")
    assert stdout_matches("0.3333333", "0.33333333") and not stdout_matches("0.33", "0.34")
    assert value_matches([1, 2], "[[1, 2]]") and value_matches(3, [3]) and not value_matches(3, [4])
    with pytest.raises(ValueError, match="'inputs' and 'outputs'"):
        parse_test_cases('{"input": []}')
