"""Dataset presets: where each dataset lives and how to read one row of its schema.

A preset (``PRESETS[name]``) says where a dataset lives on the hub (id, config, split names), how to
read a row of its schema (question / gold answer / reference solution fields, tried in order so hub
mirrors with renamed columns load too), how to clean a source's own wording and gold answers, and
which reward verifies it. ``runners.data.datasets.load_examples`` reads a preset's rows from a local
file or the hub; ``embedded`` is generated (``runners.data.embedded``), never read. Torch-free.

    from runners.data.presets import PRESETS, register_preset, DatasetPreset
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class DatasetPreset:
    """Where a dataset lives and how to read one row of its schema."""

    name: str
    # hub dataset id (None: generated)
    hub_id: str | None
    # our split name ("train" / "test") -> hub split name
    hub_splits: dict[str, str]
    # reward function name in runners.data.rewards.REWARDS
    reward_fn: str
    # prompt style of runners.data.prompts (instruction appended to the question)
    prompt_style: str | None
    # task family recorded as verl's "ability"
    ability: str = "math"
    hub_config: str | None = None
    # candidate field names, first present wins; dotted paths reach nested dicts
    question_fields: tuple[str, ...] = ("problem", "question")
    answer_fields: tuple[str, ...] = ("answer",)
    solution_fields: tuple[str, ...] = ("solution",)
    # fields copied into Example.meta when present
    meta_fields: tuple[str, ...] = ()
    # evaluation examples held out of a single-split source (0: the source has its own test split);
    # overridable by the "holdout" option where the preset lists it
    holdout: int = 0
    # keep only rows for which this returns True (e.g. Eurus-2 math vs code)
    row_filter: Callable[[dict], bool] | None = None
    # turns the raw question text into the bare question (strips a source's own instructions)
    clean_question: Callable[[str], str] | None = None
    # turns the raw gold into the answer string the reward expects
    clean_answer: Callable[[Any], str] | None = None
    # default options (embedded: generator knobs and sizes)
    options: dict[str, Any] = field(default_factory=dict)


PRESETS: dict[str, DatasetPreset] = {}


def register_preset(preset: DatasetPreset) -> DatasetPreset:
    if preset.name in PRESETS:
        raise ValueError(f"dataset preset {preset.name!r} is already registered")
    PRESETS[preset.name] = preset
    return preset


def get_preset(name: str) -> DatasetPreset:
    if name not in PRESETS:
        raise KeyError(f"unknown dataset preset {name!r}; valid presets: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]


# -- field cleaning ------------------------------------------------------------------------------
def answer_to_str(value: Any) -> str:
    """Gold answers as strings: ``27.0 -> "27"``, ``["$3$", "$4$"] -> "3, 4"``, ``"$\\frac12$" -> "\\frac12"``."""
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (list, tuple)) or (hasattr(value, "tolist") and not isinstance(value, str)):
        items = value.tolist() if hasattr(value, "tolist") else value
        return ", ".join(answer_to_str(v) for v in items)
    text = str(value).strip()
    if len(text) >= 2 and text.startswith("$") and text.endswith("$"):
        text = text.strip("$").strip()
    return text


def gsm8k_gold(answer: Any) -> str:
    """GSM8K's answer field ``"... #### 72"`` -> ``"72"`` (commas removed)."""
    text = str(answer)
    if "####" not in text:
        raise ValueError(f"GSM8K answer has no '####' line: {text[-80:]!r}")
    return text.rsplit("####", 1)[1].strip().replace(",", "")


def gsm8k_solution(answer: Any) -> str:
    """GSM8K's worked solution without its calculator annotations ``<<48/2=24>>``."""
    return re.sub(r"<<[^>]*>>", "", str(answer)).strip()


_DAPO_PREFIX = re.compile(r"^.*?where \$Answer is the answer to the problem\.\s*", re.S)
_DAPO_SUFFIX = re.compile(r"\s*Remember to put your answer on its own line after \"Answer:\"\.?\s*$")
_EURUS_SUFFIX = re.compile(r"\s*Present the answer in LaTeX format: \\boxed\{Your answer\}\.?\s*$")


def clean_dapo_question(text: str) -> str:
    """DAPO-Math-17k wraps each problem in its 'Answer: $Answer' instructions; keep the problem."""
    return _DAPO_SUFFIX.sub("", _DAPO_PREFIX.sub("", text)).strip()


def clean_eurus_math_question(text: str) -> str:
    """Eurus-2 math user turns end with the boxed-answer instruction; the prompt style re-adds ours."""
    return _EURUS_SUFFIX.sub("", text).strip()


def _ability_is(value: str) -> Callable[[dict], bool]:
    return lambda row: str(row.get("ability", "")).lower() == value


# -- presets -------------------------------------------------------------------------------------
register_preset(
    DatasetPreset(
        name="embedded",
        hub_id=None,
        hub_splits={"train": "train", "test": "test"},
        reward_fn="embedded_int",
        prompt_style=None,
        ability="arithmetic",
        question_fields=("prompt",),
        solution_fields=("solution",),
        options={
            "digits": 3,
            "ops": "+-*",
            "test_fraction": 0.1,
            "train_size": 20000,
            "test_size": 512,
            "eval_seed": 0,
            # long-tailed response lengths: this share of problems with digits+1..long_digits-digit operands
            "long_fraction": 0.0,
            "long_digits": 0,
        },
    )
)
register_preset(
    DatasetPreset(
        name="gsm8k",
        hub_id="openai/gsm8k",
        hub_config="main",
        hub_splits={"train": "train", "test": "test"},
        reward_fn="gsm8k",
        prompt_style="gsm8k",
        question_fields=("question",),
        answer_fields=("answer",),
        solution_fields=("answer",),
        clean_answer=gsm8k_gold,
    )
)
register_preset(
    DatasetPreset(
        name="dapo_math",
        hub_id="BytedTsinghua-SIA/DAPO-Math-17k",
        hub_splits={"train": "train", "test": "train"},
        reward_fn="math",
        prompt_style="boxed",
        question_fields=("prompt", "problem", "question"),
        answer_fields=("reward_model.ground_truth", "answer"),
        meta_fields=("data_source", "extra_info"),
        clean_question=clean_dapo_question,
        holdout=1024,
        options={"holdout": 1024},
    )
)
for _name, _hub_id, _split, _config, _meta in [
    ("math500", "HuggingFaceH4/MATH-500", "test", None, ("subject", "level", "unique_id")),
    ("amc23", "math-ai/amc23", "test", None, ("id", "url")),
    ("aime24", "HuggingFaceH4/aime_2024", "train", None, ("id", "url", "year")),
    ("aime25", "math-ai/aime25", "test", None, ("id",)),
    ("minerva", "math-ai/minervamath", "test", None, ("type", "idx")),
    ("olympiadbench", "Hothan/OlympiadBench", "train", "OE_TO_maths_en_COMP", ("id", "subfield", "unit")),
    ("omni_math", "KbsdJames/Omni-MATH", "test", None, ("domain", "difficulty", "source")),
]:
    register_preset(
        DatasetPreset(
            name=_name,
            hub_id=_hub_id,
            hub_config=_config,
            hub_splits={"test": _split},
            reward_fn="math",
            prompt_style="boxed",
            question_fields=("problem", "question"),
            answer_fields=("answer", "final_answer"),
            solution_fields=("solution",),
            meta_fields=_meta,
        )
    )
register_preset(
    DatasetPreset(
        name="eurus2_math",
        hub_id="PRIME-RL/Eurus-2-RL-Data",
        hub_splits={"train": "train", "test": "validation"},
        reward_fn="math",
        prompt_style="boxed",
        question_fields=("prompt",),
        answer_fields=("reward_model.ground_truth",),
        solution_fields=(),
        meta_fields=("data_source", "extra_info"),
        row_filter=_ability_is("math"),
        clean_question=clean_eurus_math_question,
    )
)
register_preset(
    DatasetPreset(
        name="eurus2_code",
        hub_id="PRIME-RL/Eurus-2-RL-Data",
        hub_splits={"train": "train", "test": "validation"},
        reward_fn="code",
        prompt_style="code",
        ability="code",
        question_fields=("prompt",),
        answer_fields=("reward_model.ground_truth",),
        solution_fields=(),
        meta_fields=("data_source", "extra_info"),
        row_filter=_ability_is("code"),
    )
)
