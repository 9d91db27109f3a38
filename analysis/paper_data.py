"""The papers' published numbers (``analysis/data/*.csv|json``), so every table prints "paper" beside "ours".

Each file starts with ``#`` lines naming the paper, table and how the cells were transcribed; the
rest is a tidy CSV (one printed cell per row). ``paper_table(name)`` returns the frame and
``paper_source(name)`` the header text (shown in report captions and the provenance appendix).

    from analysis.paper_data import paper_table
    paper_table("troll_table1").query("model == 'Qwen3-8B' and method == 'GRPO'")
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pandas as pd

DATA_DIR = Path(__file__).resolve().parent / "data"


def _path(name: str, suffix: str) -> Path:
    path = DATA_DIR / f"{name}{suffix}"
    if not path.exists():
        names = sorted(p.stem for p in DATA_DIR.glob(f"*{suffix}"))
        raise KeyError(f"no paper data file {path.name}; available: {', '.join(names)}")
    return path


@cache
def _read(name: str) -> pd.DataFrame:
    return pd.read_csv(_path(name, ".csv"), comment="#", keep_default_na=True)


def paper_table(name: str) -> pd.DataFrame:
    """The tidy frame of ``analysis/data/<name>.csv`` (a copy; safe to modify)."""
    return _read(name).copy()


def paper_source(name: str) -> str:
    """The ``#`` header lines of ``<name>.csv`` (where each number comes from), joined."""
    lines = []
    for line in _path(name, ".csv").read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# ").rstrip())
    return " ".join(lines)


@cache
def model_configs() -> dict[str, dict[str, float]]:
    """Attention shapes and parameter counts for the Roofline's analytical curves."""
    data = json.loads(_path("model_configs", ".json").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def data_files() -> list[str]:
    return sorted(p.name for p in DATA_DIR.iterdir() if p.suffix in (".csv", ".json"))
