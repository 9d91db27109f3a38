"""Refresh the results page (``docs/results.md``) from a finished stability-map sweep.

The page's measured parts sit between ``<!-- results:NAME -->`` and ``<!-- /results:NAME -->`` markers and
are rewritten from the report of the sweep's runs; the prose around them is kept. The figures are drawn
into ``docs/results/`` as PNG.

    python docs/gen_results.py --tracking-uri sqlite:///$PWD/.trustbench/mlflow.db
    python docs/gen_results.py --tracking-uri ... --experiment stability_map_cpu --out /tmp/report

Parts: ``setup`` (the report's setup box), ``score_map`` and ``stability`` (the two maps' tables),
``regime_claims`` (the claims per regime), ``verdicts`` (verdict counts per regime), ``figures`` (the
PNGs), ``provenance`` (code version, machine, when).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from runners.perf.hardware import cpu_model  # noqa: E402

PAGE = ROOT / "docs" / "results.md"
FIGURES = ROOT / "docs" / "results"
SHOWN = {
    "score_map_heatmap": "Score map: Δ IQM of the final pass@1 against GRPO in the same regime",
    "stability_heatmap": "Stability: share of seeds with an instability (E entropy, R reward, G gap, P pinned)",
    "regime_curves": "Held-out pass@1 against step, per regime (mean over seeds)",
}


def replace_part(text: str, name: str, body: str) -> str:
    """``text`` with the part ``name`` (between its markers) replaced by ``body``; the markers must exist."""
    pattern = re.compile(rf"(<!-- results:{name} -->\n).*?(<!-- /results:{name} -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"{PAGE}: no <!-- results:{name} --> ... <!-- /results:{name} --> markers")
    return pattern.sub(lambda m: m.group(1) + body.rstrip() + "\n" + m.group(2), text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tracking-uri", required=True, help="the store the sweep logged to")
    parser.add_argument("--experiment", default="stability_map_cpu")
    parser.add_argument("--out", default=None, help="where the report is written (default: a temporary folder)")
    args = parser.parse_args(argv)

    import tempfile

    from analysis.stability import VERDICTS, regime_order, score_map
    from reports.build import build_report

    out = Path(args.out or tempfile.mkdtemp(prefix="trustbench-results-"))
    result = build_report(args.experiment, args.tracking_uri, out, pdf=False, log_to_mlflow=False, progress=False)
    tables = {it.obj.key: it.obj for it in result.items if it.status == "ok" and it.kind == "table"}
    figures = {it.obj.key: it.obj for it in result.items if it.status == "ok" and it.kind == "figure"}
    text = PAGE.read_text(encoding="utf-8")
    for key in ("setup", "score_map", "stability", "regime_claims"):
        if key in tables:
            text = replace_part(text, key, tables[key].to_markdown())
    from analysis.load import load_experiment

    data = load_experiment(args.experiment, args.tracking_uri, progress=False)
    smap = score_map(data)
    counts = smap.groupby(["regime", "verdict"]).size().unstack(fill_value=0)
    counts = counts.reindex(index=regime_order(counts.index), columns=[v for v in VERDICTS if v in counts.columns])
    lines = ["| regime | " + " | ".join(counts.columns) + " |", "|---" * (len(counts.columns) + 1) + "|"]
    lines += [f"| {r} | " + " | ".join(str(int(v)) for v in row) + " |" for r, row in counts.iterrows()]
    text = replace_part(text, "verdicts", "\n".join(lines))
    FIGURES.mkdir(parents=True, exist_ok=True)
    shown = []
    for key, caption in SHOWN.items():
        if getattr(figures.get(key), "mpl", None) is not None:  # the report keeps SVG; the page embeds a PNG
            figures[key].mpl.savefig(FIGURES / f"{key}.png", format="png", dpi=150, bbox_inches="tight")
            shown.append(f"![{caption}](results/{key}.png)\n\n*{caption}.*\n")
    text = replace_part(text, "figures", "\n".join(shown))
    versions = "; ".join(f"{code} ({n} runs)" for code, n in data.code_versions())
    provenance = (
        f"Runs: {len(data.runs)} of experiment `{args.experiment}`; code {versions}; machine: {cpu_model()} ({os.cpu_count()} cores), "
        f"report built {datetime.now(UTC):%Y-%m-%d} by `python docs/gen_results.py`."
    )
    text = replace_part(text, "provenance", provenance)
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE} and {len(shown)} figure(s) in {FIGURES}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
