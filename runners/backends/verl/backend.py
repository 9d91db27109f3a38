"""``VerlBackend``: train one trustbench cell with verl 0.9.1 in a child process, into trustbench's MLflow run.

Design: ``run(cfg)`` opens the MLflow run and constructs ``VerlBackend(cfg, tracker, run_dir, label)``
as it does the built-in trainer; ``train()`` then

1. writes the cell's datasets as verl parquet files (``data.py``), reused by a requeued attempt;
2. reads verl's checkpoint tracker (``verl/checkpoints/latest_checkpointed_iteration.txt``) and
   refuses to launch into zero training steps: a checkpoint at ``trainer.total_steps`` means the
   cell is done (verl would only re-validate), one beyond it is an error naming the key;
3. translates the config (``translate.build_overrides``) for the GPUs actually allocated and runs
   ``python -m verl.trainer.main_ppo <overrides>`` -- under Slurm through
   ``slurm/ray_on_slurm.sh`` (a Ray cluster over the allocation's nodes), elsewhere directly (verl
   starts a local Ray) -- in its own process group, with ``VERL_USE_EXTERNAL_MODULES`` (the
   ``trustbench_*`` plugins), ``MLFLOW_TRACKING_URI``/``MLFLOW_RUN_ID`` (the tracker's run) and
   ``VERL_FILE_LOGGER_PATH`` in its environment;
4. streams verl's output to this process and ``verl/verl.<attempt>.log``, follows verl's metrics
   file, renames the metrics to the schema (``metrics.py``) and logs them through the run tracker
   (steps logged by an earlier attempt are skipped);
5. on ``stop_requested`` (Slurm's pre-timeout or preemption signal, set by ``run``) writes the stop
   file named by ``TRUSTBENCH_VERL_STOP_FILE``: the trustbench trainer calls ``check_stop_request``
   after each step, which saves a checkpoint and ends verl's loop. The backend waits up to
   ``backend.options.stop_timeout_s`` for verl to exit (or, with a trainer that does not honour the
   file, for verl's next periodic checkpoint), terminates it otherwise, and raises ``StopRequested``
   so ``run`` marks the cell PREEMPTED; the next attempt resumes from verl's checkpoint
   (``trainer.resume_mode=auto``, ``default_local_dir`` under the run directory) into the same run.

No signal is sent to verl itself: ``main_ppo`` has no handler and would die without a checkpoint.

Metrics reach MLflow through the tracker (``backend.options.metrics_via: tracker``, default): one
writer per run (a sqlite store on a shared filesystem tolerates no second writer on another node),
no step logged twice after a requeue, names mapped. ``metrics_via: mlflow`` instead lets verl's own
MLflow logger write into the same run (it honours ``MLFLOW_RUN_ID``), but it also logs verl's whole
config as parameters -- a resumed attempt with any changed value makes MLflow refuse them, after
which verl silently continues without MLflow -- and logs recomputed steps a second time.

Command line (compose a cell as ``trustbench run`` does, then):

    python -m runners.backends.verl.backend overrides backend=verl model=qwen3_8b algorithm=gspo
    python -m runners.backends.verl.backend sbatch backend=verl model=qwen3_8b algorithm=gspo > cell.sbatch
    python -m runners.backends.verl.backend run-cell backend=verl model=qwen3_8b algorithm=gspo
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from runners import paths as tb_paths
from runners.backends.verl.batch_dump import DUMP_ENV
from runners.backends.verl.cpu_mode import CPUPlacement, exported_tokenizer_path, launch_env_updates, runs_on_cpu
from runners.backends.verl.metrics import MetricsFile, map_metrics
from runners.backends.verl.translate import ENTRYPOINT, PLUGIN_MODULE, VerlPaths, backend_options, build_overrides
from runners.config.validate import ConfigError

STOP_FILE_ENV = "TRUSTBENCH_VERL_STOP_FILE"
STOPPED_SUFFIX = ".done"
RAY_BOOTSTRAP = tb_paths.repo_root() / "slurm" / "ray_on_slurm.sh"
CHECKPOINT_TRACKER = "latest_checkpointed_iteration.txt"
POLL_S = 1.0


# -- layout and state ------------------------------------------------------------------------------
@dataclass(frozen=True)
class VerlLayout:
    """Files of the verl backend under a run directory (``<run_dir>/verl``)."""

    root: Path

    @classmethod
    def of(cls, run_dir: str | Path) -> VerlLayout:
        return cls(Path(run_dir) / "verl")

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def stop_file(self) -> Path:
        return self.root / "STOP"

    def attempt(self) -> int:
        """The number of the attempt about to start (1 + the attempts that wrote a log)."""
        return 1 + len(list(self.root.glob("verl.*.log")))

    def log_file(self, attempt: int) -> Path:
        return self.root / f"verl.{attempt}.log"

    def paths(self, attempt: int) -> VerlPaths:
        return VerlPaths.under(self.root, attempt)


def latest_checkpoint_step(checkpoint_dir: str | Path) -> int | None:
    """The step of verl's newest complete checkpoint (its tracker file), or None."""
    tracker = Path(checkpoint_dir) / CHECKPOINT_TRACKER
    try:
        step = int(tracker.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return step if (Path(checkpoint_dir) / f"global_step_{step}").is_dir() else None


def check_resume(layout: VerlLayout, total_steps: int) -> int | None:
    """The checkpoint step to resume from, after guarding against a resume into zero steps.

    Returns None without a checkpoint. Raises ``ConfigError('trainer.total_steps')`` when the
    checkpoint lies beyond ``total_steps`` (the total changed between attempts). A checkpoint AT
    ``total_steps`` is returned as is: the caller finishes without launching verl.
    """
    step = latest_checkpoint_step(layout.checkpoints)
    if step is not None and step > total_steps:
        raise ConfigError(
            "trainer.total_steps",
            f"verl's checkpoint in {layout.checkpoints} is at step {step}, beyond total_steps={total_steps}; "
            "a changed total needs a new run (force=true) or the old value",
        )
    return step


# -- the verl-side stop hook --------------------------------------------------------------------------
def check_stop_request(trainer: Any) -> bool:
    """Called by the trustbench verl trainer at the end of each step (``on_step_end``).

    If the file named by ``TRUSTBENCH_VERL_STOP_FILE`` exists: save a checkpoint of this step
    unless verl just saved one, write ``<stop file>.done`` with the step, and make this the last
    step (verl's loop logs the step's metrics, then ends normally). Returns True when stopping.
    """
    stop_file = os.environ.get(STOP_FILE_ENV)
    if not stop_file or not os.path.exists(stop_file) or getattr(trainer, "_trustbench_stopping", False):
        return False
    step = int(trainer.global_steps)
    save_freq = int(trainer.config.trainer.save_freq)
    if not (save_freq > 0 and step % save_freq == 0):
        trainer._save_checkpoint()
    trainer._trustbench_stopping = True
    trainer.total_training_steps = step  # the loop condition ends training after this step
    Path(stop_file + STOPPED_SUFFIX).write_text(str(step))
    return True


# -- launching ---------------------------------------------------------------------------------------
def slurm_allocation(env: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """(nodes, GPUs per node) of the Slurm allocation this process runs in, or None outside one."""
    env = os.environ if env is None else env
    if not env.get("SLURM_JOB_ID") or not env.get("SLURM_JOB_NODELIST"):
        return None
    nodes = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1)
    gpus = env.get("SLURM_GPUS_ON_NODE", "")
    if not gpus.isdigit():
        visible = env.get("CUDA_VISIBLE_DEVICES", "")
        gpus = str(len([d for d in visible.split(",") if d])) if visible and visible != "NoDevFiles" else "0"
    return nodes, int(gpus)


def model_path(cfg: DictConfig) -> str:
    """A directory or hub id verl can load: ``model.path``, the converted SmolLM2 checkpoint, or the
    project's own model written as a Hugging Face directory (``model_export``)."""
    from runners.backends.verl.model_export import export_model, exportable

    if cfg.model.kind == "smollm2":
        from runners.models.gguf import convert_smollm2

        return str(convert_smollm2())
    if exportable(cfg.model.kind):
        return str(export_model(cfg.model))
    return str(cfg.model.path or "")


def cpu_placement(cfg: DictConfig, model_dir: str) -> CPUPlacement | None:
    """How the cell runs in verl's CPU mode (``cpu_mode``), or None when it runs on GPUs."""
    from runners.backends.verl.model_export import prompt_template

    if not runs_on_cpu(cfg):
        return None
    return CPUPlacement(
        ray_address=os.environ.get("RAY_ADDRESS") or None,
        tokenizer_path=exported_tokenizer_path(model_dir),
        chat_template=prompt_template(cfg, model_dir) if os.path.isdir(model_dir) else None,
    )


def entry_command(cfg: DictConfig, python: str = sys.executable) -> list[str]:
    """``[python, -m, verl.trainer.main_ppo]`` (``backend.options.entrypoint``; a ``.py`` file runs as a script)."""
    entry = str(backend_options(cfg).get("entrypoint") or ENTRYPOINT)
    return [python, entry] if entry.endswith(".py") else [python, "-m", entry]


def launch_argv(
    cfg: DictConfig, overrides: Sequence[str], *, in_slurm: bool, python: str = sys.executable
) -> list[str]:
    """The command that runs verl: through the Ray-on-Slurm bootstrap inside an allocation."""
    command = [*entry_command(cfg, python), *overrides]
    return ["bash", str(RAY_BOOTSTRAP), *command] if in_slurm else command


def launch_env(cfg: DictConfig, *, tracking_uri: str, run_id: str, metrics_file: str, stop_file: str) -> dict[str, str]:
    """Environment of the verl process (and, through it, of the Ray cluster it starts)."""
    from runners.backends.verl import EXTERNAL_MODULES_ENV, PLUGIN_MODULE

    bin_dir = Path(sys.executable).parent
    env = dict(os.environ)
    env.update(
        {
            EXTERNAL_MODULES_ENV: PLUGIN_MODULE,
            "VERL_FILE_LOGGER_PATH": metrics_file,
            STOP_FILE_ENV: stop_file,
            "MLFLOW_TRACKING_URI": tracking_uri,
            "MLFLOW_RUN_ID": run_id,
            "PYTHONUNBUFFERED": "1",
            "HYDRA_FULL_ERROR": "1",
            "TB_RAY_PYTHON": sys.executable,
        }
    )
    if (bin_dir / "ray").exists():
        env.setdefault("TB_RAY_BIN", str(bin_dir / "ray"))
    # Ray >= 2.5x turns token authentication on for a cluster it starts when RAY_AUTH_MODE is unset
    # and a token file exists, but a client that connects to it (ray.init(address=...)) only sends the
    # token when the mode says so: decide once, for the cluster and every client alike
    env.setdefault("RAY_AUTH_MODE", "token" if _ray_token_exists(env) else "disabled")
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    for key, value in (backend_options(cfg).get("ray_env") or {}).items():
        env[str(key)] = str(value)
    return env


def _ray_token_exists(env: Mapping[str, str]) -> bool:
    if env.get("RAY_AUTH_TOKEN"):
        return True
    path = env.get("RAY_AUTH_TOKEN_PATH") or str(Path(env.get("HOME", str(Path.home()))) / ".ray" / "auth_token")
    return Path(path).is_file()


def worker_env(env: Mapping[str, str], metrics_via: str = "tracker") -> dict[str, str]:
    """The variables every Ray worker needs even when Ray was started elsewhere.

    With ``metrics_via: mlflow`` the per-attempt metrics file is left out: verl logs its config as
    MLflow parameters, and a value that changes between attempts makes MLflow refuse them all.
    """
    keys = (STOP_FILE_ENV, "MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", DUMP_ENV)
    keys += ("VERL_FILE_LOGGER_PATH",) if metrics_via == "tracker" else ()
    return {k: env[k] for k in keys if k in env}


def _terminate(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """TERM the process group of ``proc`` (its leader and whatever the leader left running); KILL
    the group if the leader is still alive after ``grace_s``."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _stream(proc: subprocess.Popen, log_path: Path, echo: bool) -> threading.Thread:
    def copy() -> None:
        with open(log_path, "ab") as log:
            for line in iter(proc.stdout.readline, b""):
                log.write(line)
                log.flush()
                if echo:
                    sys.stdout.buffer.write(line)
                    sys.stdout.flush()

    thread = threading.Thread(target=copy, name="verl-log", daemon=True)
    thread.start()
    return thread


# -- the backend -------------------------------------------------------------------------------------
class VerlBackend:
    """One cell trained by verl (module docstring); ``run()`` calls ``train()``."""

    def __init__(self, cfg: DictConfig, tracker: Any, run_dir: str | Path, label: str) -> None:
        self.cfg, self.tracker, self.label = cfg, tracker, label
        self.layout = VerlLayout.of(run_dir)
        self.options = backend_options(cfg)
        self.stop_requested = False
        self.echo = True
        self.last_metrics: dict[str, float] = {}

    # -- helpers -----------------------------------------------------------------------------
    def _responses_per_step(self) -> int:
        return int(self.cfg.trainer.prompts_per_step) * int(self.cfg.trainer.n)

    def _resources(self) -> tuple[int | None, int | None, bool]:
        """(nodes, GPUs per node, inside Slurm): the allocation's, else this machine's visible GPUs."""
        allocation = slurm_allocation()
        if allocation is not None:
            if allocation[1] < 1:
                raise RuntimeError(
                    f"the Slurm allocation {os.environ.get('SLURM_JOB_ID')} has no GPUs; verl needs them"
                )
            return allocation[0], allocation[1], True
        return None, _visible_gpus() or None, False

    def _log_metrics(self, source: MetricsFile) -> int | None:
        last = None
        for step, data in source.read_new():
            mapped = map_metrics(data, responses_per_step=self._responses_per_step())
            self.tracker.log_metrics(mapped, step=step)
            self.last_metrics.update(mapped)
            last = step
        return last

    def _final_metrics(self) -> dict[str, float]:
        if self.last_metrics:
            return dict(self.last_metrics)
        from mlflow import MlflowClient

        return dict(MlflowClient(tracking_uri=self.tracker.uri).get_run(self.tracker.run_id).data.metrics)

    # -- train ----------------------------------------------------------------------------------
    def train(self) -> dict[str, float]:
        """Run verl to ``trainer.total_steps`` (or until stopped); returns the last metrics."""
        from runners.backends.verl.data import prepare_datasets

        cfg, layout = self.cfg, self.layout
        total = int(cfg.trainer.total_steps)
        if not self.tracker.resumed and layout.checkpoints.exists():  # a new MLflow run: stale state
            import shutil

            shutil.rmtree(layout.checkpoints)
        layout.root.mkdir(parents=True, exist_ok=True)
        layout.stop_file.unlink(missing_ok=True)
        resume_step = check_resume(layout, total)
        if resume_step == total:
            print(f"[trustbench] verl checkpoint at step {total} = total_steps: nothing to train", file=sys.stderr)
            return self._final_metrics()
        prepare_datasets(cfg, layout.data)
        path = model_path(cfg)
        cpu = cpu_placement(cfg, path)
        nnodes, gpus_per_node, in_slurm = self._resources() if cpu is None else (1, 1, False)
        attempt = layout.attempt()
        vpaths = layout.paths(attempt)
        via = self.options.get("metrics_via", "tracker")
        env = launch_env(
            cfg,
            tracking_uri=self.tracker.uri,
            run_id=self.tracker.run_id,
            metrics_file=vpaths.metrics_file,
            stop_file=str(layout.stop_file),
        )
        if cpu is not None:
            env.update(launch_env_updates(PLUGIN_MODULE, force_cpu=str(cfg.backend.device) == "cpu"))
        overrides = build_overrides(
            cfg,
            vpaths,
            model_path=path,
            nnodes=nnodes,
            gpus_per_node=gpus_per_node,
            resuming=resume_step is not None,
            worker_env=worker_env(env, via),
            cpu=cpu,
        )
        argv = launch_argv(cfg, overrides, in_slurm=in_slurm)
        (layout.root / f"command.{attempt}.txt").write_text(shlex.join(argv) + "\n")
        self.tracker.flush(wait=True)
        if self.stop_requested:  # the signal came while the data was prepared: nothing to checkpoint
            from runners.backends.base import StopRequested

            raise StopRequested(f"stopped on request before verl started; resumes from checkpoint {resume_step}")
        rc, stopped_at = self._run(
            argv, env, layout.log_file(attempt), MetricsFile(vpaths.metrics_file) if via == "tracker" else None
        )
        self.tracker.flush(wait=True)
        step = latest_checkpoint_step(layout.checkpoints)
        if self.stop_requested:
            from runners.backends.base import StopRequested

            raise StopRequested(
                f"stopped on request (verl exit {rc}, stopped after step {stopped_at}); "
                f"resumes from verl checkpoint {step} in {layout.checkpoints}"
            )
        if rc != 0:
            raise RuntimeError(f"verl exited with status {rc}; see {layout.log_file(attempt)}")
        if step != total:
            raise RuntimeError(
                f"verl exited normally but its last checkpoint is step {step}, not total_steps={total} "
                f"(a resume into zero steps, or training ended early); see {layout.log_file(attempt)}"
            )
        return self._final_metrics()

    def _run(
        self, argv: list[str], env: dict[str, str], log_path: Path, metrics: MetricsFile | None
    ) -> tuple[int, int | None]:
        """Run verl to completion (or a stop); returns (exit status, step the stop hook ended at)."""
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        reader = _stream(proc, log_path, self.echo)
        stop = _StopWatch(self.layout, float(self.options.get("stop_timeout_s", 900)))
        try:
            while proc.poll() is None:
                time.sleep(POLL_S)
                if metrics is not None:
                    self._log_metrics(metrics)
                if self.stop_requested and not stop.started:
                    stop.start()
                    print("[trustbench] stop requested: asked verl to checkpoint and stop", file=sys.stderr)
                if stop.started and stop.give_up():
                    _terminate(proc)
        finally:
            _terminate(proc)
            reader.join(timeout=30)
            if metrics is not None:
                self._log_metrics(metrics)
        return proc.returncode, stop.stopped_at()


class _StopWatch:
    """Waits for verl to honour a stop request; says when to stop waiting.

    verl honours the stop file (the trustbench trainer calls ``check_stop_request``): it writes
    ``STOP.done`` and exits within moments, so wait for it up to ``timeout_s``. A trainer without
    the hook never writes it: once verl's next periodic checkpoint is complete (plus a grace
    period for a hook that is about to write it) nothing more is gained by waiting.
    """

    GRACE_S = 60.0

    def __init__(self, layout: VerlLayout, timeout_s: float) -> None:
        self.layout, self.timeout_s = layout, timeout_s
        self.started = False
        self.done_file = Path(str(layout.stop_file) + STOPPED_SUFFIX)
        self.done_file.unlink(missing_ok=True)

    def start(self) -> None:
        self.layout.stop_file.write_text(f"{time.time()}\n")
        self.deadline = time.monotonic() + self.timeout_s
        self.checkpoint = latest_checkpoint_step(self.layout.checkpoints)
        self.periodic_seen: float | None = None
        self.started = True

    def give_up(self) -> bool:
        now = time.monotonic()
        if now > self.deadline:
            return True
        if self.done_file.exists():
            return False
        newer = latest_checkpoint_step(self.layout.checkpoints)
        if newer is not None and newer != self.checkpoint:
            self.periodic_seen = self.periodic_seen or now
            return now - self.periodic_seen > self.GRACE_S
        return False

    def stopped_at(self) -> int | None:
        if not self.done_file.exists():
            return None
        step = int(self.done_file.read_text().strip() or 0)
        self.done_file.unlink()
        return step


def _visible_gpus() -> int:
    try:
        import torch

        return int(torch.cuda.device_count())
    except Exception:  # pragma: no cover - torch missing or broken CUDA
        return 0


# -- sbatch ------------------------------------------------------------------------------------------
def render_sbatch(cfg: DictConfig, cell_overrides: Sequence[str], *, python: str = sys.executable) -> str:
    """A batch script that runs the cell ``cfg`` (composed from ``cell_overrides``) on Slurm.

    Its output goes to ``<run dir>/slurm-<job>.out``: the directory must exist before submission
    (``python -m runners.backends.verl.backend sbatch`` creates it). Resources come from ``runners.resources.cell_resources`` (model size, ``launcher.*``); Slurm's
    USR1 reaches the batch shell ``grace`` seconds before the time limit and is forwarded to
    trustbench, which asks verl to checkpoint; a stopped cell requeues itself (``launcher.max_requeues``).
    """
    from runners.config import run_key
    from runners.resources import cell_resources

    res, launcher = cell_resources(cfg), cfg.launcher
    grace = int(min(float(backend_options(cfg).get("stop_timeout_s", 900)) + 60, res["time_min"] * 30))
    out_dir = tb_paths.run_dir(run_key(cfg))
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name=tb-{run_key(cfg)}",
        f"#SBATCH --nodes={res['nodes']}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={res['gpus_per_node']}",
        f"#SBATCH --cpus-per-task={res['cpus_per_task']}",
        f"#SBATCH --mem={res['mem_gb']}G",
        f"#SBATCH --time={res['time_min']}",
        f"#SBATCH --signal=B:USR1@{grace}",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        f"#SBATCH --output={out_dir}/slurm-%j.out",
    ]
    for key in ("partition", "account", "qos", "constraint"):
        if launcher.get(key):
            lines.append(f"#SBATCH --{key}={launcher[key]}")
    for key, value in (OmegaConf.to_container(launcher.additional_parameters, resolve=True) or {}).items():
        lines.append(f"#SBATCH --{str(key).replace('_', '-')}={value}")
    command = shlex.join([python, "-m", "runners.backends.verl.backend", "run-cell", *cell_overrides])
    lines += [
        *[str(line) for line in launcher.setup],
        f"export TRUSTBENCH_HOME={shlex.quote(str(tb_paths.trustbench_home()))}",
        f"cd {shlex.quote(str(tb_paths.repo_root()))}",
        "# in the background, so that the shell handles Slurm's signals at once and forwards them",
        f"{command} &",
        "pid=$!",
        "trap 'kill -USR1 $pid' USR1",
        "trap 'kill -TERM $pid' TERM",
        'while kill -0 "$pid" 2>/dev/null; do wait "$pid"; done',
        'wait "$pid"',
    ]
    return "\n".join(lines) + "\n"


# -- command line -------------------------------------------------------------------------------------
def run_cell(overrides: Sequence[str]) -> int:
    """Compose and run one cell; a stopped cell asks Slurm to requeue it. Returns an exit status."""
    import runners.run as run_module
    from runners.config import compose
    from runners.launch import requeue_or_fail
    from runners.run import Preempted, RunFailed, run

    catch = getattr(run_module, "catch_stop_signals", None)
    if catch is not None:  # own Slurm's signals from here on: USR1's default action would kill us
        catch()
    cfg, choices = compose(list(overrides))
    try:
        result = run(cfg, choices)
    except Preempted as err:
        print(f"[trustbench] {err}", file=sys.stderr)
        outcome = requeue_or_fail(cfg, *([err.signal] if hasattr(err, "signal") else []))
        return 0 if outcome["status"] in ("REQUEUED", "PREEMPTED") else 1
    except RunFailed as err:
        print(f"[trustbench] {err}", file=sys.stderr)
        return 1
    print(json.dumps({k: result[k] for k in ("status", "run_key", "run_id", "name")}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ("overrides", "sbatch", "run-cell"):
        print(__doc__.split("Command line")[1], file=sys.stderr)
        return 2
    command, overrides = args[0], args[1:]
    if command == "run-cell":
        return run_cell(overrides)
    from runners.config import compose, run_key

    cfg, _ = compose(overrides)
    if command == "overrides":
        layout = VerlLayout.of(tb_paths.run_dir(run_key(cfg)))
        path = model_path(cfg) if runs_on_cpu(cfg) else str(cfg.model.path or cfg.model.name)
        print("\n".join(build_overrides(cfg, layout.paths(1), model_path=path, cpu=cpu_placement(cfg, path))))
    else:
        tb_paths.run_dir(run_key(cfg)).mkdir(parents=True, exist_ok=True)  # Slurm opens --output first
        print(render_sbatch(cfg, overrides), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
