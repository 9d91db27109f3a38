"""A full disk in the middle of a run: one line naming the full file system and what to free, no
"--- Logging error ---" tracebacks (Hydra's log file is on the same disk), no SQL (``runners.disk_full``).

References: ``df`` for the mount point and free space, Python's own logging output for a handler whose
write fails, a real tmpfs filled during a real ``trustbench run`` (root only) and MLflow's client.
"""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import os
import subprocess
import time
from pathlib import Path

import pytest

from runners import disk_full
from tests.reliability import FAST, one_message, only_run_dir, runs, start, steps, trustbench


def test_the_note_names_the_full_file_system_and_what_to_free(tmp_path):
    """Only for a full-disk message; it names the place given, its mount point (as ``df`` reports it)
    and the runs' checkpoints under the home."""
    mount = subprocess.run(["df", "--output=target", str(tmp_path)], capture_output=True, text=True).stdout
    mount = mount.splitlines()[-1].strip()
    assert disk_full.note("RuntimeError: shapes do not match", tmp_path) == ""
    for message in ("sqlite3.OperationalError: database or disk is full", "OSError: [Errno 28] No space left"):
        note = disk_full.note(message, f"sqlite:///{tmp_path / 'mlflow.db'}", home=tmp_path)
        assert note.startswith(f"; the file system of {tmp_path / 'mlflow.db'} ({mount}) is full"), note
        assert f"{tmp_path / 'runs'}/*/checkpoint*.pt" in note and "resumes" in note


class _FullStream(io.StringIO):
    def __init__(self, code: int) -> None:
        super().__init__()
        self.code = code

    def write(self, text: str) -> int:
        raise OSError(self.code, os.strerror(self.code))


def test_a_log_record_that_cannot_be_written_to_a_full_disk_is_dropped_quietly(capsys):
    """Python prints "--- Logging error ---" with a traceback when a handler's write fails; for a full
    disk (ENOSPC) nothing is printed once ``quiet_log_errors`` is on, for another error Python's output stays."""
    log = logging.getLogger("tests.disk_full")
    log.propagate = False
    try:
        for code, printed in ((errno.ENOSPC, False), (errno.EIO, True)):
            handler = logging.StreamHandler(_FullStream(code))
            log.addHandler(handler)
            try:
                disk_full.quiet_log_errors()
                log.warning("a record with %s", "[SQL: INSERT INTO metrics ...]")
            finally:
                log.removeHandler(handler)
            err = capsys.readouterr().err
            assert ("--- Logging error ---" in err) is printed, err
    finally:
        log.propagate = True


@pytest.fixture
def small_fs(tmp_path):
    mount = tmp_path / "fs"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)]).returncode:
        pytest.skip("needs root to mount a small tmpfs (a disk that fills up)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(path: Path) -> None:
    with open(path, "wb", buffering=0) as fh:
        for size in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    fh.write(b"x" * size)


@pytest.mark.slow
@pytest.mark.e2e
def test_a_disk_that_fills_mid_run_gives_one_line_and_no_logging_tracebacks(small_fs):
    """The disk (home, Hydra's log file and the temporary directory on it) fills after the first
    checkpoint: exit 1, one line naming the file system and what to free; stderr has no "Logging error",
    no SQL, no traceback (it had ~200 lines: a traceback and call stack per log record Hydra's
    ``main.log`` could not take). Space freed, the rerun resumes the same MLflow run and finishes."""
    from runners import tracking

    home, fill, tmp = small_fs / "home", small_fs / "fill", small_fs / "tmp"
    tmp.mkdir()
    tracking.ensure_store(f"sqlite:///{home / 'mlflow.db'}")
    args = ["run", *FAST, "trainer.total_steps=3", "trainer.checkpoint_every=1", "tracking.flush_every_s=1"]
    running = start([*args, "debug.step_delay_s=4"], home, TMPDIR=str(tmp))
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not list(home.glob("runs/*/checkpoint.pt")):
            assert running.poll() is None, running.communicate()
            time.sleep(0.2)
        _fill(fill)
        _, err = running.communicate(timeout=300)
    finally:
        running.kill()
    assert running.returncode == 1, err
    assert "Logging error" not in err and "[SQL:" not in err and "INSERT INTO" not in err, err
    one_message(err, "database or disk is full", f"({small_fs}) is full", "free space there", "resumes")
    (run,) = runs(home)
    fill.unlink()
    again = trustbench(args, home, TMPDIR=str(tmp))
    assert again.returncode == 0, again.stderr[-3000:]
    (done,) = runs(home)
    assert done.info.run_id == run.info.run_id and done.info.status == "FINISHED"
    assert steps(home, run.info.run_id) == [1, 2, 3]
    assert (only_run_dir(home) / "checkpoint.pt").exists()
