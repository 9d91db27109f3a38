"""What a verl cell shows on the terminal: trustbench's own lines; verl's and Ray's output in the run's log.

A verl launch prints thousands of lines (its config, every Ray worker's warnings); ``trustbench run``
writes them to ``verl/verl.<attempt>.log`` in the run directory and shows: the log's path first, one
line per step (``progress``), the end; on failure the log's last ``TAIL_LINES`` lines, its path and
the one-line error. ``debug.verbose=true`` echoes verl's output as well.

Checked against a stand-in for verl (``NOISY_VERL``: test_backend's ``FAKE_VERL`` -- verl's loop,
checkpoints and file logger -- after 200 numbered warning lines on stdout and stderr, as Ray's workers
print them, and with numbered closing lines after it), through ``runners.main``'s ``trustbench run``
path in this process, with a tiny model CPU mode accepts: the terminal (captured file descriptors)
against the lines written here by hand, the log against the stand-in's own lines. The real verl
cell's terminal is checked by the "verl on CPU" stage (``test_cpu_stage.py``).

Run: ``pytest tests/verl/test_terminal.py``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.verl.test_backend import FAKE_VERL

NOISE = 200
CLOSING = 40
NOISY_VERL = f"""
import sys
for i in range(1, {NOISE + 1}):
    print(f"(WorkerDict pid=7) WARNING verl line {{i}}", file=sys.stderr if i % 2 else sys.stdout, flush=True)
try:
    exec(compile({FAKE_VERL!r}, "fake_verl", "exec"))
finally:
    for i in range(1, {CLOSING + 1}):
        print(f"closing line {{i}}", flush=True)
"""


@pytest.fixture
def cell(tmp_path, monkeypatch):
    from runners.config import compose

    script = tmp_path / "noisy_verl.py"
    script.write_text(NOISY_VERL)
    monkeypatch.setenv("TRUSTBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    for var in [v for v in os.environ if v.startswith(("SLURM_", "MLFLOW_", "RAY_"))]:
        monkeypatch.delenv(var)

    def make(*extra):
        return compose(
            [
                "backend=verl",
                "model=tiny_qwen2",
                "dataset.train_limit=16",
                "dataset.eval_limit=4",
                "trainer.total_steps=4",
                "trainer.prompts_per_step=2",
                "trainer.mini_batch_prompts=2",
                "trainer.n=2",
                "trainer.eval_every=2",
                f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
                f"backend.options.entrypoint={script}",
                *extra,
            ]
        )

    return make


def _trustbench_run(cfg, choices):
    """``trustbench run``'s handling of one cell (``runners.main._run_one``): its exit status."""
    from runners.main import _run_one

    try:
        _run_one(cfg, choices)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    return 0


def _log_of(cfg) -> Path:
    from runners import paths
    from runners.backends.verl.layout import VerlLayout
    from runners.config import run_key

    return VerlLayout.of(paths.run_dir(run_key(cfg))).log_file(1)


def _first_line(lines: list[str], log: Path) -> str:
    assert lines, "nothing on the terminal"
    match = re.fullmatch(r"\[trustbench\] (.+): verl's output goes to (\S+)", lines[0])
    assert match is not None and match.group(2) == str(log), lines[0]
    return match.group(1)  # the cell's label


def test_the_terminal_shows_steps_and_the_log_holds_verls_output(cell, capfd):
    """Success: the log's path, one line per step with its score (the stand-in's step/10), the end;
    none of verl's lines on the terminal, all of them in the log."""
    cfg, choices = cell("progress=true")
    assert _trustbench_run(cfg, choices) == 0
    out, err = capfd.readouterr()
    log = _log_of(cfg)
    assert out == ""
    lines = err.splitlines()
    label = _first_line(lines, log)
    assert lines[1] == f"[trustbench] {label}: verl starting in CPU mode: steps 0 -> 4"
    assert lines[2:7] == [
        f"[trustbench] {label}: step 0/4 (before training) eval=0.25",
        f"[trustbench] {label}: step 1/4 score=0.10",
        f"[trustbench] {label}: step 2/4 score=0.20 eval=0.20",
        f"[trustbench] {label}: step 3/4 score=0.30",
        f"[trustbench] {label}: step 4/4 score=0.40 eval=0.40",
    ]
    assert re.fullmatch(rf"\[trustbench\] {re.escape(label)}: verl trained to step 4 in \d+ s \(log: {log}\)", lines[7])
    assert len(lines) == 8, lines[8:]
    logged = log.read_text().splitlines()
    assert [line for line in logged if "WARNING verl line" in line] == [
        f"(WorkerDict pid=7) WARNING verl line {i}" for i in range(1, NOISE + 1)
    ]
    assert logged[-1] == f"closing line {CLOSING}"


def test_a_failed_verl_shows_the_logs_last_lines_its_path_and_the_error(cell, capfd, monkeypatch):
    """verl exits 3: the terminal has the log's path, the log's last 30 lines (closing lines 11-40,
    the stand-in's last output), and last the one-line error naming the log; exit status 1."""
    from runners.backends.verl.process import TAIL_LINES

    monkeypatch.setenv("FAKE_VERL_EXIT", "3")
    cfg, choices = cell("progress=false")
    assert _trustbench_run(cfg, choices) == 1
    out, err = capfd.readouterr()
    log = _log_of(cfg)
    assert out == ""
    lines = err.splitlines()
    label = _first_line(lines, log)
    header = lines.index(f"[trustbench] {label}: verl exited with status 3; the last {TAIL_LINES} lines of {log}:")
    assert TAIL_LINES == 30
    assert lines[header + 1 : -1] == [f"    closing line {i}" for i in range(CLOSING - TAIL_LINES + 1, CLOSING + 1)]
    assert re.fullmatch(
        rf"trustbench: run .* failed: (RuntimeError: )?verl exited with status 3; see {log}", lines[-1]
    ), lines[-1]
    assert not any("verl line" in line or "step 1/4" in line for line in lines)  # progress=false: no step lines
    assert log.read_text().splitlines()[-TAIL_LINES:] == [f"closing line {i}" for i in range(11, CLOSING + 1)]


def test_debug_verbose_echoes_verls_output(cell, capfd, monkeypatch):
    """``debug.verbose=true``: verl's lines on the terminal too (and no tail repeated on failure)."""
    monkeypatch.setenv("FAKE_VERL_EXIT", "3")
    cfg, choices = cell("progress=false", "debug.verbose=true")
    assert _trustbench_run(cfg, choices) == 1
    out, err = capfd.readouterr()
    terminal = (out + err).splitlines()
    assert sum("WARNING verl line" in line for line in terminal) == NOISE
    assert sum(line == f"closing line {CLOSING}" for line in terminal) == 1
    assert "lines of" not in err


def test_step_line_and_tail_by_hand(tmp_path):
    """A step's line: the built-in progress bar's summary (score, eval, H) and the step's seconds;
    the tail of a log: its last lines, also when the log is missing."""
    from runners.backends.verl.process import step_line, tail

    metrics = {
        "critic/score/mean": 0.25,
        "actor/entropy": 0.614,
        "val-core/gsm8k/acc/mean_at_4": 0.71,
        "timing_s/step": 36.94,
        "actor/pg_loss": -0.01,
    }
    assert step_line("GRPO", 2, 4, metrics) == "GRPO: step 2/4 score=0.25 eval=0.71 H=0.61 36.9 s"
    log = tmp_path / "verl.1.log"
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(1, 101)) + b"last, unterminated \xff")
    assert tail(log, 3) == ["line 99", "line 100", "last, unterminated \ufffd"]
    assert tail(tmp_path / "missing.log") == []
