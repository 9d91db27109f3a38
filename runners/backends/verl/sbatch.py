"""The Slurm side of a verl cell: its batch script (``render_sbatch``) and the command the script runs
(``run_cell``: compose, run, requeue a stopped cell). ``trustbench verl sbatch`` prints the script;
``trustbench verl run-cell`` is what it runs (as ``python -m runners.cli verl run-cell``, with the
interpreter that wrote the script: the batch job needs no console script on its PATH)."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Sequence

from omegaconf import DictConfig, OmegaConf

from runners import paths as tb_paths
from runners.backends.verl.translate import backend_options


def render_sbatch(cfg: DictConfig, cell_overrides: Sequence[str], *, python: str = sys.executable) -> str:
    """A batch script that runs the cell ``cfg`` (composed from ``cell_overrides``) on Slurm.

    Its output goes to ``<run dir>/slurm-<job>.out``: the directory must exist before submission
    (``trustbench verl sbatch`` creates it). Resources come from ``runners.resources.cell_resources``
    (model size, ``launcher.*``); Slurm's USR1 reaches the batch shell ``grace`` seconds before the time
    limit and is forwarded to trustbench, which asks verl to checkpoint; a stopped cell requeues itself
    (``launcher.max_requeues``).
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
    command = shlex.join([python, "-m", "runners.cli", "verl", "run-cell", *cell_overrides])
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
