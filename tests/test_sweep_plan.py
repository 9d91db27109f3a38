"""Sweep planning without a cluster: fast composition, validation, skips, resources, requeue rules.

References: Hydra's own full composition of each cell (``load_sweep_config``) for the planner's
fast path; MLflow's client for the SQL reader of run statuses; hand-written ``scontrol`` records
for the cluster-limit diagnosis; a mocked ``scontrol`` for the requeue decisions.

Run:  pytest tests/test_sweep_plan.py        (~30 s; the tracking-server test is marked slow)
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from runners import paths, sweep
from runners.cluster import job
from runners.cluster.queue import signal_delay
from runners.cluster.resources import Cluster, Node, Partition, _gpus, _minutes
from runners.config import ConfigError, compose, grid, method_label, run_key, validate
from runners.config.resources import cell_resources
from runners.config.validate import step_memory

# axes of every kind the planner treats differently: group choices, scalar values, a list value,
# an interpolation, and a hydra.* override (Hydra's full composition as the fallback)
EXTRA_AXES = [
    "model=tiny_qwen2,tiny_llama",
    "seed=0,1",
    "trainer.lr=1e-4,3e-4",
]


def _reference(p: sweep.SweepPlan, cell: sweep.Cell):
    hydra, master = p.master
    composer = grid.Composer(hydra, master, p.base_overrides)
    return composer.compose_full(cell.overrides)


def _assert_same(p: sweep.SweepPlan, cells) -> None:
    for cell in cells:
        cfg, choices = _reference(p, cell)
        assert OmegaConf.to_container(cfg, resolve=True) == cell.config, cell.overrides
        assert run_key(cfg) == cell.key, cell.overrides
        assert method_label(cfg, choices) == cell.label, cell.overrides


def test_the_demo_sweep_is_among_the_sweeps():
    assert "demo" in sweep.available_sweeps()


@pytest.mark.parametrize("name", sweep.available_sweeps())
def test_fast_plan_equals_full_composition_on_real_sweeps(name):
    """Every sweep file: its cells are distinct run keys, and for every combination of group choices and
    every seed the planner's config, run key and label are what Hydra's full composition of that cell
    gives. Large grids (the stability maps' 300-500 cells) check every cell of the first seed and the first
    cell of every other seed: seeds are a scalar axis, composed the same way for every combination. Every
    cell's step-memory estimate is under 1 GiB, so it fits any machine that runs the test suite and any
    Slurm node (``launcher.mem_gb`` is at least 8 by default)."""
    p = sweep.plan(name, check_mlflow=False)
    assert p.cells, name
    assert len({c.key for c in p.cells}) == len(p.cells), f"{name}: two cells share a run key"
    worst = max(step_memory(cell.config)[0] for cell in p.cells)
    assert worst < 2**30, (name, worst)
    first_seed = [c for c in p.cells if c.config["seed"] == p.cells[0].config["seed"]]
    cells = p.cells if len(p.cells) <= 60 else first_seed + list({c.config["seed"]: c for c in p.cells}.values())
    _assert_same(p, cells)


def test_fast_plan_equals_full_composition_on_mixed_axes():
    """Group, scalar, list, interpolation and hydra.* axes on top of a sweep (one cell in 16 of 112
    checked against full composition; the hydra.* and list axes take the slow paths)."""
    axes = [*EXTRA_AXES, "trainer.length_buckets=[0,8,16],[0,4,8,16]"]
    p = sweep.plan("demo", axes, check_mlflow=False)
    assert len(p.cells) == 7 * 2 * 2 * 2 * 2
    _assert_same(p, p.cells[::16])
    q = sweep.plan(
        "demo",
        ["+method=choice(dapo)", "seed=0", "label=${algorithm.name}_s${seed},x", "hydra.job.name=a,b"],
        check_mlflow=False,
    )
    assert [c.label for c in q.cells] == ["dapo_s0", "dapo_s0", "x", "x"]
    _assert_same(q, q.cells)


def test_validation_never_reads_seed():
    """The planner validates cells that differ only in VALIDATION_FREE_KEYS once; that is sound only
    while validate() ignores those keys (an absurd seed must pass)."""
    cfg, _ = compose([])
    for key in grid.VALIDATION_FREE_KEYS:
        for value in (-(2**62), 2**62):
            OmegaConf.update(cfg, key, value)
            validate(cfg)


def test_invalid_cell_names_key_and_cell():
    """A bad value in one cell of a seed grid fails planning, naming the key and the cell."""
    with pytest.raises(ConfigError) as err:
        sweep.plan("demo", ["+method=grpo,dapo", "seed=0,1,2", "trainer.lr=1e-4,-1"], check_mlflow=False)
    assert err.value.key == "trainer.lr"
    assert "trainer.lr=-1" in str(err.value)


def test_resources_group_cells_and_estimate_gpu_hours():
    """launcher=slurm: the local backend asks one GPU for models >= 0.1B params, none below; cells
    group by request (one job array each) and the dry run sums GPUs x time limit."""
    p = sweep.plan(
        "demo",
        [
            "+method=grpo,dapo",
            "seed=0",
            "model=tiny_qwen2,qwen2.5_0.5b_instruct",
            "launcher=slurm",
            "launcher.time_min=90",
        ],
        check_mlflow=False,
        check_cluster=False,
    )
    gpus = {c.config["model"]["name"]: c.resources["gpus_per_node"] for c in p.cells}
    assert gpus == {"tiny_qwen2": 0, "qwen2.5_0.5b_instruct": 1}
    assert len(p.groups()) == 2
    text = sweep.format_plan(p)
    assert "2 job array(s)" in text
    assert "estimated <= 3.0 GPU-hours" in text  # 2 cells x 1 GPU x 1.5 h
    assert len([ln for ln in text.splitlines() if "| nodes=" in ln]) == 4


def test_cell_resources_from_plain_dict_and_dictconfig_agree():
    cfg, _ = compose(["launcher=slurm", "model=qwen3_8b", "backend=verl", "launcher.cpus_per_gpu=4"])
    as_dict = OmegaConf.to_container(cfg, resolve=True)
    assert cell_resources(cfg) == cell_resources(as_dict) == {
        "nodes": 1, "gpus_per_node": 8, "cpus_per_task": 32, "mem_gb": 512, "time_min": 240,
    }  # fmt: skip


# -- MLflow: skipping what is done ---------------------------------------------------------------------------
OLD_CODE = {"git_revision": "0123456789ab", "trustbench.version": "0.0.9"}  # a run from other code


@pytest.fixture(scope="module")
def done_store(tmp_path_factory):
    """A sqlite MLflow store with runs of four demo cells: FINISHED (this checkout's code), FAILED,
    KILLED, and FINISHED from other code (an older revision and version)."""
    from mlflow import MlflowClient

    from runners import tracking

    home = tmp_path_factory.mktemp("home")
    os.environ["TRUSTBENCH_HOME"] = str(home)
    try:
        p = sweep.plan("demo", ["+method=grpo,dapo,adapo,gtpo", "seed=0"], check_mlflow=False)
    finally:
        del os.environ["TRUSTBENCH_HOME"]
    uri = f"sqlite:///{home / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("demo")
    current = tracking.code_version_tags()
    for cell, status, code in zip(p.cells, ("FINISHED", "FAILED", "KILLED", "FINISHED"), (current, {}, {}, OLD_CODE)):
        run = client.create_run(exp, tags={"trustbench.run_key": cell.key, **code})
        client.set_terminated(run.info.run_id, status)
    return home, uri, p


DEMO4 = ("demo", ["+method=grpo,dapo,adapo,gtpo", "seed=0"])


def test_plan_skips_finished_and_failed_cells(done_store, monkeypatch):
    """FINISHED cells are skipped, FAILED ones unless --rerun-failed, KILLED and missing ones run;
    --force runs all."""
    home, _, _ = done_store
    monkeypatch.setenv("TRUSTBENCH_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    actions = ["skip-finished", "skip-failed", "run", "skip-finished"]
    assert [c.action for c in sweep.plan(*DEMO4).cells] == actions
    assert [c.action for c in sweep.plan(*DEMO4, rerun_failed=True).cells] == [
        "skip-finished",
        "run",
        "run",
        "skip-finished",
    ]
    assert [c.action for c in sweep.plan(*DEMO4, force=True).cells] == ["run"] * 4
    assert "2 already finished in MLflow (skipped), 1 failed" in sweep.format_plan(sweep.plan(*DEMO4))


def test_plan_names_cells_finished_with_other_code_and_reruns_them_on_request(done_store, monkeypatch):
    """A FINISHED cell whose run recorded another git revision is named with that code, still skipped,
    and with rerun_stale run from scratch; the one from this checkout's code is neither."""
    home, _, _ = done_store
    monkeypatch.setenv("TRUSTBENCH_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    p = sweep.plan(*DEMO4)
    assert [c.stale_code for c in p.cells] == [None, None, None, "0.0.9 @ 0123456789ab"]
    lines = sweep.format_plan(p).splitlines()
    assert "skip-finished" in lines[4] and lines[4].endswith("| finished with other code: 0.0.9 @ 0123456789ab")
    assert "other code" not in lines[1]
    assert any(
        f"1 finished cell(s) ran other code than this checkout ({p.code}): kept; --rerun-stale" in ln for ln in lines
    )
    p = sweep.plan(*DEMO4, rerun_stale=True)
    assert [c.action for c in p.cells] == ["skip-finished", "skip-failed", "run", "run"]
    assert [c.fresh for c in p.cells] == [False, False, False, True]
    assert "1 rerun from scratch" in sweep.format_plan(p)
    from runners.sweep.launching import _job_overrides

    assert _job_overrides(p, p.cells[3], [])[-1] == "force=true"  # a new MLflow run, checkpoints removed
    assert "force=true" not in _job_overrides(p, p.cells[2], [])  # a KILLED cell resumes


@pytest.mark.parametrize(
    "run, current, same",
    [
        (("0.1.0", "aaaaaaaaaaaa"), ("0.1.0", "aaaaaaaaaaaa"), True),
        (("0.1.0", "aaaaaaaaaaaa"), ("0.1.0", "bbbbbbbbbbbb"), False),  # a new commit, same version
        (("0.1.0", "aaaaaaaaaaaa-dirty.1234abcd"), ("0.1.0", "aaaaaaaaaaaa-dirty.5678ef90"), False),  # other edits
        (("0.1.0", "aaaaaaaaaaaa"), ("0.1.0", "aaaaaaaaaaaa-dirty.5678ef90"), False),
        ((None, "aaaaaaaaaaaa"), ("0.1.0", "aaaaaaaaaaaa"), True),  # a run from before the version tag
        (("0.1.0", "unknown"), ("0.1.0", "aaaaaaaaaaaa"), True),  # no git where it ran: the version decides
        (("0.0.9", "unknown"), ("0.1.0", "unknown"), False),
        ((None, None), ("0.1.0", "aaaaaaaaaaaa"), False),  # recorded nothing: other code
    ],
)
def test_same_code(run, current, same):
    assert sweep.same_code(sweep.RunRecord("FINISHED", *run), sweep.RunRecord("", *current)) is same


def test_git_revision_names_the_commit_and_hashes_edits(tmp_path):
    """The dirty flag carries a hash of the diff: two different edits of one commit are two versions."""
    import subprocess

    from runners.tracking import git_revision

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=tmp_path, capture_output=True, text=True)
    clean = git_revision(tmp_path)
    assert clean == head.stdout.strip()
    (tmp_path / "a.py").write_text("x = 2\n")
    first = git_revision(tmp_path)
    (tmp_path / "a.py").write_text("x = 3\n")
    second = git_revision(tmp_path)
    assert first.startswith(clean + "-dirty.") and second.startswith(clean + "-dirty.") and first != second
    assert git_revision(tmp_path / "..") in ("unknown", git_revision(tmp_path / ".."))  # outside a repo: no error


def test_sweep_command_rerun_stale_flag(done_store, monkeypatch, capsys):
    """`trustbench sweep ... --dry-run` names the stale cell; with --rerun-stale it is to run."""
    from runners import cli

    home, _, _ = done_store
    monkeypatch.setenv("TRUSTBENCH_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for flags, action, summary in (
        ([], "skip-finished", "--rerun-stale to rerun them"),
        (["--rerun-stale"], "run", "1 rerun"),
    ):
        assert cli.main(["sweep", *DEMO4[0:1], "--dry-run", *DEMO4[1], *flags]) == 0
        out = capsys.readouterr().out.splitlines()
        stale = [ln for ln in out if "finished with other code: 0.0.9 @ 0123456789ab" in ln]
        assert len(stale) == 1 and stale[0].split("]")[1].split()[0] == action, out
        assert any(summary in ln for ln in out), out


def test_sql_reader_matches_mlflow_client(done_store, monkeypatch):
    """The dry run's one-query sqlite reader gives what MLflow's client gives (status and code version)."""
    from runners.sweep import planning

    home, uri, p = done_store
    by_sql = sweep._existing_runs_sql(home / "mlflow.db", "demo")
    monkeypatch.setattr(planning, "_sqlite_file", lambda uri: None)  # the path a tracking server takes
    by_client = sweep._existing_runs(uri, "demo")
    assert by_sql == by_client and len(by_sql) == 4
    assert by_sql[p.cells[3].key] == sweep.RunRecord("FINISHED", "0.0.9", "0123456789ab")
    assert by_sql[p.cells[1].key] == sweep.RunRecord("FAILED", None, None)


# -- cluster limits ------------------------------------------------------------------------------------------
SCONTROL_PARTITIONS = [
    "PartitionName=gpu Default=YES MaxTime=1-00:00:00 Nodes=g[1-2]",
    "PartitionName=short Default=NO MaxTime=00:30:00 Nodes=g1",
]
SCONTROL_NODES = [
    "NodeName=g1 CPUTot=64 RealMemory=515000 Gres=gpu:h100:8 Partitions=gpu,short",
    "NodeName=g2 CPUTot=32 RealMemory=257000 Gres=gpu:a100:4(S:0-1),gpu:l4:2 Partitions=gpu",
]


def _cluster() -> Cluster:
    parts = {}
    for line in SCONTROL_PARTITIONS:
        rec = dict(kv.split("=", 1) for kv in line.split())
        nodes = ["g1", "g2"] if rec["Nodes"] == "g[1-2]" else [rec["Nodes"]]
        parts[rec["PartitionName"]] = Partition(
            rec["PartitionName"], rec["Default"] == "YES", _minutes(rec["MaxTime"]), nodes
        )
    nodes = {}
    for line in SCONTROL_NODES:
        rec = dict(kv.split("=", 1) for kv in line.split())
        nodes[rec["NodeName"]] = Node(
            rec["NodeName"],
            int(rec["CPUTot"]),
            int(rec["RealMemory"]),
            _gpus(rec["Gres"]),
            rec["Partitions"].split(","),
        )
    return Cluster(parts, nodes)


# how early slurmctld sent a --signal warning on the test cluster (6 jobs due at 75 s: 49-74 s, the
# first 30 s check within 30 s of the due time), and how long a job may take to install its handlers
MEASURED_EARLY_S = 30
STARTUP_S = 10


@pytest.mark.parametrize("time_min", [1, 2, 3, 5, 10, 240])
@pytest.mark.parametrize("requested", [0, 20, 60, 110, 300])
def test_signal_delay_never_lets_the_signal_come_during_startup(time_min, requested):
    """The earliest arrival of the warning, time limit - delay - 30 s, leaves a job 10 s to start;
    otherwise the requested delay is kept, and it is shortened no more than needed."""
    delay = signal_delay(requested, time_min)
    earliest = time_min * 60 - delay - MEASURED_EARLY_S
    assert 0 <= delay <= requested
    assert earliest >= STARTUP_S or delay == 0
    if time_min * 60 - requested - MEASURED_EARLY_S >= STARTUP_S:
        assert delay == requested
    else:
        assert earliest == STARTUP_S


def test_slurm_time_and_gres_parsing():
    assert _minutes("1-00:00:00") == 1440 and _minutes("00:30:00") == 30 and _minutes("UNLIMITED") == float("inf")
    assert _gpus("gpu:h100:8") == 8 and _gpus("gpu:a100:4(S:0-1),gpu:l4:2") == 6 and _gpus("(null)") == 0


@pytest.mark.parametrize(
    ("change", "partition", "key", "words"),
    [
        ({}, None, None, None),
        ({"gpus_per_node": 9}, None, "launcher.gpus_per_node", "at most 8"),
        ({"time_min": 31}, "short", "launcher.time_min", "MaxTime of 30"),
        ({"nodes": 3}, None, "launcher.nodes", "has 2"),
        ({"nodes": 2, "gpus_per_node": 8}, None, "launcher.nodes", "fewer than 2 nodes"),
        ({"cpus_per_task": 65}, None, "launcher.cpus_per_task", "at most 64"),
        ({"mem_gb": 600}, None, "launcher.mem_gb", "at most 502 GB"),
        ({}, "nope", "launcher.partition", "partitions: gpu (default), short"),
    ],
)
def test_cluster_limits_name_the_launcher_key(change, partition, key, words):
    """Requests checked against hand-written scontrol records: the reason names the key to change."""
    res = {"nodes": 1, "gpus_per_node": 8, "cpus_per_task": 32, "mem_gb": 256, "time_min": 60, **change}
    problem = _cluster().why_not(res, partition)
    if key is None:
        assert problem is None
    else:
        assert problem[0] == key and words in problem[1], problem


# -- in the job: requeue decisions ------------------------------------------------------------------------------
@pytest.fixture
def cell_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRUSTBENCH_HOME", str(tmp_path))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    for var in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_RESTART_COUNT"):
        monkeypatch.delenv(var, raising=False)
    calls = []

    def fake_run(cmd, **_kw):
        calls.append(cmd)
        return type("P", (), {"returncode": 0, "stderr": "", "stdout": ""})()

    monkeypatch.setattr(job.subprocess, "run", fake_run)
    monkeypatch.setattr("runners.tracking.find_run", lambda *_a: None)  # no MLflow run to mark
    cfg, _ = compose(["launcher=slurm", "launcher.max_requeues=2"])
    return cfg, paths.run_dir(run_key(cfg)), calls


def test_requeue_only_after_usr_signals_and_within_the_bound(cell_home, monkeypatch):
    """USR1/USR2 requeue this job (scontrol requeue <array job>_<task>) until launcher.max_requeues
    restarts happened, then FAILED; SIGTERM never requeues (Slurm decides); outside Slurm: PREEMPTED."""
    cfg, run_dir, calls = cell_home
    assert job.requeue_or_fail(cfg, "SIGUSR2")["status"] == "PREEMPTED" and calls == []
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "41")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    monkeypatch.setenv("SLURM_JOB_ID", "44")
    assert job.requeue_or_fail(cfg, "SIGTERM")["status"] == "PREEMPTED" and calls == []
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert job.requeue_or_fail(cfg, "SIGUSR2") == {"status": "REQUEUED", "job_id": "41_3"}
    assert calls == [["scontrol", "requeue", "41_3"]]
    assert json.loads((run_dir / "status.json").read_text())["restarts"] == 2
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    out = job.requeue_or_fail(cfg, "SIGUSR1")
    assert out["status"] == "FAILED" and "max_requeues=2" in out["error"] and len(calls) == 1
    assert json.loads((run_dir / "status.json").read_text())["status"] == "FAILED"


def test_start_attempt_records_the_job_and_bounds_slurm_requeues(cell_home, monkeypatch):
    """Each attempt appends its job id, restart count and visible GPUs; an attempt past
    launcher.max_requeues restarts (e.g. Slurm preempting it again and again) fails at once."""
    cfg, run_dir, _ = cell_home
    assert job.start_attempt(cfg) is None and not (run_dir / job.JOBS_FILE).exists()
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    for restart in (0, 2):
        monkeypatch.setenv("SLURM_RESTART_COUNT", str(restart))
        assert job.start_attempt(cfg) is None
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")
    assert job.start_attempt(cfg)["status"] == "FAILED"
    records = [json.loads(line) for line in (run_dir / job.JOBS_FILE).read_text().splitlines()]
    assert [(r["job_id"], r["restart"], r["cuda_visible_devices"]) for r in records] == [
        ("7", 0, "2"),
        ("7", 2, "2"),
        ("7", 3, "2"),
    ]


def test_signal_before_the_trainer_exists_still_stops_it():
    """A job owns the stop signals from its start: USR2 caught before run() builds the trainer
    makes the trainer stop (after one step), and the signal's name is kept for the requeue rule."""
    from runners.run import _StopFlag, catch_stop_signals

    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)}
    try:
        catch_stop_signals()
        os.kill(os.getpid(), signal.SIGUSR2)
        trainer = type("T", (), {"stop_requested": False})()
        with _StopFlag(trainer):
            assert trainer.stop_requested and _StopFlag.received == "SIGUSR2"
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        _StopFlag.received = None


REPO_ROOT = Path(__file__).resolve().parents[1]
STOP_SIGNAL_AT_EXIT = """
from runners.run import catch_stop_signals
catch_stop_signals()
print("ready", flush=True)
import time
time.sleep(0.3)
"""


@pytest.mark.parametrize("name", ["SIGUSR1", "SIGUSR2"])
def test_a_requeue_signal_while_a_finished_job_exits_does_not_kill_it(name):
    """Slurm's ``--signal=B:USR1@N`` may reach a job whose run has finished while its interpreter shuts
    down, where CPython has put the default action back (end the process): the job counted as FAILED.
    Here another process sends the signal every 0.2 ms until the job is gone; it must exit 0 (before the
    fix: killed by the signal, 5 times out of 5)."""
    sig = getattr(signal, name)
    child = subprocess.Popen(
        [sys.executable, "-c", STOP_SIGNAL_AT_EXIT],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout.readline().strip() == "ready"
    sent = 0
    while child.poll() is None:
        try:
            os.kill(child.pid, sig)
        except ProcessLookupError:
            break
        sent += 1
        time.sleep(0.0002)
    stderr = child.stderr.read()
    assert child.wait() == 0 and sent > 10, (child.returncode, sent, stderr[-2000:])
    assert f"received {name}" in stderr  # while the process ran, its handler saw the signals


# -- end to end without a cluster -------------------------------------------------------------------------------
@pytest.mark.slow
def test_local_sweep_reports_the_failed_cell(tmp_path, monkeypatch):
    """launcher=local runs cells in this process; a cell that raises (debug.fail_at_step) does not
    stop the others and is reported as failed, by name and reason."""
    from tests.backends._tiny import TINY

    monkeypatch.setenv("TRUSTBENCH_HOME", str(tmp_path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tiny = [o for o in TINY if not o.startswith("trainer.total_steps")]
    # the 1-step cell ends before step 2, the 3-step cell raises there
    p = sweep.plan(
        "demo",
        [
            *tiny,
            "+method=choice(grpo)",
            "seed=0",
            "trainer.total_steps=3,1",
            "debug.fail_at_step=2",
            "experiment=local",
            "launcher.parallel=1",  # in this process: the test's reward is registered here only
        ],
    )
    sweep.launch(p)
    out = io.StringIO()
    assert sweep.report_outcomes(p, out) == 1
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("!! FAILED") and "trainer.total_steps=3" in lines[0]
    assert "debug.fail_at_step=2 reached" in lines[0]
    assert lines[1].startswith("ok FINISHED") and "trainer.total_steps=1" in lines[1]


@pytest.mark.slow
def test_tracking_server_start_reuse_stop_and_offline_reads(tmp_path, monkeypatch):
    """tracking=server: a server is started on 127.0.0.1 with the home's sqlite store (schema made
    first), a second call reuses it, runs logged through it are read back by the planner both
    through the server and, once it is stopped, from its sqlite file."""
    from mlflow import MlflowClient

    from runners import tracking_server

    monkeypatch.setenv("TRUSTBENCH_HOME", str(tmp_path))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = tracking_server.ensure_server("127.0.0.1", port)
    try:
        assert server.started and server.url == f"http://127.0.0.1:{port}"
        assert not tracking_server.ensure_server("127.0.0.1", port).started
        client = MlflowClient(server.url)
        exp = client.create_experiment("srv")
        run = client.create_run(exp, tags={"trustbench.run_key": "k1"})
        client.set_terminated(run.info.run_id, "FINISHED")
        assert sweep._existing_runs(server.url, "srv") == {"k1": sweep.RunRecord("FINISHED")}
    finally:
        server.stop()
    assert not tracking_server.is_up(server.url)
    assert sweep._existing_runs(server.url, "srv") == {"k1": sweep.RunRecord("FINISHED")}


def test_dry_run_estimates_the_cpu_time_of_embedded_cells():
    """The stability map's dry run prints its CPU time: start-up, each step's sampling, old-log-prob pass and
    update (once per epoch), and every evaluation (step 0 included), from the measured per-part costs."""
    from runners.perf.cpu_cost import EMBEDDED_CPU_COST as c
    from runners.perf.cpu_cost import cpu_seconds

    p = sweep.plan("stability_map_cpu", ["seed=0"], check_mlflow=False, check_cluster=False)
    p.cells = [c_ for c_ in p.cells if "+method=grpo" in c_.overrides]
    by_regime = {c_.overrides[1]: cpu_seconds(c_.config) for c_ in p.cells}
    responses, steps, evals, samples = 16 * 8, 40, 5, 128 * 4  # the sweep file's sizes, by hand
    on_policy = c["startup"] + steps * (c["step"] + responses * (c["sample"] + c["old_pass_on_policy"] + c["update"]))
    multi = c["startup"] + steps * (c["step"] + responses * (c["sample"] + c["old_pass"] + 4 * c["update"]))
    stale = c["startup"] + steps * (c["step"] + responses * (c["sample"] + c["old_pass"] + c["update"]))
    eval_s = evals * samples * c["eval"]
    assert by_regime["+regime=on_policy"] == pytest.approx(on_policy + eval_s)
    assert by_regime["+regime=multi_epoch"] == pytest.approx(multi + eval_s)
    assert by_regime["+regime=stale2"] == pytest.approx(stale + eval_s)
    total = sum(by_regime.values())
    text = sweep.format_plan(p)
    assert f"estimated CPU time of the 5 cell(s) to run: {total / 60:.0f} min of CPU" in text
    assert f"about {total / 2 / 60:.0f} min at 2 cell(s) at a time" in text
    # the GPU map on verl has no measured CPU cost: no estimate rather than a wrong one
    gpu = sweep.plan("stability_map", ["seed=0"], check_mlflow=False, check_cluster=False)
    assert "estimated CPU time" not in sweep.format_plan(gpu)


def test_a_stop_signal_arriving_while_stderr_is_being_written_is_reported_without_raising(monkeypatch):
    """The handler's line goes out in one ``os.write``: a signal that lands while the run is writing to
    stderr runs the handler inside that buffered write, where a ``print`` to the same stream raised
    ``RuntimeError: reentrant call`` out of the handler (seen in CI under repeated USR1). Here the stream's
    raw write raises the signal itself."""
    from runners.run import _StopFlag

    read_end, write_end = os.pipe()

    class SignalOnWrite(io.RawIOBase):
        def writable(self):
            return True

        def fileno(self):
            return write_end

        def write(self, data):
            signal.raise_signal(signal.SIGUSR1)  # arrives in the middle of the buffered write
            return os.write(write_end, bytes(data))

    stream = io.TextIOWrapper(io.BufferedWriter(SignalOnWrite()), line_buffering=True)
    monkeypatch.setattr(sys, "stderr", stream)
    received = _StopFlag.received
    flag = _StopFlag()
    with flag:
        print("a line of the run's own output", file=stream)
    os.close(write_end)
    out = os.read(read_end, 1 << 16).decode()
    os.close(read_end)
    _StopFlag.received = received
    assert "a line of the run's own output" in out
    assert "[trustbench] received SIGUSR1: checkpointing after this step" in out
