"""Examples -> verl's RL parquet schema (what ``verl.utils.dataset.rl_dataset.RLHFDataset`` reads).

One row per example::

    data_source   str   the preset name (val-core/<data_source>/... metrics group by it)
    prompt        list  chat messages [{"role", "content"}], the instruction already included
                        (RLHFDataset applies the tokenizer's chat template itself)
    ability       str   "math" | "code" | "arithmetic"
    reward_model  dict  {"style": "rule", "ground_truth": <gold answer string>}
    extra_info    dict  {"split", "index", "reward_fn", "question", "source"?}

``extra_info.reward_fn`` names our reward so verl's custom reward function (``compute_score``
below: ``reward.custom_reward_function.path=<this file>``, ``...name=compute_score``)
dispatches to ``runners.data.rewards.REWARDS`` instead of verl's data_source switch, whose string
matching would not know our preset names (nor extract answers strictly).

    python -c "from runners.data.datasets import load_examples; from runners.data.verl_format import \\
        write_verl_parquet; write_verl_parquet('/tmp/embedded_test.parquet', load_examples('embedded', split='test'))"
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runners.data.prompts import build_messages
from runners.data.types import Example


def _ability(example: Example) -> str:
    from runners.data.datasets import PRESETS

    preset = PRESETS.get(example.data_source)
    return preset.ability if preset is not None else ("code" if example.reward_fn == "code" else "math")


def to_verl_record(
    example: Example,
    index: int,
    *,
    split: str | None = None,
    style: str | None = "preset",
    system_prompt: str | None = None,
) -> dict[str, Any]:
    """One verl row (see the module docstring); ``split`` defaults to ``example.meta["split"]``."""
    extra: dict[str, Any] = {
        "split": split or str(example.meta.get("split", "train")),
        "index": int(index),
        "reward_fn": example.reward_fn,
        "question": example.prompt_text(),
    }
    if "source" in example.meta:
        extra["source"] = str(example.meta["source"])
    return {
        "data_source": example.data_source,
        "prompt": build_messages(example, style=style, system_prompt=system_prompt),
        "ability": _ability(example),
        "reward_model": {"style": "rule", "ground_truth": example.answer},
        "extra_info": extra,
    }


def write_verl_parquet(path: str | Path, examples: list[Example], **record_kwargs: Any) -> Path:
    """Write ``examples`` as a verl parquet file (parent directories created); returns the path."""
    import pandas as pd

    if not examples:
        raise ValueError(f"refusing to write an empty verl dataset to {path}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [to_verl_record(example, i, **record_kwargs) for i, example in enumerate(examples)]
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None, **kw: Any
) -> float:
    """verl's custom reward function signature: our reward by ``extra_info["reward_fn"]``, else
    by the ``data_source`` preset's reward. Extra ``custom_reward_function.reward_kwargs`` (e.g.
    ``timeout_s``) are passed through."""
    from runners.data.datasets import PRESETS
    from runners.data.rewards import compute_reward

    extra_info = extra_info or {}
    name = extra_info.get("reward_fn")
    if not name:
        if data_source not in PRESETS:
            raise KeyError(
                f"no reward_fn in extra_info and data_source {data_source!r} is not a preset; valid: {sorted(PRESETS)}"
            )
        name = PRESETS[data_source].reward_fn
    return compute_reward(name, solution_str, ground_truth, prompt=extra_info.get("question"), **kw)
