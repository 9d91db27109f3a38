"""A verl cell on Slurm: its batch script, the command the script runs, and the ``trustbench verl`` commands.

- ``render_sbatch``: the batch script of a cell (``trustbench verl sbatch`` prints it);
- ``run_cell``: what the script runs (``trustbench verl run-cell``, as ``python -m runners.cli verl
  run-cell`` with the interpreter that wrote the script: the batch job needs no console script on its
  PATH): compose, run, requeue a stopped cell (``runners.cluster.job.requeue_or_fail``);
- ``cli_command``: ``trustbench verl overrides|sbatch|run-cell``; ``overrides`` prints what the backend
  gives verl's trainer for the cell.

The verl backend is reached through the backend registry (its ``overrides`` and ``options`` hooks), so
that ``trustbench verl --help`` imports neither the backend nor verl, and the backend imports nothing of
this package.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence

from omegaconf import DictConfig, OmegaConf

from runners import paths as tb_paths
from runners.backends import BACKENDS


def render_sbatch(cfg: DictConfig, cell_overrides: Sequence[str], *, python: str = sys.executable) -> str:
    """A batch script that runs the cell ``cfg`` (composed from ``cell_overrides``) on Slurm.

    Its output goes to ``<run dir>/slurm-<job>.out``: the directory must exist before submission
    (``trustbench verl sbatch`` creates it). Resources come from ``runners.config.resources.cell_resources``
    (model size, ``launcher.*``); Slurm's USR1 reaches the batch shell ``grace`` seconds before the time
    limit and is forwarded to trustbench, which asks verl to checkpoint; a stopped cell requeues itself
    (``launcher.max_requeues``).
    """
    from runners.config import run_key
    from runners.config.resources import cell_resources

    res, launcher = cell_resources(cfg), cfg.launcher
    options = BACKENDS.hook("verl", "options")(cfg)
    grace = int(min(float(options["stop_timeout_s"]) + 60, res["time_min"] * 30))
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


def run_cell(overrides: Sequence[str]) -> int:
    """Compose and run one cell; a stopped cell asks Slurm to requeue it. Returns an exit status."""
    from runners.cluster.job import requeue_or_fail
    from runners.config import compose
    from runners.run import Preempted, RunFailed, catch_stop_signals, run

    catch_stop_signals()  # own Slurm's signals from here on: USR1's default action would kill us
    cfg, choices = compose(list(overrides))
    try:
        result = run(cfg, choices)
    except Preempted as err:
        print(f"[trustbench] {err}", file=sys.stderr)
        outcome = requeue_or_fail(cfg, err.signal)
        return 0 if outcome["status"] in ("REQUEUED", "PREEMPTED") else 1
    except RunFailed as err:
        print(f"[trustbench] {err}", file=sys.stderr)
        return 1
    print(json.dumps({k: result[k] for k in ("status", "run_key", "run_id", "name")}))
    return 0


# -- the trustbench verl command -------------------------------------------------------------------
COMMANDS = {
    "overrides": "print the overrides verl's trainer gets for the cell",
    "sbatch": "print a Slurm batch script that runs the cell",
    "run-cell": "run the cell, requeued when stopped (what the batch script runs)",
}
EXAMPLES = """examples:
  trustbench verl overrides backend=verl model=qwen3_8b algorithm=gspo backend.device=cuda
  trustbench verl overrides backend=verl          the CPU-mode overrides, where there is no CUDA
  trustbench verl sbatch backend=verl model=qwen3_8b +method=grpo_troll launcher.partition=gpu > cell.sbatch
"""


def build_parser(prog: str = "trustbench verl") -> argparse.ArgumentParser:
    """The parser of ``trustbench verl``: one subcommand per ``COMMANDS`` entry, each taking Hydra overrides."""
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog=prog,
        description="The verl backend's commands. Each composes a cell as trustbench run does:\n"
        "the arguments are Hydra overrides, e.g. backend=verl model=qwen3_8b algorithm=gspo.",
        formatter_class=raw,
        epilog=EXAMPLES,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, text in COMMANDS.items():
        p = sub.add_parser(name, help=text, description=f"{text[0].upper()}{text[1:]}.", formatter_class=raw)
        p.epilog = EXAMPLES
        p.add_argument("overrides", nargs=argparse.REMAINDER, help="e.g. backend=verl model=qwen3_8b algorithm=gspo")
    return parser


def cli_command(argv: Sequence[str]) -> int:
    """``trustbench verl COMMAND OVERRIDES...`` (``COMMANDS``): ``overrides`` prints the cell's verl
    overrides, ``sbatch`` its batch script (creating the run directory the job writes into), ``run-cell``
    runs it (``run_cell``). Returns an exit status; a mistyped command exits 2 through argparse, a bad
    config raises ``compose``'s errors (``runners.cli`` turns them into one line)."""
    args = build_parser().parse_args(list(argv))
    if args.command == "run-cell":
        return run_cell(args.overrides)
    from runners.config import compose, run_key

    cfg, _ = compose(list(args.overrides))
    if args.command == "overrides":
        print("\n".join(BACKENDS.hook("verl", "overrides")(cfg)))
    else:
        tb_paths.run_dir(run_key(cfg)).mkdir(parents=True, exist_ok=True)  # Slurm opens --output first
        print(render_sbatch(cfg, args.overrides), end="")
    return 0
