"""The trustbench command.

    trustbench run [OVERRIDES...]                 train one cell (Hydra overrides, e.g. algorithm=gspo objective=troll)
    trustbench sweep NAME [OVERRIDES...]          run the grid of sweeps/NAME.yaml (skips finished cells)
        --dry-run                                 print the cells, what is done, the resources; submit nothing
        --rerun-failed / --force                  also rerun failed cells / rerun every cell from scratch
        --rerun-stale                             rerun cells that finished with other code (from scratch)
        --no-wait                                 return once the jobs are queued (submitit launchers)
    trustbench report EXPERIMENT                  tables and figures of an experiment as HTML and PDF
    trustbench bounds --T 4096 --delta 1e-4       TRM error bounds (arXiv 2512.23075) printed and plotted
    trustbench ui [EXPERIMENT]                    MLflow UI on 127.0.0.1, the link to the experiment's runs
    trustbench list [GROUP]                       config groups and their options, and the sweeps
    trustbench verl COMMAND [OVERRIDES...]        the verl backend: a cell's verl overrides, its Slurm script

Every argument of run goes to Hydra, overrides and Hydra's own flags in any order
(trustbench run --cfg job algorithm=tppo); sweep takes its flags anywhere among the overrides.

Exit codes: 0 success, 1 a run or cell failed (or the cell is already running elsewhere), 2 a
configuration error (nothing was started; one message naming the key or file, never a traceback).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

CONFIG_ERROR = 2
RUN_EXAMPLES = """examples:
  trustbench run                                   GRPO on the embedded default (CPU, no network)
  trustbench run objective=troll                   GRPO with TROLL's trust region instead of clipping
  trustbench run +method=grpo_trm +regime=stale2   TRM-Max on rollouts sampled 2 iterations behind
  trustbench run --cfg job algorithm=tppo          print the composed config, train nothing

Hydra's own flags are accepted too (--cfg job, --info, --hydra-help); the groups and their options:
trustbench list.
"""
SWEEP_EXAMPLES = """examples:
  trustbench sweep demo --dry-run                  the cells, what is done, the estimated CPU time
  trustbench sweep demo                            run them (finished cells are skipped)
  trustbench sweep stability_map_cpu seed=0,1      only the first two seeds
  trustbench sweep troll_table1 launcher=cluster   on your Slurm site profile
"""
# Hydra flags that change where the config comes from, or compose a sweep: composing is left to Hydra
_HYDRA_COMPOSES = ("--config-path", "--config-name", "--config-dir", "--experimental-rerun", "--multirun")


def _config_error(err: BaseException) -> int:
    from runners.config.messages import describe

    print(f"trustbench: configuration error: {describe(err)}", file=sys.stderr)
    return CONFIG_ERROR


def _broken_store(uri: str | None) -> int | None:
    """Exit status 2 and one line naming the file and the way out when ``uri`` (default: this home's store)
    is a sqlite store that is damaged or half-built (``runners.sqlite_store.check_sqlite_store``); else None."""
    from runners import paths
    from runners.sqlite_store import BrokenStore, check_sqlite_store

    db = paths.sqlite_path(uri or paths.default_tracking_uri())
    try:
        if db is not None:
            check_sqlite_store(db)
    except BrokenStore as err:
        print(f"trustbench: {err}", file=sys.stderr)
        return CONFIG_ERROR
    return None


def _compose_errors():
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    from runners.config import ConfigError

    return (ConfigError, HydraException, OmegaConfBaseException, YAMLError)


def split_hydra_args(tokens: Sequence[str]) -> tuple[list[str], list[str]]:
    """(overrides, Hydra flags with their values) from ``tokens`` in any order, read by Hydra's own
    argument parser (whose positional overrides cannot be split by flags: they go last)."""
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()
    parser.prog = "trustbench run"
    ns = parser.parse_intermixed_args(list(tokens))
    flags: list[str] = []
    for action in parser._actions:
        if not action.option_strings or not hasattr(ns, action.dest):
            continue
        value = getattr(ns, action.dest)
        if value == action.default:
            continue
        flag = action.option_strings[0]
        flags += [flag] if action.nargs == 0 or (action.nargs == "?" and value == action.const) else [flag, str(value)]
    return list(ns.overrides), flags


def cmd_run(args: argparse.Namespace) -> int:
    from runners.config import SEARCHPATH_OVERRIDE, compose

    try:
        overrides, flags = split_hydra_args(args.overrides)
    except SystemExit as exit_:  # a flag Hydra does not know: argparse printed why
        return int(exit_.code or 0)
    if not any(f in _HYDRA_COMPOSES for f in flags):
        from runners.backends import check_placement

        try:  # compose first for a clean message; with flags (--cfg job) an invalid config still prints
            cfg, _ = compose([o for o in overrides if not o.startswith("hydra.")], check=not flags)
            if not flags:
                from runners.config.validate import check_seed

                check_seed(cfg)  # the one key compose's validation leaves out (runners.config.grid)
                check_placement(cfg)  # the cell runs here: can this machine run it?
        except _compose_errors() as err:
            return _config_error(err)
        except UnicodeDecodeError:  # a config file that is not text: Hydra's error names no file
            from runners.config.text_files import unreadable

            return _config_error(unreadable(overrides))
        if not flags:  # the store, before Hydra or the cell's directory exist (tracking=server: the home's file)
            from runners.run import tracking_uri

            own_server = cfg.tracking.kind == "server" and not cfg.tracking.uri
            broken = _broken_store(None if own_server else tracking_uri(cfg))
            if broken is not None:
                return broken
    from hydra.core.global_hydra import GlobalHydra

    from runners.main import main

    GlobalHydra.instance().clear()
    sys.argv = ["trustbench run", *flags, SEARCHPATH_OVERRIDE, *overrides]
    os.environ.setdefault("HYDRA_FULL_ERROR", "0")
    try:
        main()  # runners.main._run_one turns a failed or refused run into a message and an exit code
    except SystemExit as exit_:
        return int(exit_.code or 0)
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from runners import sweep
    from runners.sqlite_store import BrokenStore

    try:
        plan = sweep.plan(
            args.name,
            args.overrides,
            rerun_failed=args.rerun_failed,
            rerun_stale=args.rerun_stale,
            force=args.force,
        )
    except _compose_errors() as err:
        return _config_error(err)
    except BrokenStore as err:  # the store that says which cells finished is damaged
        print(f"trustbench: {err}", file=sys.stderr)
        return CONFIG_ERROR
    print(sweep.format_plan(plan))
    if args.dry_run:
        return 0
    if not plan.to_run:
        print("nothing to run: every cell is finished (or failed: --rerun-failed)")
        failed = [c for c in plan.cells if c.action == "skip-failed"]
        return 1 if failed else 0
    try:
        jobs = sweep.launch(plan, force=args.force, wait=not args.no_wait)
    except _compose_errors() as err:
        return _config_error(err)
    if args.no_wait:
        print(
            f"queued {len(jobs)} job(s); `trustbench sweep {args.name}` again later reports (and skips) what finished"
        )
        return 0
    print()
    bad = sweep.report_outcomes(plan)
    if bad:
        print(f"trustbench: {bad} of {len(plan.cells)} cells did not finish (see above)", file=sys.stderr)
        return 1
    return 0


def cmd_ui(args: argparse.Namespace) -> int:
    from runners import mlflow_ui, paths, tracking
    from runners.redact import redact
    from runners.tracking_server import SERVER_ENV, is_up, server_command

    uri = args.tracking_uri or paths.default_tracking_uri()
    source = "--tracking-uri" if args.tracking_uri else "environment variable MLFLOW_TRACKING_URI"
    if not 0 < args.port < 65536:  # before anything is created or started
        print(f"trustbench: --port must be a TCP port in 1-65535 (got {args.port})", file=sys.stderr)
        return CONFIG_ERROR
    problem = paths.tracking_uri_problem(uri)
    if problem:
        print(f"trustbench: {problem} ({source}: {redact(uri)})", file=sys.stderr)
        return CONFIG_ERROR
    if uri.startswith(("http://", "https://")) and not is_up(uri):  # not after MLflow's minutes of retries
        print(f"trustbench: no MLflow server answers at {redact(uri)} (set by {source})", file=sys.stderr)
        return CONFIG_ERROR
    broken = _broken_store(uri)  # damaged or half-built: one line, not MLflow's traceback
    if broken is not None:
        return broken
    exp, db = None, paths.sqlite_path(uri)
    if not (args.experiment and db is not None and not db.exists()):  # no store, no experiment: none created
        uri = tracking.ensure_store(uri)
        exp = mlflow_ui.ui_experiment(tracking._client(uri), args.experiment)  # the page to link (runners.mlflow_ui)
    if args.experiment and exp is None:
        print(f"trustbench: no MLflow experiment named {args.experiment!r} in {redact(uri)}", file=sys.stderr)
        return CONFIG_ERROR
    cmd = server_command("ui", uri, args.host, args.port)  # one worker, no job runner (as tracking=server)
    if uri.startswith("sqlite:"):
        cmd += ["--default-artifact-root", paths.artifact_root().as_uri()]
    base = f"http://{args.host}:{args.port}"
    print(f"MLflow UI for {redact(uri)} at {base} (Ctrl-C to stop)", flush=True)
    if exp is not None:
        print(f"runs of {exp.name}, by method: {mlflow_ui.runs_page_url(base, exp.experiment_id)}", flush=True)
    return _serve(cmd, env={**os.environ, **SERVER_ENV})


def _serve(cmd: list[str], env: dict) -> int:
    """Run ``cmd`` (the MLflow UI) in its own process group and end the whole group with this
    command, whatever ends it: Ctrl-C, SIGTERM (a job scheduler, a terminal multiplexer, ``kill``) or
    SIGHUP; ``mlflow ui`` and its uvicorn worker would otherwise live on, re-parented to init."""
    import signal

    from runners.tracking_server import end_group

    proc = subprocess.Popen(cmd, env=env, start_new_session=True)

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return proc.wait()
    except KeyboardInterrupt:
        return 130
    finally:
        if proc.poll() is None:
            end_group(proc, timeout_s=10.0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def cmd_verl(args: argparse.Namespace) -> int:
    """``trustbench verl ...``: a verl cell's overrides, batch script and job command
    (``runners.cluster.verl_batch``, which parses its own commands: ``trustbench verl --help``); it reaches
    the verl backend through the registry, and only when a command needs it, so that neither ``--help``
    nor the other commands import the backend."""
    from runners.cluster.verl_batch import cli_command

    try:
        return cli_command(args.args)
    except _compose_errors() as err:
        return _config_error(err)


def _summary_line(path: Path) -> str:
    """The first comment line of a YAML file (not Hydra's ``@package`` directive), or ''."""
    lines = path.read_text(errors="replace").splitlines()  # a damaged file is listed; `sweep` names it
    return next((ln[1:].strip() for ln in lines if ln.startswith("# ") and "@package" not in ln), "")


def cmd_list(args: argparse.Namespace) -> int:
    from runners.config import CONF_DIR, SWEEPS_DIR

    groups = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir())
    wanted = [args.group] if args.group else groups
    for group in wanted:
        folder = CONF_DIR / group
        if not folder.is_dir():
            print(f"trustbench: unknown group {group!r}; groups: {', '.join(groups)}", file=sys.stderr)
            return CONFIG_ERROR
        print(f"{group}:")
        for f in sorted(folder.glob("*.yaml")):
            print(f"  {f.stem:<26} {_summary_line(f)}")
    if not args.group:
        print("sweeps (trustbench sweep NAME):")
        for f in sorted(SWEEPS_DIR.glob("*.yaml")):
            print(f"  {f.stem:<26} {_summary_line(f)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trustbench",
        description="Fair comparison of policy-update methods for RL of LLMs: configs, runs, MLflow, reports.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "run",
        help="train one cell",
        description="Train one cell; arguments are Hydra overrides (one option per config group, any key).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=RUN_EXAMPLES,
    )
    p.add_argument("overrides", nargs=argparse.REMAINDER, help="e.g. algorithm=grpo objective=troll seed=1")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "sweep",
        help="run the grid of sweeps/NAME.yaml",
        description="Run every cell of sweeps/NAME.yaml that has not finished (trustbench list shows the sweeps).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=SWEEP_EXAMPLES,
    )
    p.add_argument("name", help="sweep file name without .yaml (trustbench list shows them)")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for every cell (sweep syntax a,b allowed)")
    p.add_argument("--dry-run", action="store_true", help="print the cells and resources; submit nothing")
    p.add_argument("--rerun-failed", action="store_true", help="also rerun cells whose MLflow run FAILED")
    p.add_argument(
        "--rerun-stale",
        action="store_true",
        help="also rerun, from scratch, cells that finished with other code (another git revision or version)",
    )
    p.add_argument("--force", action="store_true", help="rerun every cell from scratch (new MLflow runs)")
    p.add_argument("--no-wait", action="store_true", help="return once Slurm/submitit jobs are queued")
    p.set_defaults(func=cmd_sweep)

    try:
        from reports.cli import add_bounds_parser, add_report_parser

        add_report_parser(sub)
        add_bounds_parser(sub)
    except ImportError:  # pragma: no cover - reports package missing its optional deps
        pass

    p = sub.add_parser(
        "ui",
        help="start the MLflow UI on 127.0.0.1",
        description="Serve the MLflow UI of this home's store (or --tracking-uri) until Ctrl-C.",
        epilog="examples: trustbench ui; trustbench ui demo --port 5001",
    )
    p.add_argument("experiment", nargs="?", help="print the link to its runs (default: the latest run's experiment)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or .trustbench/mlflow.db")
    p.set_defaults(func=cmd_ui)

    p = sub.add_parser(
        "list",
        help="list config groups, their options and the sweeps",
        description="Every config group of conf/ with its options, then the sweeps of sweeps/.",
        epilog="examples: trustbench list; trustbench list regime",
    )
    p.add_argument("group", nargs="?", help="one group only (e.g. algorithm)")
    p.set_defaults(func=cmd_list)

    # parse_args hands every argument after `verl` to cmd_verl: this entry only lists it in --help
    sub.add_parser("verl", help="verl backend: a cell's overrides, its Slurm script", add_help=False)
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """``run``: every argument is Hydra's (``cmd_run`` sorts flags from overrides); ``sweep``: its
    flags may come after overrides (``sweep demo --dry-run trainer.lr=1e-4``); ``verl``: the backend's parser."""
    if list(argv[:1]) == ["run"] and not {"-h", "--help"} & set(argv[1:]):
        return argparse.Namespace(command="run", overrides=list(argv[1:]), func=cmd_run)
    if list(argv[:1]) == ["verl"]:
        return argparse.Namespace(command="verl", args=list(argv[1:]), func=cmd_verl)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command == "sweep" and not any(e.startswith("-") for e in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:  # Ctrl-C: what was stopped has been said; no traceback
        print("trustbench: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
