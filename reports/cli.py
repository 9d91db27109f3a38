"""``trustbench report`` and ``trustbench bounds``: argparse subcommands the main CLI mounts.

    trustbench report troll_table1                       # .trustbench/reports/troll_table1/report.{html,pdf}
    trustbench report demo --no-pdf --out /tmp/r         # HTML only, elsewhere
    trustbench report demo --pdf-renderer chromium       # the browser-printed PDF or exit 3 (default: Chromium if
                                                         # found, else reportlab lays out the same tables/figures)
    trustbench bounds --T 4096 --delta 1e-4 --d-seq 0.01 --out bounds.svg

``runners/cli.py`` calls ``add_report_parser(subparsers)`` and ``add_bounds_parser(subparsers)``;
each sets ``func`` to a function of the parsed args returning the exit code.
"""

from __future__ import annotations

import argparse
import sys


def add_report_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "report",
        help="build an experiment's report (HTML + PDF) from its MLflow runs",
        description="Load the runs of EXPERIMENT from MLflow (cached, refreshed incrementally), build the tables and "
        "figures registered for it (reports/registry.py; unknown experiments get a generic report) and write "
        "report.html (self-contained), report.pdf (headless Chromium, else reportlab), Markdown and LaTeX tables.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  trustbench report demo\n  trustbench report stability_map_cpu --no-pdf --out /tmp/map\n"
        "  trustbench report demo --pdf-renderer chromium",
    )
    p.add_argument("experiment", help="MLflow experiment (= sweep) name, e.g. troll_table1")
    p.add_argument(
        "--tracking-uri",
        default=None,
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or .trustbench/mlflow.db)",
    )
    p.add_argument(
        "--backend-uri",
        default=None,
        help="sqlite backend of the tracking server, when readable here: histories are read from it by SQL "
        "(default: $TRUSTBENCH_MLFLOW_BACKEND_URI)",
    )
    p.add_argument("--out", default=None, help="output directory (default: .trustbench/reports/EXPERIMENT)")
    p.add_argument("--no-pdf", action="store_true", help="skip the PDF")
    p.add_argument(
        "--pdf-renderer",
        choices=("auto", "chromium", "reportlab"),
        default="auto",
        help="auto (default): headless Chromium when found, else the same tables and figures laid out by reportlab; "
        "chromium: fail (exit 3) without it",
    )
    p.add_argument("--no-mlflow", action="store_true", help="do not log the report as MLflow artifacts")
    refresh = p.add_mutually_exclusive_group()
    refresh.add_argument(
        "--offline", action="store_true", help="use the local cache only when it exists (no store access)"
    )
    refresh.add_argument("--full-refresh", action="store_true", help="ignore the cache and re-read every run")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=run_report)
    return p


def run_report(args: argparse.Namespace) -> int:
    from analysis.load import ExperimentNotFoundError
    from reports.build import build_report
    from reports.chromium import ChromiumMissingError

    refresh = False if args.offline else ("full" if args.full_refresh else True)
    # a scheme MLflow cannot open, a server where nothing answers, or a damaged sqlite store (named, with the
    # way out): one line, nothing written
    broken = _unusable_store(args.tracking_uri, args.offline) or (
        None if args.offline else _broken_store(args.tracking_uri, args.backend_uri)
    )
    if broken is not None:
        print(f"trustbench: {broken}", file=sys.stderr)
        return 2
    try:
        result = build_report(
            args.experiment,
            tracking_uri=args.tracking_uri,
            out_dir=args.out,
            pdf=False if args.no_pdf else args.pdf_renderer,
            log_to_mlflow=not args.no_mlflow,
            refresh=refresh,
            progress=False if args.quiet else None,
            backend_uri=args.backend_uri,
        )
    except ExperimentNotFoundError as exc:
        print(f"trustbench: {exc}", file=sys.stderr)
        return 2
    except ChromiumMissingError as exc:
        print(f"trustbench: {exc}", file=sys.stderr)
        return 3
    except ValueError as exc:  # e.g. a --backend-uri that is not a readable sqlite store
        print(f"trustbench: {exc}", file=sys.stderr)
        return 2
    except Exception:
        broken = _broken_store(args.tracking_uri, args.backend_uri)  # --offline without a cache reads the store
        if broken is None:
            raise
        print(f"trustbench: {broken}", file=sys.stderr)
        return 2
    ok = sum(1 for i in result.items if i.status == "ok")
    print(f"report {result.spec.name!r} for experiment {args.experiment!r}: {ok}/{len(result.items)} items")
    for item in result.items:
        if item.status != "ok":
            print(f"  {item.status}: {item.kind} {item.key}: {item.reason.splitlines()[0]}")
    print(f"  html: {result.html}")
    if result.pdf:
        print(f"  pdf:  {result.pdf} ({result.pdf_renderer})")
    if result.pdf_note:
        print(f"  note: PDF rendered by reportlab: {result.pdf_note}")
    if result.mlflow_run_id:
        print(f"  mlflow: artifacts of run {result.mlflow_run_id} (report/)")
    return 1 if result.failures else 0


def _unusable_store(tracking_uri: str | None, offline: bool) -> str | None:
    """Why the tracking URI (``--tracking-uri`` or ``$MLFLOW_TRACKING_URI``) cannot be read, or None: a
    scheme MLflow does not open (``runners.paths.tracking_uri_problem``), or an http(s) server where
    nothing answers (checked at once, instead of MLflow's minutes of retries; not with ``--offline``)."""
    import urllib.error
    import urllib.request

    from runners.paths import default_tracking_uri, tracking_uri_problem
    from runners.redact import redact

    uri = tracking_uri or default_tracking_uri()
    source = "--tracking-uri" if tracking_uri else "environment variable MLFLOW_TRACKING_URI"
    problem = tracking_uri_problem(uri)
    if problem:
        return f"{problem} ({source}: {redact(uri)})"
    if offline or not uri.startswith(("http://", "https://")):
        return None
    try:  # MLflow leaves /health open; any HTTP answer means a server is there
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=5).close()
    except urllib.error.HTTPError:
        pass
    except (OSError, ValueError):
        return f"no MLflow server answers at {redact(uri)} (set by {source})"
    return None


def _broken_store(tracking_uri: str | None, backend_uri: str | None) -> str | None:
    """Why the sqlite store a report reads (``--tracking-uri`` or the default, ``--backend-uri`` or
    ``$TRUSTBENCH_MLFLOW_BACKEND_URI``) cannot be read (damaged, half-built), or None
    (``runners.sqlite_store.check_sqlite_store``; a missing file is reported by the loader)."""
    import os

    from runners.paths import default_tracking_uri, sqlite_path
    from runners.sqlite_store import BrokenStore, check_sqlite_store

    for uri in (tracking_uri or default_tracking_uri(), backend_uri or os.environ.get("TRUSTBENCH_MLFLOW_BACKEND_URI")):
        db = sqlite_path(uri) if uri else None
        try:
            if db is not None:
                check_sqlite_store(db)
        except BrokenStore as err:
            return str(err)
    return None


def add_bounds_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bounds",
        help="print TRM error bounds for a sequence length and divergence (TRM, arXiv 2512.23075, section 4)",
        description="Print the classical, linear, Pinsker-Marginal, Mixed (with --d-seq) and unified bounds on "
        "|J(theta) - J(roll) - L(theta)| for sequence length T and max token KL delta; --out also plots them vs T.",
        epilog="example: trustbench bounds --T 4096 --delta 1e-4 --d-seq 0.01 --out bounds.svg",
    )
    p.add_argument("--T", type=int, required=True, help="sequence length in tokens")
    p.add_argument("--delta", type=float, required=True, help="max per-token KL divergence (rollout -> training)")
    p.add_argument("--d-seq", type=float, default=None, help="sequence-level KL D_seq (enables the Mixed bound)")
    p.add_argument("--no-cap", action="store_true", help="uncapped forms (the paper's 'without caps' column)")
    p.add_argument("--out", default=None, help="write a plot of the bounds vs T (svg, png or pdf by extension)")
    p.add_argument("--t-max", type=int, default=None, help="largest T of the plot (default: 4 x --T)")
    p.set_defaults(func=run_bounds)
    return p


PLOT_FORMATS = (".svg", ".png", ".pdf")  # --out: by extension


def _bounds_args_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with ``trustbench bounds``'s flags (one of them named), or None."""
    from pathlib import Path

    if args.T < 1:
        return f"--T must be >= 1, got {args.T}"
    if args.t_max is not None and args.t_max < 2:
        return f"--t-max must be >= 2 (the plot starts at T = 2), got {args.t_max}"
    if args.out:
        out = Path(args.out).expanduser()
        if out.suffix.lower() not in PLOT_FORMATS:
            return f"--out {args.out}: the plot is written as {', '.join(PLOT_FORMATS)} by extension"
        if not out.parent.is_dir():
            return f"--out {args.out}: directory {out.parent} does not exist"
    return None


def format_bounds(T: int, delta: float, d_seq: float | None, cap: bool = True) -> str:
    from runners.algorithms.bounds import error_bounds

    b = error_bounds(T, delta, d_seq=d_seq, cap=cap)
    labels = {
        "classical": "Classical (TRPO), T(T-1)δ",
        "linear": "Linear, 4T·min(1,√(δ/2))",
        "pinsker_marginal": "Pinsker-Marginal",
        "mixed": "Mixed" + (f" (D_seq={d_seq:g})" if d_seq is not None else " (needs --d-seq)"),
        "best": "Unified (min of PM, Mixed)",
    }
    lines = [f"TRM error bounds on |J(θ) − J(roll) − L(θ)|, T = {T}, δ = {delta:g}" + ("" if cap else " (uncapped)")]
    for key, label in labels.items():
        value = b[key]
        text = "n/a" if value != value else (f"{value:.4g}" if abs(value) < 1e5 else f"{value:.3e}")
        lines.append(f"  {label:<36} {text:>12}")
    return "\n".join(lines)


def run_bounds(args: argparse.Namespace) -> int:
    problem = _bounds_args_problem(args)
    if problem:  # before anything is computed or written
        print(f"trustbench: {problem}", file=sys.stderr)
        return 2
    try:
        print(format_bounds(args.T, args.delta, args.d_seq, cap=not args.no_cap))
    except ValueError as exc:
        print(f"trustbench: {exc}", file=sys.stderr)
        return 2
    if args.out:
        from analysis.figures.bounds import plot_bounds

        fig = plot_bounds([args.delta], d_seq=args.d_seq, t_max=args.t_max or 4 * args.T)
        ax = fig.axes[0]
        ax.axvline(args.T, color="0.3", lw=0.8, ls="--")
        ax.annotate(f"T = {args.T}", (args.T, ax.get_ylim()[0]), textcoords="offset points", xytext=(3, 5), fontsize=7)
        fig.savefig(args.out, bbox_inches="tight")
        print(f"plot: {args.out}")
    return 0
