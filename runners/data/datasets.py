"""Dataset presets and ``load_examples``: every source normalised to ``Example``.

Design: a preset (``PRESETS[name]``, ``runners.data.presets``) says where a dataset lives on the
hub (id, config, split names), how to read a row of its schema (question / gold answer / reference
solution fields, tried in order so hub mirrors with renamed columns load too) and which reward
verifies it. The same preset reads a local parquet/jsonl/json file in that schema when ``path`` is
given (clusters with pre-staged data, tests), or the hub through ``datasets.load_dataset``
(imported lazily; needs network). ``embedded`` is generated (``embedded.py``), never read.

Splits: ``train`` plus an evaluation split (``test``; ``validation``/``val`` are aliases where the
source has one name only). Sources with a single split (DAPO-Math-17k) hold out a fixed subset for
evaluation (TROLL, arXiv 2510.03817, appendix C.2: 1024 DAPO-Math problems), chosen with a fixed
seed so that every run sees the same held-out problems. ``limit`` keeps a ``seed``-dependent random subset of the
training split, but the FIRST ``limit`` examples of an evaluation split: runs that differ only in
their seed are evaluated on the same problems.

    from runners.data.datasets import load_examples
    load_examples("embedded", split="test", limit=4)
    load_examples("gsm8k", split="train", path="data/gsm8k_train.parquet")
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from runners.data.embedded import generate_embedded
from runners.data.presets import (  # noqa: F401  (PRESETS, register_preset, answer_to_str: re-exported)
    PRESETS,
    DatasetPreset,
    answer_to_str,
    get_preset,
    gsm8k_solution,
    register_preset,
)
from runners.data.types import Example

EVAL_SPLIT_ALIASES = {"test": "test", "validation": "test", "val": "test", "eval": "test"}


# -- reading -------------------------------------------------------------------------------------
def _lookup(row: dict, dotted: str) -> Any:
    value: Any = row
    for part in dotted.split("."):
        if isinstance(value, str) and part:  # nested JSON stored as a string column
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                return None
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _first(row: dict, fields: tuple[str, ...]) -> tuple[str | None, Any]:
    for name in fields:
        value = _lookup(row, name)
        if value is not None and not (isinstance(value, str) and not value.strip()):
            return name, value
    return None, None


def _question_text(value: Any) -> str:
    """A question field: plain text, or chat messages (the last user turn)."""
    if hasattr(value, "tolist") and not isinstance(value, str):
        value = value.tolist()
    if isinstance(value, list):
        users = [m.get("content", "") for m in value if isinstance(m, dict) and m.get("role") == "user"]
        if not users:
            raise ValueError(f"chat prompt without a user message: {str(value)[:200]!r}")
        return users[-1]
    return str(value)


def row_to_example(preset: DatasetPreset, row: dict, *, split: str, index: int) -> Example:
    """One source row -> ``Example``; ``ValueError`` naming the missing field and the preset."""
    q_field, question = _first(row, preset.question_fields)
    a_field, answer = _first(row, preset.answer_fields)
    if question is None or a_field is None:
        missing = preset.question_fields if question is None else preset.answer_fields
        raise ValueError(
            f"dataset preset {preset.name!r}: row {index} has none of the fields {list(missing)} "
            f"(row fields: {sorted(row)})"
        )
    text = _question_text(question)
    if preset.clean_question is not None:
        text = preset.clean_question(text)
    gold = preset.clean_answer(answer) if preset.clean_answer else answer_to_str(answer)
    if preset.ability == "code" and not isinstance(answer, str):
        gold = json.dumps(answer)
    _, solution = _first(row, preset.solution_fields)
    if preset.name == "gsm8k" and solution is not None:
        solution = gsm8k_solution(solution)
    elif isinstance(solution, (list, tuple)):
        solution = "\n\n".join(map(str, solution))
    meta: dict[str, Any] = {"split": split, "index": index, "question_field": q_field}
    for name in preset.meta_fields:
        value = _lookup(row, name)
        if value is not None:
            meta[name if name != "data_source" else "source"] = value
    if isinstance(question, list) or hasattr(question, "tolist"):
        meta["source_prompt"] = question.tolist() if hasattr(question, "tolist") else question
    return Example(
        prompt=text,
        answer=gold,
        data_source=preset.name,
        reward_fn=preset.reward_fn,
        solution=None if solution is None else str(solution),
        meta=meta,
    )


class DatasetError(ValueError):
    """A dataset that cannot be used as configured (a bad file, option, split or size); the message
    names the file or the preset, and the problem."""


class DatasetFileNotFound(DatasetError, FileNotFoundError):
    """A ``path`` that is not a file."""


def read_rows(path: str | Path) -> list[dict]:
    """Rows of a local parquet, jsonl or json file (a list, or ``{"data": [...]}``).

    ``DatasetError`` naming the file (and the line) for an unreadable parquet file, malformed JSON,
    text that is not UTF-8, or rows that are not objects."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise DatasetFileNotFound(f"dataset file not found: {path}")
    suffix = path.suffix.lower()
    if suffix not in (".parquet", ".jsonl", ".json"):
        raise DatasetError(f"{path}: unsupported dataset file type {suffix!r} (use .parquet, .jsonl or .json)")
    try:
        rows = _read_parquet(path) if suffix == ".parquet" else _read_json(path, lines=suffix == ".jsonl")
    except UnicodeDecodeError as err:
        raise DatasetError(f"dataset file {path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    bad = next((i for i, row in enumerate(rows) if not isinstance(row, dict)), None)
    if bad is not None:
        raise DatasetError(f"dataset file {path}: row {bad} is a {type(rows[bad]).__name__}, not an object of fields")
    return rows


def _read_parquet(path: Path) -> list[dict]:
    import pandas as pd

    try:
        return pd.read_parquet(path).to_dict(orient="records")
    except Exception as err:  # noqa: BLE001 - pyarrow raises several kinds for a damaged file
        raise DatasetError(
            f"dataset file {path} is not a readable parquet file ({type(err).__name__}: {err})"
        ) from None


def _read_json(path: Path, lines: bool) -> list:
    text = path.read_text(encoding="utf-8")
    if lines:
        rows = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                rows.append(_parse_json(line, path, number))
        return rows
    data = _parse_json(text, path, None)
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise DatasetError(f"dataset file {path}: expected a JSON list of rows or {{'data': [...]}}")
    return data


def _parse_json(text: str, path: Path, line: int | None):
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        number = line if line is not None else err.lineno
        raise DatasetError(
            f"dataset file {path}, line {number}, column {err.colno}: not valid JSON ({err.msg})"
        ) from None


def _hub_rows(preset: DatasetPreset, hub_split: str) -> list[dict]:
    where = (
        f"{preset.hub_id}" + (f" (config {preset.hub_config})" if preset.hub_config else "") + f", split {hub_split!r}"
    )
    try:
        import datasets
    except ImportError as exc:
        raise RuntimeError(
            f"dataset preset {preset.name!r} needs the 'datasets' package to load {where} from the hub; "
            "install it or pass path= to a local parquet/jsonl/json file"
        ) from exc
    try:
        ds = datasets.load_dataset(preset.hub_id, preset.hub_config, split=hub_split)
    except Exception as exc:  # no network, unknown split, gated repo, ...
        raise RuntimeError(
            f"dataset preset {preset.name!r}: could not load {where} from the hub ({type(exc).__name__}: {exc}); "
            "pass path= to a local parquet/jsonl/json file in the same schema"
        ) from exc
    return [dict(row) for row in ds]


def _holdout_partition(n: int, holdout: int, split: str) -> list[int]:
    """Indices of ``split`` in a single-split source of ``n`` rows; fixed seed (not the run seed)."""
    if holdout >= n:
        raise DatasetError(f"cannot hold out {holdout} evaluation rows from a source of {n} rows")
    held = set(random.Random(0).sample(range(n), holdout))
    return [i for i in range(n) if (i in held) == (split == "test")]


def _canonical_split(preset: DatasetPreset, split: str) -> str:
    canonical = "train" if split == "train" else EVAL_SPLIT_ALIASES.get(split)
    if canonical is None or canonical not in preset.hub_splits:
        valid = ["train"] * ("train" in preset.hub_splits) + ["test", "validation"] * ("test" in preset.hub_splits)
        raise DatasetError(f"dataset preset {preset.name!r} has no split {split!r}; valid splits: {valid}")
    return canonical


def load_examples(
    preset: str,
    *,
    split: str,
    path: str | Path | None = None,
    limit: int | None = None,
    seed: int = 0,
    **options: Any,
) -> list[Example]:
    """Examples of ``preset``'s ``split`` from ``path`` (a file in the source schema) or the hub.

    ``limit``: a ``seed``-dependent random subset of the training split (kept in source order), the
    first ``limit`` examples of an evaluation split. ``options`` go to the embedded generator
    (``digits``, ``ops``, ``test_fraction``, ``train_size``, ``test_size``, ``eval_seed``,
    ``long_fraction``, ``long_digits``) or set
    ``holdout`` (DAPO-Math); options a preset does not list are rejected.
    """
    p = get_preset(preset)
    canonical = _canonical_split(p, split)
    if limit is not None and limit < 1:
        raise DatasetError(f"load_examples limit must be >= 1 or None, got {limit!r}")
    unknown = set(options) - set(p.options)
    if unknown:
        raise DatasetError(f"dataset preset {preset!r} has no option(s) {sorted(unknown)}; valid: {sorted(p.options)}")
    if p.hub_id is None and path is None:
        return _generate(p, canonical, limit, seed, {**p.options, **options})

    source = f"dataset file {Path(path).expanduser()}" if path is not None else f"hub dataset {p.hub_id}"
    rows = read_rows(path) if path is not None else _hub_rows(p, p.hub_splits[canonical])
    if not rows and path is not None:
        raise DatasetError(f"{source} is empty: it holds no rows")
    kept = [r for r in rows if p.row_filter(r)] if p.row_filter is not None else rows
    if not kept and path is not None:
        raise DatasetError(f"{source}: none of its {len(rows)} rows is a {p.name!r} row (the preset's row filter)")
    indices = list(range(len(kept)))
    holdout = int({**p.options, **options}.get("holdout", p.holdout))
    if holdout:
        indices = _holdout_partition(len(kept), holdout, canonical)
    if limit is not None and limit < len(indices):
        indices = sorted(random.Random(seed).sample(indices, limit)) if canonical == "train" else indices[:limit]
    try:
        return [row_to_example(p, kept[i], split=canonical, index=i) for i in indices]
    except ValueError as err:  # a row without the preset's fields, or with a gold answer it cannot read
        raise DatasetError(f"{source}: {err}") from None


_CHECKED: dict[tuple, int] = {}  # check_source results per file version


def check_source(preset: str, *, split: str, path: str | Path, **options: Any) -> int:
    """Read ``path`` as ``load_examples`` will (every row converted) and return the number of
    examples; ``DatasetError`` naming the file otherwise. Cached per file version (path, size,
    modification time), so a sweep's cells read each file once."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise DatasetFileNotFound(f"dataset file not found: {file}")
    stat = file.stat()
    key = (preset, split, str(file.resolve()), stat.st_size, stat.st_mtime_ns, json.dumps(options, sort_keys=True))
    if key not in _CHECKED:
        _CHECKED[key] = len(load_examples(preset, split=split, path=file, **options))
    return _CHECKED[key]


def _generate(p: DatasetPreset, split: str, limit: int | None, seed: int, opts: dict[str, Any]) -> list[Example]:
    n = limit if limit is not None else opts[f"{split}_size"]
    gen_seed = seed if split == "train" else opts["eval_seed"]
    return generate_embedded(
        n,
        split=split,
        seed=gen_seed,
        digits=int(opts["digits"]),
        ops=str(opts["ops"]),
        test_fraction=float(opts["test_fraction"]),
        long_fraction=float(opts["long_fraction"]),
        long_digits=int(opts["long_digits"]),
    )
