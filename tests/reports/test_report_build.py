"""Report building: every registered item builds from data that has what it needs, the HTML is
self-contained and shows each registered figure, skipped items say why."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from analysis.skip import SkipItem
from analysis.synthetic import profile, synthetic_data
from reports.build import build_items, build_report
from reports.registry import Item, ReportSpec, get_report, register_report, report_names

EXPECTED_REPORTS = {
    "demo",
    "troll_table1",
    "troll_table4",
    "troll_table5",
    "entropy_tables",
    "tppo_table1",
    "trm_acceptance",
    "generic",
}
SWEEPS = sorted((Path(__file__).resolve().parents[2] / "sweeps").glob("*.yaml"))


@pytest.mark.parametrize("sweep", SWEEPS, ids=[p.stem for p in SWEEPS])
def test_every_sweep_gets_its_papers_report(sweep):
    """Each sweep file's experiment (its MLflow experiment) has a registered report, not the generic one:
    a *_cpu sweep the items of its paper's report; every report compares with a baseline and checks claims."""
    experiment = yaml.safe_load(sweep.read_text())["experiment"]
    spec = get_report(experiment)
    assert spec.name == experiment != "generic"
    base = experiment.removesuffix("_cpu")
    assert spec.items == get_report(base).items
    targets = {item.target for item in spec.items}
    assert {"analysis.tables.compare:comparison_table", "analysis.tables.claims:claims_table"} <= targets


def test_registry_covers_the_sweeps_and_falls_back_to_generic():
    assert EXPECTED_REPORTS <= set(report_names())
    assert get_report("some_new_sweep").name == "generic"
    with pytest.raises(ValueError, match="already registered"):
        register_report(ReportSpec("demo", "x", "y", ()))
    for name in report_names():
        for item in get_report(name).items:
            assert callable(item.builder()), item.target  # every lazy target resolves


def test_every_registered_item_builds_from_complete_data(sink):
    data, _ = sink
    unique = {}
    for name in report_names():
        for item in get_report(name).items:
            unique.setdefault((item.target, repr(sorted(item.options.items()))), item)
    spec = ReportSpec("all_items", "all", "every registered item once", tuple(unique.values()))
    built = build_items(spec, data)
    problems = [(b.key, b.status, b.reason.splitlines()[0]) for b in built if b.status != "ok"]
    assert not problems
    for b in built:
        assert b.caption and b.title
        if b.kind == "figure":
            assert b.obj.data and b.obj.mime in ("image/svg+xml", "image/png")


def test_report_html_is_self_contained_and_complete(built_report):
    html = built_report.html.read_text()
    spec = get_report("trm_acceptance")
    assert len(built_report.figures()) == spec.count("figure")
    assert len(built_report.tables()) == spec.count("table")
    assert html.count('<figure class="tb-figure"') == spec.count("figure")
    assert html.count('<img src="data:image/') == spec.count("figure")
    # nothing is fetched from anywhere: every src/href is a data URI or an in-page anchor
    refs = re.findall(r'(?:src|href)="([^"]*)"', html)
    assert refs and all(r.startswith(("data:", "#")) for r in refs)
    assert "<script" not in html and "<link" not in html and "@import" not in html
    # the reader sees what is reproduced, and ours beside paper
    assert "reproduces TRM (arXiv 2512.23075) Table D.1" in html
    assert html.count('<td class="paper">') > 0
    assert "Synthetic data." in html
    for name in ("report.md", "tables/trm_table_d1.tex", "tables/trm_table_d1.csv", "figures/trm_bounds.svg"):
        assert (built_report.out_dir / name).exists(), name


def _without_trm(spec):
    return replace(spec, families=spec.families - {"trm"})


def test_missing_metrics_are_skipped_with_a_reason(tmp_path):
    data, _ = synthetic_data(_without_trm(profile("demo", steps=6, seeds=(0,))))
    spec = ReportSpec("only_trm", "t", "d", (Item("figure", "analysis.figures.trm:acceptance_by_length_figure"),))
    (item,) = build_items(spec, data)
    assert item.status == "skipped" and "trm/accept_rate/len_" in item.reason


def test_a_failing_item_does_not_hide_the_rest(tmp_path, monkeypatch):
    data, _ = synthetic_data(_without_trm(profile("demo", steps=6, seeds=(0,))))
    import analysis.tables.generic as generic

    def broken(_data):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(generic, "overview_table", broken)
    result = build_report(
        "demo", tracking_uri="sqlite:///unused.db", out_dir=tmp_path, data=data, pdf=False, log_to_mlflow=False
    )
    assert [f.key for f in result.failures] == ["overview_table"]
    html = result.html.read_text()
    assert "Failed to build: ZeroDivisionError: boom" in html
    skipped = [i.key for i in result.items if i.status == "skipped"]
    # one evaluation per run (step 0 of 6 steps): no learning curve; the data logs no TRM metrics
    assert skipped == ["learning_table", "acceptance_figure"]
    assert len(result.figures()) == get_report("demo").count("figure") - 1


def test_a_skip_item_shows_its_message_in_place_of_the_item(tmp_path, monkeypatch):
    """A builder that raises ``SkipItem`` leaves a skipped item, not a failure: the page shows the
    exception's message (escaped) where the table would be, in the item's place, no file of the table
    is written, and the next item still builds."""
    import analysis.tables.generic as generic
    import reports.build

    data, _ = synthetic_data(_without_trm(profile("demo", steps=6, seeds=(0,))))
    message = "no run logs <metric/x> & y"

    def lacking(_data):
        raise SkipItem(message)

    monkeypatch.setattr(generic, "overview_table", lacking)
    spec = ReportSpec(
        "skip_check",
        "t",
        "d",
        (
            Item("table", "analysis.tables.generic:overview_table"),
            Item("table", "analysis.tables.generic:config_diff_table"),
        ),
    )
    monkeypatch.setattr(reports.build, "get_report", lambda _name: spec)
    result = build_report(
        "skip_check", tracking_uri="sqlite:///unused.db", out_dir=tmp_path, data=data, pdf=False, log_to_mlflow=False
    )
    assert result.failures == []
    assert [(i.key, i.status, i.reason) for i in result.items] == [
        ("overview_table", "skipped", message),
        ("config_diff", "ok", ""),
    ]
    html = result.html.read_text()
    section = re.search(r'<section class="item table" id="item-1-overview_table"([^>]*)>(.*?)</section>', html, re.S)
    assert section, "the skipped item keeps its place (first item) in the page"
    assert 'data-status="skipped"' in section.group(1)
    assert '<div class="skipped">Skipped: no run logs &lt;metric/x&gt; &amp; y</div>' in section.group(2)
    assert "<table" not in section.group(2) and "Failed to build" not in html
    assert html.count("<table") == 1  # the config differences
    assert sorted(p.name for p in (tmp_path / "tables").iterdir()) == [
        "config_diff.csv",
        "config_diff.md",
        "config_diff.tex",
    ]


def _with_code(data, codes):
    """``data`` with its runs' code-version tags set from ``codes`` (version, revision) in turn; None: not recorded."""
    from runners import metric_names

    runs = data.runs.copy()
    for column, i in ((f"tags.{metric_names.TAG_PACKAGE_VERSION}", 0), (f"tags.{metric_names.TAG_GIT_REVISION}", 1)):
        runs[column] = [codes[j % len(codes)][i] if codes[j % len(codes)] else None for j in range(len(runs))]
    return replace(data, runs=runs)


def test_report_shows_the_code_versions_of_its_runs(tmp_path):
    """The header (and the PDF's metadata) list the code each run came from, with counts, most runs
    first; runs from more than one code version get a banner that says how to rerun the old ones."""
    from reports.build import _meta

    data, _ = synthetic_data(_without_trm(profile("demo", steps=6, seeds=(0, 1, 2))))
    n = len(data.runs)
    assert n >= 3
    mixed = _with_code(
        data, [("0.1.0", "aaaaaaaaaaaa"), ("0.1.0", "aaaaaaaaaaaa"), ("0.0.9", "bbbbbbbbbbbb-dirty.1234abcd")]
    )
    old = sum(1 for j in range(n) if j % 3 == 2)
    expected = (
        f"0.1.0 @ aaaaaaaaaaaa ({n - old} runs); 0.0.9 @ bbbbbbbbbbbb-dirty.1234abcd ({old} run{'s' * (old != 1)})"
    )
    assert mixed.code_versions() == [("0.1.0 @ aaaaaaaaaaaa", n - old), ("0.0.9 @ bbbbbbbbbbbb-dirty.1234abcd", old)]
    kwargs = dict(tracking_uri="sqlite:///unused.db", pdf=False, log_to_mlflow=False)
    html = build_report("demo", out_dir=tmp_path / "mixed", data=mixed, **kwargs).html.read_text()
    assert f'<dd class="code-versions">{expected}</dd>' in html
    assert "Runs from different code." in html and "--rerun-stale" in html
    assert ("Code of the runs", expected) in _meta("demo", mixed, "sqlite:///unused.db")

    same = _with_code(data, [("0.1.0", "aaaaaaaaaaaa")])
    html = build_report("demo", out_dir=tmp_path / "same", data=same, **kwargs).html.read_text()
    assert f'<dd class="code-versions">0.1.0 @ aaaaaaaaaaaa ({n} runs)</dd>' in html
    assert "Runs from different code." not in html
    partial = _with_code(data, [None, ("0.1.0", None)])
    labels = dict(partial.code_versions())
    assert labels == {"unrecorded": (n + 1) // 2, "0.1.0 @ ?": n // 2}


def test_the_legend_promises_the_papers_numbers_only_where_a_table_prints_one(tmp_path):
    """The demo's tables have no "paper" column: its legend names ours only. A table with the paper's numbers
    (TROLL's Table 1) brings the italic "paper" key back."""
    from reports.build import BuiltItem, render_html
    from reports.registry import get_report

    data, _ = synthetic_data(_without_trm(profile("demo", steps=6, seeds=(0, 1))))
    kwargs = dict(tracking_uri="sqlite:///unused.db", pdf=False, log_to_mlflow=False)
    result = build_report("demo", out_dir=tmp_path / "demo", data=data, **kwargs)
    html = result.html.read_text()
    legend = html[html.index('<p class="legend-key">') :].split("</p>", 1)[0]
    assert "<b>ours</b>" in legend and "paper" not in legend
    assert not any("paper" in str(c) for it in result.items if it.kind == "table" and it.status == "ok"
                   for c in it.obj.display.columns)  # fmt: skip

    class _Paper:
        class display:  # noqa: N801 - a stand-in with the one attribute render_html reads
            columns = ["ours", "paper"]

        @staticmethod
        def to_html():
            return "<table></table>"

    item = BuiltItem("table", "t", "T", "ok", obj=_Paper())
    html = render_html("demo", get_report("demo"), [item], data, "sqlite:///unused.db")
    assert '<span class="paper">paper</span> (italic' in html
