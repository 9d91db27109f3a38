"""User mistakes end as one message naming the key or the file, exit code 2, and no FAILED run.

Each case is a mistake a user makes for real (a bad dataset file, a misspelt option, a device the
machine lacks, an empty experiment name, a prompt budget nothing fits, a YAML typo in a sweep file
or a site's ``conf/launcher/cluster.yaml``), run through the real command (``runners.cli.main``, in
this process for speed; the dataset and device mistakes surface only while the cell is being built).
The reference is the command's stderr and exit code, and MLflow's own client on the store: no run
FAILED for a configuration mistake. Also here: Hydra's flags in any position, sweep flags after
overrides, ``report`` of a missing experiment creating nothing, ``trustbench ui``'s processes and
its message for a tracking URI where nothing answers.

Run:  pytest tests/test_reliability_messages.py
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pandas as pd
import pytest

from runners import cli
from runners.config import CONF_DIR, SWEEPS_DIR
from tests.reliability import FAST, cli_home, command_env, free_port, one_message, runs  # noqa: F401 (cli_home: fixture "home")

# reliability scenarios (README, "Reliability tests"): left out of make test-fast
pytestmark = pytest.mark.e2e


def _main(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def _dataset_files(root):
    """(file, words its message must hold) for each kind of bad dataset file."""
    root.mkdir(parents=True, exist_ok=True)
    empty = root / "empty.jsonl"
    empty.write_text("")
    malformed = root / "malformed.jsonl"
    malformed.write_text('{"question": "1+1?", "answer": "#### 2"}\n{"question": "2+2?" "answer": "#### 4"}\n')
    columns = root / "columns.json"
    columns.write_text(json.dumps([{"q": "1+1?", "a": "2"}]))
    parquet = root / "damaged.parquet"
    pd.DataFrame({"question": ["1+1?"], "answer": ["#### 2"]}).to_parquet(parquet)
    parquet.write_bytes(parquet.read_bytes()[:-20])
    return [
        (empty, ["is empty"]),
        (malformed, ["line 2", "not valid JSON"]),
        (columns, ["['question']", "row 0"]),
        (parquet, ["parquet"]),
    ]


MISTAKES = [
    ("empty_file", None, "dataset.path"),
    ("malformed_json", None, "dataset.path"),
    ("wrong_columns", None, "dataset.path"),
    ("damaged_parquet", None, "dataset.path"),
    ("model_option", ["+model.options.stepz=3"], "model.options.stepz"),
    ("dataset_option", ["+dataset.options.digitz=3"], "dataset.options.digitz"),
    ("trainer_typo", ["+trainer.total_step=3"], "trainer.total_step"),
    ("float_steps", ["trainer.total_steps=1e9"], "trainer.total_steps"),
    ("empty_experiment", ["experiment="], "experiment"),
    ("no_cuda", ["backend.device=cuda"], "backend.device"),
    ("prompt_budget", ["rollout.max_prompt_length=2"], "rollout.max_prompt_length"),
    # seeds: [0, 2**32 - 1], the range numpy's np.random.seed takes (torch's and Python's are wider)
    ("seed_2_pow_70", [f"seed={2**70}"], "seed"),
    ("seed_2_pow_32", [f"seed={2**32}"], "seed"),
    ("seed_negative", ["seed=-1"], "seed"),
    ("path_on_embedded_model", ["model.path=/tmp"], "model.path"),
    ("arch_on_embedded_model", ["+model.arch=qwen2"], "model.arch"),
    # experiment names: a slug (they name directories under the trustbench home); {tmp}: the test's directory
    ("experiment_5000_chars", ["experiment=" + "x" * 5000], "experiment"),
    ("experiment_101_chars", ["experiment=" + "x" * 101], "experiment"),
    ("experiment_relative_path", ["experiment=../../escaped"], "experiment"),
    ("experiment_absolute_path", ["experiment={tmp}/escaped"], "experiment"),
    ("experiment_with_slash", ["experiment=a/escaped"], "experiment"),
    ("experiment_hidden", ["experiment=.escaped"], "experiment"),
    # sizes no machine can hold (runners.config.validate.step_memory) and a step count no run reaches
    ("response_length_1e8", ["rollout.max_response_length=100000000"], "rollout.max_response_length"),
    ("prompts_per_step_1e8", ["trainer.prompts_per_step=100000000"], "trainer.prompts_per_step"),
    ("total_steps_1e9", ["trainer.total_steps=1000000000"], "trainer.total_steps"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("case", "overrides", "key"), MISTAKES, ids=[m[0] for m in MISTAKES])
def test_a_user_mistake_is_one_message_exit_2_and_no_failed_run(home, capsys, case, overrides, key):
    """Exit 2, one ``configuration error`` line naming the key (and the file, for dataset files: an
    empty one says it is empty), no traceback, and no FAILED (indeed no) MLflow run."""
    words = []
    if overrides is None:
        index = ["empty_file", "malformed_json", "wrong_columns", "damaged_parquet"].index(case)
        path, words = _dataset_files(home.parent / "data")[index]
        overrides, words = ["dataset=gsm8k", f"dataset.path={path}"], [str(path), *words]
    if case == "no_cuda":
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
    overrides = [o.replace("{tmp}", str(home.parent)) for o in overrides]
    code, _, err = _main(capsys, "run", *FAST, *overrides)  # the case's overrides win over FAST's
    assert code == 2, err
    message = one_message(err, "configuration error", f"config key '{key}'", *words)
    assert message.count("config key") == 1 and len(message) < 600
    assert [r.info.status for r in runs(home)] == []
    assert not list(home.parent.rglob("*escaped*"))  # nothing written outside the home (nor in it)


def test_valid_edges_of_seed_and_experiment_are_accepted():
    """The ends of the ranges above compose and validate: seed 0 and 2**32 - 1, a 100-character name."""
    from runners.config import compose
    from runners.config.validate import check_seed

    for overrides in (["seed=0"], [f"seed={2**32 - 1}"], ["experiment=" + "a" * 100], ["experiment=A1.b_c-d"]):
        cfg, _ = compose(overrides)
        check_seed(cfg)


def _sweep_file(content: bytes):
    name = f"zz_sweep_{uuid.uuid4().hex[:8]}"
    path = SWEEPS_DIR / f"{name}.yaml"
    path.write_bytes(content)
    return name, path


SWEEP_FILES = {
    "random_bytes": (bytes(range(128, 256)) * 20, ["not UTF-8 text", "byte 0x80 at offset 0"]),
    "latin_1": (
        "# @package _global_\nexperiment: café\n".encode("latin-1"),
        ["not UTF-8 text", "byte 0xe9 at offset 35"],
    ),
    "nul_bytes": (b"# @package _global_\nexperiment: demo\x00\n", ["not text", "NUL byte at offset 36"]),
    "relative_experiment": (b"# @package _global_\nexperiment: ../../escaped\n", ["config key 'experiment'"]),
    "absolute_experiment_in_grid": (
        b"# @package _global_\nexperiment: ok\nhydra:\n  sweeper:\n    params:\n      experiment: ok,/tmp/escaped\n",
        ["config key 'experiment'", "/tmp/escaped"],
    ),
    "seed_out_of_range_in_grid": (  # cells differing only in the seed share one validation: each seed checked
        b"# @package _global_\nexperiment: ok\nhydra:\n  sweeper:\n    params:\n      seed: 0,1,4294967296\n",
        ["config key 'seed'", "(in cell: seed=4294967296)"],
    ),
}


@pytest.mark.parametrize("case", list(SWEEP_FILES))
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry_run", "launch"])
def test_a_bad_sweep_file_is_one_message_naming_it(home, capsys, case, dry_run):
    """Random bytes, another encoding, NUL bytes, or an experiment name that is a path, in a sweep
    file: exit 2, one line (the file named for what is not text, the key for the name), no run, no
    store, nothing written outside the home."""
    content, words = SWEEP_FILES[case]
    name, path = _sweep_file(content)
    try:
        code, _, err = _main(capsys, "sweep", name, *(["--dry-run"] if dry_run else []))
    finally:
        path.unlink()
    assert code == 2, err
    one_message(err, "configuration error", *words, *([str(path)] if "text" in words[0] else []))
    assert not home.exists() or not list(home.rglob("*.db"))
    assert not list(home.parent.rglob("*escaped*")) and not Path("/tmp/escaped").exists()


@pytest.mark.slow
def test_a_finished_cell_started_again_says_it_is_finished(home, capsys):
    """The first start trains; the second and third say in one line that the cell is finished
    (its name, key and MLflow run), exit 0, and add no run."""
    code, _, err = _main(capsys, "run", *FAST)
    assert code == 0, err
    (run,) = runs(home)
    for _ in range(2):
        code, out, err = _main(capsys, "run", *FAST)
        assert code == 0 and "Traceback" not in err, err
        lines = [ln for ln in out.splitlines() if "already finished" in ln]
        assert len(lines) == 1, out
        assert run.info.run_id in lines[0] and run.data.tags["trustbench.run_key"] in lines[0]
    assert [r.info.run_id for r in runs(home)] == [run.info.run_id]


@pytest.mark.parametrize("where", ["sweep", "cluster"])
def test_a_yaml_syntax_error_names_the_file_and_line(home, capsys, where):
    """A YAML typo in a sweep file, or in a site's git-ignored conf/launcher/cluster.yaml: exit 2,
    one line with the file, the line and the parser's problem."""
    text = "# @package _global_\nlauncher:\n  name: slurm\n  partition: [gpu\n"
    if where == "sweep":
        name = f"zz_broken_{uuid.uuid4().hex[:8]}"
        path, args = SWEEPS_DIR / f"{name}.yaml", ["sweep", name, "--dry-run"]
    else:
        path, args = CONF_DIR / "launcher" / "cluster.yaml", ["run", "launcher=cluster"]
        if path.exists():
            pytest.skip("a real conf/launcher/cluster.yaml is in place")
    path.write_text(text)
    try:
        code, _, err = _main(capsys, *args)
    finally:
        path.unlink()
    assert code == 2
    one_message(err, "YAML syntax error", str(path), "line 5", "expected ',' or ']'")


def test_sweep_flags_may_follow_overrides_and_errors_name_the_key_once(home, capsys):
    """`sweep demo --dry-run trainer.lr=...`: flags anywhere; a bad value names the key once."""
    code, out, err = _main(
        capsys, "sweep", "demo", "--dry-run", "trainer.lr=3e-4", "+method=choice(grpo,dapo)", "seed=0"
    )
    assert code == 0, err
    assert "2 cells" in out and "2 to run" in out
    code, _, err = _main(capsys, "sweep", "demo", "--dry-run", "trainer.lr=-1")
    assert code == 2
    assert one_message(err, "config key 'trainer.lr'", "must be > 0").count("config key") == 1


@pytest.mark.parametrize("order", ["flags_first", "flags_last"])
def test_hydra_flags_work_in_any_position_and_train_nothing(home, capsys, order):
    """`run --cfg job algorithm=tppo` and `run algorithm=tppo --cfg job` print the composed config
    (README: "print the composed config, train nothing"); nothing is written to the home."""
    args = ["--cfg", "job", "algorithm=tppo"] if order == "flags_first" else ["algorithm=tppo", "--cfg", "job"]
    code, out, err = _main(capsys, "run", *args)
    assert code == 0, err
    assert "name: tppo" in out and "mode: truncated" in out
    assert not (home / "mlflow.db").exists() and not (home / "runs").exists()


def test_report_of_a_missing_store_creates_nothing(home, capsys):
    """`report nosuch` in a directory that tracked nothing: exit 2 naming the store, and no store created."""
    code, _, err = _main(capsys, "report", "nosuch", "--no-pdf", "--no-mlflow")
    assert code == 2
    one_message(err, "no MLflow store at", str(home / "mlflow.db"))  # `trustbench:` as every command says it
    assert not (home / "mlflow.db").exists()


@pytest.mark.parametrize("source", ["--tracking-uri", "environment variable MLFLOW_TRACKING_URI"])
def test_ui_with_an_unreachable_tracking_uri_fails_at_once(home, capsys, monkeypatch, source):
    """`trustbench ui` for an http store where nothing answers: exit 2 and one message naming the
    URI and where it was set (it used to sit in MLflow's minutes of retries); nothing is started."""
    uri = f"http://127.0.0.1:{free_port()}"
    args = ["ui", "--port", str(free_port())]
    if source == "--tracking-uri":
        args += ["--tracking-uri", uri]
    else:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    start = time.monotonic()
    code, _, err = _main(capsys, *args)
    assert code == 2 and time.monotonic() - start < 30
    one_message(err, f"no MLflow server answers at {uri}", source)


@pytest.mark.slow
def test_ui_runs_one_server_process_and_no_job_runner(tmp_path):
    """`trustbench ui` (MLflow UI on loopback): the server answers, and below the command there are
    only `mlflow ui` and its one uvicorn worker (MLflow's job runner and its workers stay off, as
    for tracking=server)."""
    import psutil

    home, port = tmp_path / "home", free_port()
    home.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "runners.cli", "ui", "--port", str(port)],
        cwd=tmp_path,
        env=command_env(home),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        from runners.tracking_server import is_up

        deadline = time.time() + 180
        while time.time() < deadline and not is_up(f"http://127.0.0.1:{port}", timeout_s=1.0):
            assert proc.poll() is None, "trustbench ui exited"
            time.sleep(1.0)
        time.sleep(3.0)  # a job runner starts after the server answers
        below = psutil.Process(proc.pid).children(recursive=True)
        commands = [" ".join(p.cmdline()) for p in below]
        proc.send_signal(signal.SIGTERM)  # to the command alone, as `kill` or a job scheduler does
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        gone, alive = psutil.wait_procs(below, timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert len(below) <= 2, commands
    assert not [c for c in commands if "huey" in c or "job" in c], commands
    assert below and not alive, [" ".join(p.cmdline()) for p in alive]  # the UI server ended with the command


@pytest.mark.parametrize("case", ["random_bytes", "latin_1"])
def test_run_with_a_sweep_file_that_is_not_text_names_the_file(home, capsys, case):
    """``trustbench run +sweeps=<file>`` whose file is random bytes or Latin-1 (Hydra raises a bare
    UnicodeDecodeError): exit 2, one line naming the file, the byte and its offset; nothing created."""
    content, words = SWEEP_FILES[case]
    name, path = _sweep_file(content)
    try:
        code, _, err = _main(capsys, "run", f"+sweeps={name}", *FAST)
    finally:
        path.unlink()
    assert code == 2, err
    one_message(err, "configuration error", "config key 'sweeps'", str(path), *words)
    assert not home.exists() or not list(home.rglob("*.db"))
