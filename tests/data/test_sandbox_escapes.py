"""Escapes from the code-reward sandbox that a hostile-but-fair program tries, each checked against
the machine itself (/proc, the host file system, a second program's result), in both the
namespace mode and the fallback (``namespaces="off"``; and for real, with CAP_SYS_ADMIN dropped
so that the kernel refuses the namespaces):

- a setsid / double-fork daemon must be dead when ``run_python`` returns (program exited or timed out);
- one program's leftover processes or fork bomb must not make another, innocent program fail;
- two programs running at the same time (threads) must not affect each other (signals, process
  limit, /tmp);
- files written to /tmp, /var/tmp, /dev/shm and the working directory must be gone after the
  run, and their number and size must be capped while it runs.

A trainer that is not root gets no uid per run: without namespaces its programs are confined by
Landlock (writes outside the working directory refused, no signal outside the run) and share the
trainer uid's process count (runners/data/sandbox.py). Tests that need what such a machine cannot
give are skipped with the reason; the root-only tests at the end run a trainer as ``nobody`` to
check that path here.
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from runners.data import _sandbox_uids
from runners.data.sandbox import SandboxConfig, isolation, run_python
from tests.data.sandbox_programs import (
    ELSEWHERE,
    FILES,
    HOSTILE,
    INNOCENT,
    LEFTOVERS,
    NEIGHBOUR,
    daemon_program,
    fill_program,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
# reliability scenarios (README, "Reliability tests"): left out of make test-fast
pytestmark = pytest.mark.e2e
MODES = ["auto", "off"]  # namespaces when the kernel allows them; the fallback, forced
NAMESPACES = isolation()["namespaces"]
needs_private_fs = pytest.mark.skipif("mount" not in NAMESPACES, reason="no mount namespace on this machine")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="per-run uids need a root trainer")


def _skip_without(namespaces: str, what: str) -> None:
    """Skip (with the reason) where this machine's sandbox in ``namespaces`` mode cannot give ``what``."""
    info = isolation(SandboxConfig(namespaces=namespaces))
    if what == "file_cleanup" and info["files"] == "workdir_only":
        pytest.skip("not root, no mount namespace, no Landlock: files outside the working directory stay (sandbox.py)")
    if what == "separate_runs" and (info["process_limit"] == "shared" or info["signals"] == "trainer_uid"):
        pytest.skip(f"not root, no namespaces: process count shared with the trainer's uid, signals: {info['signals']}")


def _live_pids(match) -> list[int]:
    """Host pids of live (not zombie) processes for which ``match(pid_dir)`` holds."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            state = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
            if state not in (b"Z", b"X") and match(Path(f"/proc/{name}")):
                found.append(int(name))
        except (OSError, IndexError):
            continue
    return found


def _with_marker(marker: str) -> list[int]:
    return _live_pids(lambda d: marker.encode() in (d / "cmdline").read_bytes())


def _of_uid(uid: int) -> list[int]:
    """Live processes with ``uid`` as real, effective, saved or file-system uid."""

    def uids(d: Path) -> list[int]:
        line = next(line for line in (d / "status").read_text().splitlines() if line.startswith("Uid:"))
        return [int(x) for x in line.split()[1:]]

    return _live_pids(lambda d: uid in uids(d))


@pytest.fixture
def marker():
    """A token unique to the test; processes carrying it that outlive the test are killed (by pid)."""
    token = f"trustbench-escape-{secrets.token_hex(6)}"
    yield token
    for pid in _with_marker(token):
        os.kill(pid, signal.SIGKILL)
    for base in ("/tmp", "/var/tmp", "/dev/shm"):
        for path in Path(base).glob(f"{token}*"):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


@pytest.mark.parametrize("namespaces", MODES)
@pytest.mark.parametrize("ending", ["exit", "timeout"])
def test_setsid_double_fork_daemon_is_dead_when_the_run_returns(namespaces, ending, marker):
    res = run_python(daemon_program(marker, ending), config=SandboxConfig(timeout_s=3.0, namespaces=namespaces))
    assert "daemon started" in res.stdout, res.stderr  # it did escape the process group
    assert res.status == ("ok" if ending == "exit" else "timeout")
    assert _with_marker(marker) == []  # checked at once: the run returns only after it died


@pytest.mark.parametrize("namespaces", MODES)
def test_leftovers_of_a_fork_bomb_do_not_fail_the_next_program(namespaces):
    config = SandboxConfig(timeout_s=5.0, namespaces=namespaces)
    bomb = run_python(LEFTOVERS, config=config)
    assert bomb.ok and int(bomb.stdout) >= 10, bomb.stderr  # it did fork, up to its process limit
    innocent = run_python(INNOCENT, config=config)
    assert (innocent.status, innocent.stdout) == ("ok", "[0, 1, 2, 3]\n"), innocent.stderr
    # ... which exists: RLIMIT_NPROC of its own uid or user namespace; else max_processes more than
    # the trainer's uid had (it tries 1000)
    per_run = bomb.info["process_limit"] == "per_run"
    assert int(bomb.stdout) < (1 if per_run else 2) * config.max_processes
    if os.geteuid() == 0:
        assert _of_uid(bomb.info["uid"]) == []


@pytest.mark.parametrize("namespaces", MODES)
def test_concurrent_programs_do_not_affect_each_other(namespaces, marker):
    """A hostile program (fork bomb, kill(-1), kill of every pid it can see, a file in /tmp) and an
    innocent one run at the same time from two threads; the innocent one must get its own result."""
    _skip_without(namespaces, "separate_runs")
    results = {}

    def run(name, code, timeout_s):
        config = SandboxConfig(timeout_s=timeout_s, namespaces=namespaces)
        results[name] = run_python(code.replace("{marker}", marker), config=config)

    threads = [
        threading.Thread(target=run, args=("hostile", HOSTILE, 4.0)),
        threading.Thread(target=run, args=("innocent", NEIGHBOUR, 6.0)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    innocent = results["innocent"]
    assert innocent.ok, (innocent.returncode, innocent.stderr)
    seen, codes = innocent.stdout.split(" ", 1)
    assert codes == "[0, 1, 2, 3]\n"
    if results["innocent"].info["files"] == "private_tmpfs":
        assert seen == "False"  # the hostile program's /tmp is its own
    assert not os.path.exists(f"/tmp/{marker}")  # swept or never on the host


@pytest.mark.parametrize("namespaces", MODES)
def test_files_are_gone_after_the_run(namespaces, marker):
    """Written (private tmpfs, uid sweep) or refused (Landlock: only the working directory is
    writable), nothing the program wrote is on the host after the run."""
    _skip_without(namespaces, "file_cleanup")
    res = run_python(FILES.replace("{marker}", marker), config=SandboxConfig(namespaces=namespaces))
    assert res.ok, res.stderr
    cwd, written = res.stdout.splitlines()
    elsewhere = "EACCES" if res.info["files"] == "landlock" else "written"
    expected = {".": "written", "/dev/shm": "written", **dict.fromkeys(["/tmp", "/var/tmp", "/tmp/-dir"], elsewhere)}
    assert json.loads(written) == expected
    leftovers = [f"{d}/{marker}" for d in ("/tmp", "/var/tmp", "/dev/shm", cwd)] + [f"/tmp/{marker}-dir"]
    assert [path for path in leftovers if os.path.lexists(path)] == []


@needs_private_fs
@pytest.mark.parametrize("what", ["files", "bytes"])
@pytest.mark.parametrize("where", ["/tmp", "/dev/shm", "."])
def test_scratch_space_is_capped(where, what, marker):
    """The default caps (1024 files, 64 MiB) hold in each writable place, and the program learns
    it the way a full disk tells it (ENOSPC)."""
    res = run_python(fill_program(where, marker, what), config=SandboxConfig(timeout_s=20.0))
    assert res.ok, res.stderr
    n, stop = res.stdout.split()
    cap = 1024 if what == "files" else 64
    assert int(n) <= cap and stop == "ENOSPC"


@needs_root
def test_each_run_has_a_uid_of_its_own_that_no_account_uses():
    uids_in_use = {user.pw_uid for user in pwd.getpwall()}
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(run_python("import os\nprint(os.getuid())"))) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    uids = {int(res.stdout) for res in results}
    assert len(uids) == 4 and not uids & uids_in_use and 0 not in uids


@needs_root
def test_a_slot_left_dirty_is_swept_before_reuse(monkeypatch, marker):
    """A trainer that died mid-run leaves its uid's processes and files; the next holder of the
    slot kills and removes them first."""
    monkeypatch.setattr(_sandbox_uids.secrets, "randbelow", lambda n: 7)
    lease = _sandbox_uids.acquire()
    sleeper = subprocess.Popen(
        ["/bin/sleep", "30"], user=lease.uid, group=lease.uid, extra_groups=[], start_new_session=True
    )
    Path(f"/tmp/{marker}").write_text("left")
    os.chown(f"/tmp/{marker}", lease.uid, lease.uid)
    _sandbox_uids.release(lease, clean=False)
    again = _sandbox_uids.acquire()
    try:
        assert again.uid == lease.uid
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
        assert not os.path.exists(f"/tmp/{marker}")
    finally:
        _sandbox_uids.release(again)


def run_elsewhere(prefix: list[str], python: str, marker: str, namespaces: str = "auto") -> dict:
    """Run the daemon, files, hostile (kill -1) and fork-bomb programs from a trainer started as
    ``prefix python``; its report. The trainer must survive (exit 0), no process or file remain."""
    out = subprocess.run(
        [*prefix, python, "-c", ELSEWHERE, marker, str(REPO_ROOT), namespaces],
        cwd="/", capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert out.returncode == 0, (out.returncode, out.stderr)
    report = json.loads(out.stdout)
    assert report["daemon"].startswith("daemon started")
    assert _with_marker(marker) == []
    leftovers = [f"{d}/{marker}" for d in ("/tmp", "/var/tmp", "/dev/shm", report["files"])] + [f"/tmp/{marker}-dir"]
    assert [path for path in leftovers if os.path.lexists(path)] == []
    return report


@needs_root
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) not installed")
def test_fallback_when_the_kernel_refuses_namespaces(marker):
    """The trainer without CAP_SYS_ADMIN: unshare() fails with EPERM in the sandbox, which then
    falls back (subreaper, uid sweep) and must still kill the daemon and remove the files."""
    prefix = ["setpriv", "--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin"]
    report = run_elsewhere(prefix, sys.executable, marker)
    assert report["isolation"]["namespaces"] == [] and report["isolation"]["processes"] == "subreaper"
    assert "refused" in report["require"]


AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _can_run_as_nobody() -> bool:
    if os.geteuid() != 0 or shutil.which("setpriv") is None or not os.access("/usr/bin/python3", os.X_OK):
        return False
    return subprocess.run([*AS_NOBODY, "/usr/bin/python3", "-c", ""], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_run_as_nobody(), reason="needs root, setpriv and /usr/bin/python3")
def test_unprivileged_trainer_without_namespaces_is_confined_by_landlock(marker):
    """A trainer running as ``nobody`` with ``namespaces="off"`` (the path of a non-root trainer on a
    kernel that refuses namespaces): the daemon dies, writes outside the working directory and
    /dev/shm are refused (EACCES), nothing written remains, a program's kill(-1) does not reach the trainer, and a fork
    bomb is bounded near ``max_processes`` (64) although it tries 1000."""
    import ctypes

    abi = ctypes.CDLL(None, use_errno=True).syscall(ctypes.c_long(444), None, ctypes.c_long(0), ctypes.c_long(1))
    if abi < 6:  # landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
        pytest.skip(f"Landlock ABI {abi} (< 6): files and signals of a non-root trainer unconfined (sandbox.py)")
    report = run_elsewhere(AS_NOBODY, "/usr/bin/python3", marker, "off")
    info = report["isolation"]
    assert (info["files"], info["processes"], info["process_limit"]) == ("landlock", "subreaper", "shared")
    written = json.loads(report["written"])
    assert written == {
        ".": "written",
        "/dev/shm": "written",
        **dict.fromkeys(["/tmp", "/var/tmp", "/tmp/-dir"], "EACCES"),
    }
    assert report["hostile"] in ("ok", "timeout") and 10 <= int(report["bomb"]) < 2 * 64
    assert (info["landlock"], info["signals"]) == (abi, "landlock")


def _unprivileged_user_namespaces() -> bool:
    if os.geteuid() != 0 or shutil.which("setpriv") is None or not os.access("/usr/bin/python3", os.X_OK):
        return False
    return subprocess.run([*AS_NOBODY, "unshare", "--user", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(
    not _unprivileged_user_namespaces(), reason="needs root, setpriv, /usr/bin/python3, user namespaces"
)
def test_unprivileged_trainer_gets_a_user_namespace(marker):
    """A trainer running as ``nobody`` (system interpreter: ours may not be readable by it) maps
    itself to root of a user namespace for the pid/mount/network namespaces; the program, in a
    nested one, cannot unmount its private /tmp (EPERM) to reach the host's."""
    report = run_elsewhere(AS_NOBODY, "/usr/bin/python3", marker)
    assert report["isolation"]["namespaces"] == ["mount", "pid", "net", "ipc", "user"]
    assert report["umount"] == ["-1", str(errno.EPERM)]
