"""Starting and ending the verl process: its command, environment and resources, its output streamed.

- ``launch_argv``: ``python -m verl.trainer.main_ppo <overrides>`` (``backend.options.entrypoint``; in
  CPU mode ``runners.backends.verl.cpu.driver_entry``, verl's main with the TaskRunner in the driver),
  through the Ray-on-Slurm bootstrap (``slurm/ray_on_slurm.sh``) inside a Slurm allocation;
- ``launch_env`` / ``worker_env``: the variables of the verl process and of every Ray worker (the
  plugins, MLflow run, metrics file, stop file);
- ``model_path``, ``cpu_placement``: what the cell gets where it is launched;
- ``check_trl``: refuses an installed TRL that verl 0.9.1's model loading cannot import from;
- ``terminate`` / ``stream``: the process group ended, verl's output copied to a log (and echoed with
  ``debug.verbose``);
- ``step_line`` / ``report_failure``: what the terminal shows instead: one line per training step,
  and on failure the log's last lines and its path.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from omegaconf import DictConfig

from runners import metric_names
from runners import paths as tb_paths
from runners.backends.verl.checkpoints import STOP_FILE_ENV
from runners.backends.verl.cpu.mode import CPUPlacement, exported_tokenizer_path, runs_on_cpu
from runners.backends.verl.plugins.batch_dump import DUMP_ENV
from runners.backends.verl.translate import CPU_ENTRYPOINT, ENTRYPOINT, backend_options

RAY_BOOTSTRAP = tb_paths.repo_root() / "slurm" / "ray_on_slurm.sh"
# lines of verl's log shown when it fails
TAIL_LINES = 30


def check_trl() -> None:
    """Raise before launching verl when the installed TRL would make every verl worker fail.

    verl 0.9.1 patches TRL's value-head model whenever ``trl`` is importable (its FSDP engine's
    ``apply_monkey_patch``), importing ``AutoModelForCausalLMWithValueHead`` from ``trl.experimental.ppo``
    or ``trl``. TRL 1.x removed both, and the workers die with an ImportError deep in Ray's output.
    """
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        return
    if _has_value_head_model():
        return
    from importlib.metadata import version

    raise RuntimeError(
        f"the installed trl {version('trl')} has no AutoModelForCausalLMWithValueHead, which verl 0.9.1 imports "
        "whenever trl is installed: uninstall trl (`pip uninstall trl`; only tests/benchmarks/bench_vs_trl.py "
        "uses it) or use a separate environment for verl"
    )


def _has_value_head_model() -> bool:
    import importlib.util

    try:
        if importlib.util.find_spec("trl.experimental.ppo") is not None:
            return True
    except ImportError:
        pass
    import trl

    try:
        return getattr(trl, "AutoModelForCausalLMWithValueHead", None) is not None
    except ImportError:  # a lazily imported name whose module fails
        return False


def model_path(cfg: DictConfig) -> str:
    """A directory or hub id verl can load: the directory the model kind makes (its ``make_hf_directory``
    hook: the converted SmolLM2 checkpoint), the project's own model written as a Hugging Face directory
    (``model_export``), or ``model.path``."""
    from runners.backends.verl.cpu.model_export import export_model, exportable
    from runners.models.loader import MODEL_KINDS

    make_directory = MODEL_KINDS.hook(str(cfg.model.kind), "make_hf_directory")
    if make_directory is not None:
        return str(make_directory(cfg.model))
    if exportable(cfg.model.kind):
        return str(export_model(cfg.model))
    return str(cfg.model.path or "")


def cpu_placement(cfg: DictConfig, model_dir: str) -> CPUPlacement | None:
    """How the cell runs in verl's CPU mode (``cpu_mode``), or None when it runs on GPUs."""
    from runners.backends.verl.cpu.model_export import prompt_template

    if not runs_on_cpu(cfg):
        return None
    return CPUPlacement(
        ray_address=os.environ.get("RAY_ADDRESS") or None,
        tokenizer_path=exported_tokenizer_path(model_dir),
        chat_template=prompt_template(cfg, model_dir) if os.path.isdir(model_dir) else None,
    )


def entry_command(cfg: DictConfig, python: str = sys.executable, *, cpu: bool = False) -> list[str]:
    """``[python, -m, <module>]`` for ``backend.options.entrypoint`` (a ``.py`` file runs as a script).

    ``auto`` (the default) is verl's ``main_ppo``, or in CPU mode (``cpu``) the same main with its
    TaskRunner in the driver process (``driver_entry``: one process fewer to start per launch)."""
    entry = str(backend_options(cfg).get("entrypoint") or "auto")
    if entry == "auto":
        entry = CPU_ENTRYPOINT if cpu else ENTRYPOINT
    return [python, entry] if entry.endswith(".py") else [python, "-m", entry]


def launch_argv(
    cfg: DictConfig, overrides: Sequence[str], *, in_slurm: bool, cpu: bool = False, python: str = sys.executable
) -> list[str]:
    """The command that runs verl: through the Ray-on-Slurm bootstrap inside an allocation."""
    command = [*entry_command(cfg, python, cpu=cpu), *overrides]
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
    # Ray prefixes every worker line forwarded to the driver with its name in colour: plain text in a log file
    env.setdefault("RAY_COLOR_PREFIX", "0")
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


def terminate(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
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


def stream(proc: subprocess.Popen, log_path: Path, echo: bool) -> threading.Thread:
    """Copy ``proc``'s output (verl's driver, and every Ray worker's, which Ray forwards to the driver)
    to ``log_path``; with ``echo`` to this process's stdout as well."""

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


def say(text: str, file: TextIO | None = None) -> None:
    """One line of trustbench's own on the terminal (stderr, as the built-in backend's progress bar)."""
    print(f"[trustbench] {text}", file=file or sys.stderr, flush=True)


def step_line(label: str, step: int, total: int, metrics: Mapping[str, float]) -> str:
    """The terminal's line for one of verl's steps (step 0: the evaluation before training): the
    built-in backend's progress-bar summary (score, eval, entropy H) and the step's seconds."""
    from runners.backends.base import progress_postfix

    head = f"step {step}/{total}" if step > 0 else f"step 0/{total} (before training)"
    parts = [f"{key}={value}" for key, value in progress_postfix(dict(metrics)).items()]
    if metric_names.TIMING_STEP in metrics:
        parts.append(f"{metrics[metric_names.TIMING_STEP]:.1f} s")
    return " ".join([f"{label}: {head}", *parts])


def tail(path: Path, lines: int = TAIL_LINES) -> list[str]:
    """The last ``lines`` lines of ``path`` ([] when it does not exist)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - 512 * 1024))
            data = handle.read()
    except FileNotFoundError:
        return []
    return data.decode(errors="replace").splitlines()[-lines:]


def report_failure(log_path: Path, what: str, file: TextIO | None = None, lines: int = TAIL_LINES) -> None:
    """``what`` happened: the last lines of verl's log and its path, on the terminal."""
    last = tail(log_path, lines)
    out = file or sys.stderr
    say(f"{what}; the last {len(last)} lines of {log_path}:", out)
    for line in last:
        print(f"    {line}", file=out)
    out.flush()


def visible_gpus() -> int:
    try:
        import torch

        return int(torch.cuda.device_count())
    except Exception:  # pragma: no cover - torch missing or broken CUDA
        return 0
