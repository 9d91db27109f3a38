"""Build an experiment's report: tables and figures of its registry entry -> HTML, Markdown, LaTeX, PDF.

Design: ``build_report`` loads the runs (``analysis.load_experiment``, cached), builds every item of
``reports.registry.get_report(experiment)``, and writes into ``runners.paths.report_dir(exp)``:

    report.html           self-contained (CSS inline, figures as data-URI <img>, no external URL)
    report.pdf            the same page printed by headless Chromium (``reports.chromium``); without
                          Chromium, the same tables and figures laid out by reportlab (``reports.pdf``)
    report.md             every table in Markdown
    tables/<key>.{md,tex,csv}   figures/<key>.{svg,png}

An item that lacks its metrics is *skipped* with the reason shown in the page; an item that raises
is shown as *failed* (the report is still written; ``ReportResult.failures`` lists them). Finally
the directory is logged as artifacts of a dedicated "report" run of the experiment (tag
``trustbench.report``), which the loader excludes from analysis.

    trustbench report troll_table1                # CLI (reports/cli.py)
    from reports.build import build_report
    result = build_report("troll_table1", pdf=False)
"""

from __future__ import annotations

import datetime as _dt
import subprocess
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from analysis.frames import ExperimentData
from analysis.skip import SkipItem
from reports.registry import ReportSpec, get_report

TEMPLATES = Path(__file__).resolve().parent / "templates"


@dataclass
class BuiltItem:
    kind: str
    key: str
    title: str
    status: str  # ok | skipped | failed
    reason: str = ""
    caption: str = ""
    reproduces: str = ""
    obj: object = None  # analysis Table or Figure
    notes: list[str] = field(default_factory=list)


@dataclass
class ReportResult:
    experiment: str
    spec: ReportSpec
    out_dir: Path
    html: Path
    pdf: Path | None
    items: list[BuiltItem]
    mlflow_run_id: str | None = None
    pdf_renderer: str | None = None  # "chromium" | "reportlab"
    pdf_note: str = ""  # why the fallback renderer was used, and how to get the Chromium PDF

    @property
    def failures(self) -> list[BuiltItem]:
        return [i for i in self.items if i.status == "failed"]

    def figures(self) -> list[BuiltItem]:
        return [i for i in self.items if i.kind == "figure" and i.status == "ok"]

    def tables(self) -> list[BuiltItem]:
        return [i for i in self.items if i.kind == "table" and i.status == "ok"]


def build_items(spec: ReportSpec, data: ExperimentData) -> list[BuiltItem]:
    """Build every item of ``spec``; SkipItem -> skipped, other exceptions -> failed (with traceback tail)."""
    built = []
    for item in spec.items:
        name = item.target.split(":", 1)[1]
        try:
            obj = item.build(data)
        except SkipItem as exc:
            built.append(BuiltItem(item.kind, name, _title_from(name), "skipped", reason=str(exc)))
            continue
        except Exception as exc:  # a bug in one builder must not hide the rest of the report
            tail = "".join(traceback.format_exception(exc)[-3:])
            built.append(
                BuiltItem(item.kind, name, _title_from(name), "failed", reason=f"{type(exc).__name__}: {exc}\n{tail}")
            )
            continue
        built.append(
            BuiltItem(
                item.kind,
                obj.key,
                obj.title,
                "ok",
                caption=obj.caption,
                reproduces=obj.reproduces,
                obj=obj,
                notes=list(getattr(obj, "notes", [])),
            )
        )
    return built


def _title_from(name: str) -> str:
    return name.replace("_figure", "").replace("_table", "").replace("_", " ").capitalize()


def _git_revision() -> str:
    try:
        root = Path(__file__).resolve().parent.parent
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def code_versions_text(data: ExperimentData) -> str:
    """The code versions of the report's runs, e.g. ``0.1.0 @ 1a2b3c4d5e6f (12 runs)``, most runs first."""
    versions = data.code_versions()
    return "; ".join(f"{label} ({n} run{'s' * (n != 1)})" for label, n in versions) or "no runs"


def render_html(
    experiment: str, spec: ReportSpec, items: list[BuiltItem], data: ExperimentData, tracking_uri: str
) -> str:
    from analysis.paper_data import data_files, paper_source
    from analysis.synthetic import TAG_SYNTHETIC
    from runners import __version__, metric_names

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=jinja2.select_autoescape(["html", "j2"])
    )
    counters = {"table": 0, "figure": 0}
    rows = []
    for i, it in enumerate(items):
        counters[it.kind] += 1
        row = {
            "kind": it.kind,
            "key": it.key,
            "title": it.title,
            "status": it.status,
            "reason": it.reason,
            "caption": it.caption,
            "reproduces": it.reproduces,
            "notes": it.notes,
            "anchor": f"item-{i + 1}-{it.key}",
            "label": f"{'Table' if it.kind == 'table' else 'Figure'} {counters[it.kind]}.",
        }
        if it.status == "ok":
            if it.kind == "figure":
                row["uri"] = it.obj.data_uri()
            else:
                row["html"] = it.obj.to_html()
        rows.append(row)
    # the legend promises the papers' numbers only where a table prints one (a "paper" column)
    has_paper = any(
        it.status == "ok" and it.kind == "table" and any("paper" in str(c) for c in it.obj.display.columns)
        for it in items
    )
    labels = data.labels()
    synthetic_col = f"tags.{TAG_SYNTHETIC}"
    synthetic = int(data.runs[synthetic_col].notna().sum()) if synthetic_col in data.runs else 0
    seeds = sorted({int(s) for s in labels[metric_names.TAG_SEED] if s >= 0}) if len(labels) else []
    provenance = [(name, paper_source(name[:-4])) for name in data_files() if name.endswith(".csv")]
    return env.get_template("report.html.j2").render(
        version=__version__,
        css=(TEMPLATES / "report.css").read_text(),
        spec=spec,
        experiment=experiment,
        items=rows,
        has_paper=has_paper,
        n_runs=len(labels),
        n_methods=labels[metric_names.TAG_METHOD].nunique() if len(labels) else 0,
        seeds=", ".join(map(str, seeds)),
        tracking_uri=tracking_uri,
        generated=_dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        git_revision=_git_revision(),
        code_versions=code_versions_text(data),
        mixed_code=len(data.code_versions()) > 1,
        synthetic=synthetic,
        failures=sum(1 for it in items if it.status == "failed"),
        provenance=provenance,
    )


def write_outputs(out_dir: Path, items: list[BuiltItem], html: str) -> Path:
    """report.html, report.md, tables/*.{md,tex,csv}, figures/*.{svg,png}; returns the HTML path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tables").mkdir(exist_ok=True)
    (out_dir / "figures").mkdir(exist_ok=True)
    markdown = []
    for it in items:
        if it.status != "ok":
            continue
        if it.kind == "table":
            t = it.obj
            md = t.to_markdown()
            markdown.append(md)
            (out_dir / "tables" / f"{t.key}.md").write_text(md)
            (out_dir / "tables" / f"{t.key}.tex").write_text(t.to_latex())
            t.values.to_csv(out_dir / "tables" / f"{t.key}.csv")
        else:
            f = it.obj
            (out_dir / "figures" / f"{f.key}.{f.extension}").write_bytes(f.data)
    (out_dir / "report.md").write_text("\n\n".join(markdown))
    path = out_dir / "report.html"
    path.write_text(html, encoding="utf-8")
    return path


PDF_RENDERERS = ("auto", "chromium", "reportlab")


def write_pdf(
    html_path: Path, pdf_path: Path, renderer: str, experiment: str, spec: ReportSpec, items: list[BuiltItem], meta
) -> tuple[Path, str, str]:
    """(path, renderer used, note). ``auto``: Chromium when it is found and works, else reportlab."""
    from reports.chromium import ChromiumMissingError, chromium_hint, html_to_pdf
    from reports.pdf import render_pdf

    if renderer not in PDF_RENDERERS:
        raise ValueError(f"pdf renderer must be one of {', '.join(PDF_RENDERERS)}, got {renderer!r}")
    note = ""
    if renderer in ("auto", "chromium"):
        try:
            return html_to_pdf(html_path, pdf_path), "chromium", ""
        except ChromiumMissingError as exc:
            if renderer == "chromium":
                raise
            note = f"{exc.args[0].split(':')[0]}; {chromium_hint(experiment)}"
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            if renderer == "chromium":
                raise
            note = f"Chromium failed ({str(exc).splitlines()[0]}); {chromium_hint(experiment)}"
    return render_pdf(pdf_path, spec.title, spec.description, meta, items), "reportlab", note


def _meta(experiment: str, data: ExperimentData, tracking_uri: str) -> list[tuple[str, str]]:
    from runners import metric_names

    labels = data.labels()
    seeds = sorted({int(s) for s in labels[metric_names.TAG_SEED] if s >= 0}) if len(labels) else []
    methods = labels[metric_names.TAG_METHOD].nunique() if len(labels) else 0
    return [
        ("Experiment", experiment),
        ("Runs", f"{len(labels)} runs, {methods} methods" + (f", seeds {', '.join(map(str, seeds))}" if seeds else "")),
        ("Tracking store", tracking_uri),
        ("Code of the runs", code_versions_text(data)),
        (
            "Generated",
            _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z") + f" · trustbench {_git_revision()}",
        ),
        ("Reproduce", f"trustbench report {experiment}"),
    ]


def build_report(
    experiment: str,
    tracking_uri: str | None = None,
    out_dir: str | Path | None = None,
    *,
    data: ExperimentData | None = None,
    pdf: bool | str = True,
    log_to_mlflow: bool = True,
    refresh: bool | str = True,
    progress: bool | None = None,
    backend_uri: str | None = None,
) -> ReportResult:
    """Build the report of ``experiment`` (see module docstring); ``data`` skips loading from MLflow.

    ``pdf``: False (none), True or "auto" (Chromium, else reportlab), "chromium" (raises
    ``ChromiumMissingError`` without it) or "reportlab".
    """
    from runners.paths import default_tracking_uri, report_dir

    uri = tracking_uri or default_tracking_uri()
    if data is None:
        from analysis.load import load_experiment

        data = load_experiment(experiment, uri, refresh=refresh, progress=progress, backend_uri=backend_uri)
    spec = get_report(experiment)
    out = Path(out_dir) if out_dir is not None else report_dir(experiment)
    items = build_items(spec, data)
    html_path = write_outputs(out, items, render_html(experiment, spec, items, data, uri))
    pdf_path, renderer, note = None, None, ""
    if pdf:
        renderer = "auto" if pdf is True else str(pdf)
        meta = _meta(experiment, data, uri)
        pdf_path, renderer, note = write_pdf(html_path, out / "report.pdf", renderer, experiment, spec, items, meta)
    result = ReportResult(experiment, spec, out, html_path, pdf_path, items, pdf_renderer=renderer, pdf_note=note)
    if log_to_mlflow:
        from reports.mlflow_log import log_report

        result.mlflow_run_id = log_report(uri, experiment, out)
    return result
