"""``VerlBackend``: train one trustbench cell with verl 0.9.1 in a child process, into trustbench's MLflow run.

Design: ``run(cfg)`` opens the MLflow run and constructs ``VerlBackend(cfg, tracker, run_dir, label)``
as it does the built-in trainer; ``train()`` then

1. writes the cell's datasets as verl parquet files (``data.py``), reused by a requeued attempt;
2. reads verl's checkpoint tracker (``verl/checkpoints/latest_checkpointed_iteration.txt``, ``checkpoints.py``) and
   refuses to launch into zero training steps: a checkpoint at ``trainer.total_steps`` means the
   cell is done (verl would only re-validate), one beyond it is an error naming the key;
3. translates the config (``translate.build_overrides``) for the GPUs actually allocated and runs
   ``python -m verl.trainer.main_ppo <overrides>`` (``process.py``) -- under Slurm through
   ``slurm/ray_on_slurm.sh`` (a Ray cluster over the allocation's nodes), elsewhere directly (verl
   starts a local Ray) -- in its own process group, with ``VERL_USE_EXTERNAL_MODULES`` (the
   ``trustbench_*`` plugins), ``MLFLOW_TRACKING_URI``/``MLFLOW_RUN_ID`` (the tracker's run) and
   ``VERL_FILE_LOGGER_PATH`` in its environment;
4. writes verl's output (its driver's and, forwarded by Ray, every worker's) to ``verl/verl.<attempt>.log``,
   follows verl's metrics file, renames the metrics to the schema (``metrics.py``) and logs them
   through the run tracker (steps logged by an earlier attempt are skipped). The terminal shows
   trustbench's own lines: the log's path first, one line per step (``progress``), the end; when
   verl fails, the log's last lines and its path. ``debug.verbose=true`` echoes verl's output too;
5. on ``stop_requested`` (Slurm's pre-timeout or preemption signal, set by ``run``) writes the stop
   file named by ``TRUSTBENCH_VERL_STOP_FILE``: the trustbench trainer calls ``check_stop_request``
   (``checkpoints.py``) after each step, which saves a checkpoint and ends verl's loop. The backend waits up to
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

Command line: ``trustbench verl overrides|sbatch|run-cell`` (``runners.cluster.verl_batch``: the batch
script of a cell and the command it runs) reaches this backend through the backend registry's hooks:
``overrides`` (``cell_overrides``, what ``trustbench verl overrides`` prints) and ``options``
(``translate.backend_options``). The backend imports neither the run orchestration nor the cluster package.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from runners import paths as tb_paths
from runners.backends.verl import PLUGIN_MODULE
from runners.backends.verl.checkpoints import StopWatch, check_resume, latest_checkpoint_step
from runners.backends.verl.cpu.mode import launch_env_updates, runs_on_cpu
from runners.backends.verl.layout import VerlLayout
from runners.backends.verl.metrics import MetricsFile, map_metrics
from runners.backends.verl.process import (
    check_trl,
    cpu_placement,
    launch_argv,
    launch_env,
    model_path,
    report_failure,
    say,
    step_line,
    stream,
    terminate,
    visible_gpus,
    worker_env,
)
from runners.backends.verl.translate import backend_options, build_overrides
from runners.perf.hardware import slurm_allocation

POLL_S = 1.0


# -- the backend -------------------------------------------------------------------------------------
class VerlBackend:
    """One cell trained by verl (module docstring); ``run()`` calls ``train()``."""

    def __init__(self, cfg: DictConfig, tracker: Any, run_dir: str | Path, label: str) -> None:
        self.cfg, self.tracker, self.label = cfg, tracker, label
        self.layout = VerlLayout.of(run_dir)
        self.options = backend_options(cfg)
        self.stop_requested = False
        self.echo = bool(OmegaConf.select(cfg, "debug.verbose", default=False))  # verl's output on the terminal
        self.progress = bool(cfg.get("progress", True))  # a line per step
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
        return None, visible_gpus() or None, False

    def _log_metrics(self, source: MetricsFile) -> int | None:
        last = None
        for step, data in source.read_new():
            mapped = map_metrics(data, responses_per_step=self._responses_per_step())
            self.tracker.log_metrics(mapped, step=step)
            self.last_metrics.update(mapped)
            if self.progress:
                say(step_line(self.label, step, int(self.cfg.trainer.total_steps), mapped))
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
        attempt = layout.attempt()
        log = layout.log_file(attempt)
        say(f"{self.label}: verl's output goes to {log}" + (" (and here: debug.verbose)" if self.echo else ""))
        check_trl()
        prepare_datasets(cfg, layout.data)
        path = model_path(cfg)
        cpu = cpu_placement(cfg, path)
        nnodes, gpus_per_node, in_slurm = self._resources() if cpu is None else (1, 1, False)
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
        argv = launch_argv(cfg, overrides, in_slurm=in_slurm, cpu=cpu is not None)
        (layout.root / f"command.{attempt}.txt").write_text(shlex.join(argv) + "\n")
        self.tracker.flush(wait=True)
        if self.stop_requested:  # the signal came while the data was prepared: nothing to checkpoint
            from runners.backends.base import StopRequested

            raise StopRequested(f"stopped on request before verl started; resumes from checkpoint {resume_step}")
        where = "in CPU mode" if cpu is not None else f"on {nnodes or 1} node(s) x {gpus_per_node} GPU(s)"
        say(f"{self.label}: verl starting {where}: steps {resume_step or 0} -> {total}")
        started = time.monotonic()
        rc, stopped_at = self._run(argv, env, log, MetricsFile(vpaths.metrics_file) if via == "tracker" else None)
        self.tracker.flush(wait=True)
        step = latest_checkpoint_step(layout.checkpoints)
        if self.stop_requested:
            from runners.backends.base import StopRequested

            raise StopRequested(
                f"stopped on request (verl exit {rc}, stopped after step {stopped_at}); "
                f"resumes from verl checkpoint {step} in {layout.checkpoints}"
            )
        if rc != 0:
            self._failed(log, f"verl exited with status {rc}")
            raise RuntimeError(f"verl exited with status {rc}; see {log}")
        if step != total:
            self._failed(log, f"verl exited normally but its last checkpoint is step {step}")
            raise RuntimeError(
                f"verl exited normally but its last checkpoint is step {step}, not total_steps={total} "
                f"(a resume into zero steps, or training ended early); see {log}"
            )
        say(f"{self.label}: verl trained to step {total} in {time.monotonic() - started:.0f} s (log: {log})")
        return self._final_metrics()

    def _failed(self, log: Path, what: str) -> None:
        """The log's last lines and its path on the terminal (already there with ``debug.verbose``)."""
        if not self.echo:
            report_failure(log, f"{self.label}: {what}")

    def _run(
        self, argv: list[str], env: dict[str, str], log_path: Path, metrics: MetricsFile | None
    ) -> tuple[int, int | None]:
        """Run verl to completion (or a stop); returns (exit status, step the stop hook ended at)."""
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        reader = stream(proc, log_path, self.echo)
        stop = StopWatch(self.layout, float(self.options["stop_timeout_s"]))
        try:
            while proc.poll() is None:
                time.sleep(POLL_S)
                if metrics is not None:
                    self._log_metrics(metrics)
                if self.stop_requested and not stop.started:
                    stop.start()
                    print("[trustbench] stop requested: asked verl to checkpoint and stop", file=sys.stderr)
                if stop.started and stop.give_up():
                    terminate(proc)
        finally:
            terminate(proc)
            reader.join(timeout=30)
            if metrics is not None:
                self._log_metrics(metrics)
        return proc.returncode, stop.stopped_at()


# -- what verl's trainer gets -------------------------------------------------------------------------
def cell_overrides(cfg: DictConfig) -> list[str]:
    """The overrides verl's trainer gets for cell ``cfg`` on this machine (``trustbench verl overrides``,
    reached through the backend registry's ``overrides`` hook): the CPU-mode overrides where the cell
    trains on the CPU, else those of its GPUs, for the run directory's first attempt."""
    from runners.config import run_key

    layout = VerlLayout.of(tb_paths.run_dir(run_key(cfg)))
    path = model_path(cfg) if runs_on_cpu(cfg) else str(cfg.model.path or cfg.model.name)
    return build_overrides(cfg, layout.paths(1), model_path=path, cpu=cpu_placement(cfg, path))
