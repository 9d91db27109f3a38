"""Data of a verl cell: its datasets as verl parquet files, and the reward function verl calls.

Design: the same examples the built-in trainer uses (``load_examples`` with the cell's dataset
config and seed) are written once per run directory in verl's RL schema
(``runners.data.verl_format``): ``train.parquet`` and ``val.parquet`` plus ``data.json``, the
dataset config they came from. A requeued attempt reuses them when ``data.json`` matches, so verl's
checkpointed dataloader position refers to the same rows (and hub datasets are not fetched again).
Prompts longer than ``rollout.max_prompt_length`` are dropped by verl itself
(``data.filter_overlong_prompts``), after its chat template, as the built-in trainer drops them.

verl's reward manager calls ``compute_score(data_source, solution_str, ground_truth, extra_info)``
for every response (``reward.custom_reward_function.path=pkg://runners.backends.verl.data``, a
plain import in every reward worker, ``.name=compute_score``; the file path works too). It dispatches on ``extra_info["reward_fn"]`` -- the reward named by the dataset
preset, or ``dataset.reward`` when the config overrides it, written into each row at export -- to
``runners.data.rewards`` with the question as ``prompt`` (the echo check), exactly as the built-in
trainer scores a response. verl's own ``data_source`` switch is never used: it would not know our
preset names. The returned float becomes verl's ``acc`` (``val-core/<data>/acc/mean@N``).

    python -c "from runners.backends.verl.data import compute_score; \\
        print(compute_score('embedded', '\\\\boxed{7}', '7', {'reward_fn': 'embedded_int'}))"
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from omegaconf import DictConfig, OmegaConf

from runners.backends.verl.layout import TRAIN_FILE, VAL_FILE

REWARD_FUNCTION_NAME = "compute_score"
# verl's load_extern_object imports "pkg://a.b" as module a.b (a file path would be loaded unregistered)
REWARD_FUNCTION_PATH = "pkg://runners.backends.verl.data"


class DataFiles(NamedTuple):
    """The parquet files of one cell and how many rows each holds."""

    train: Path
    val: Path
    n_train: int
    n_val: int


def data_spec(cfg: DictConfig) -> dict[str, Any]:
    """What determines the exported rows: the dataset config, the seed and the prompt format."""
    return {
        "dataset": OmegaConf.to_container(cfg.dataset, resolve=True),
        "seed": int(cfg.seed),
        "chat_template": bool(cfg.model.chat_template),
    }


def _examples(cfg: DictConfig, split: str) -> list:
    from runners.data.splits import eval_examples, train_examples

    return train_examples(cfg) if split == "train" else eval_examples(cfg)


def prepare_datasets(cfg: DictConfig, out_dir: str | Path) -> DataFiles:
    """Write (or reuse) ``out_dir/{train,val}.parquet`` for the cell ``cfg``.

    Raises ``ConfigError('trainer.prompts_per_step')`` when the training split has fewer examples
    than one step needs (verl's dataloader drops the incomplete last batch: no step would run).
    """
    import pandas as pd

    from runners.config.validate import ConfigError
    from runners.data.verl_format import write_verl_parquet

    out = Path(out_dir)
    meta_path = out / "data.json"
    spec = data_spec(cfg)
    train, val = out / TRAIN_FILE, out / VAL_FILE
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else None
    if meta is not None and meta.get("spec") == spec and train.is_file() and val.is_file():
        files = DataFiles(train, val, int(meta["n_train"]), int(meta["n_val"]))
    else:
        out.mkdir(parents=True, exist_ok=True)
        train_examples, val_examples = _examples(cfg, "train"), _examples(cfg, "val")
        write_verl_parquet(train, train_examples, split="train")
        write_verl_parquet(val, val_examples, split="test")
        files = DataFiles(train, val, len(train_examples), len(val_examples))
        tmp = meta_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"spec": spec, "n_train": files.n_train, "n_val": files.n_val}, indent=2))
        tmp.replace(meta_path)
    if files.n_train < int(cfg.trainer.prompts_per_step):
        raise ConfigError(
            "trainer.prompts_per_step",
            f"{cfg.dataset.name} has {files.n_train} training examples, fewer than one step's "
            f"{cfg.trainer.prompts_per_step} prompts (dataset.train_limit={cfg.dataset.train_limit})",
        )
    if files.n_val == 0 or len(pd.read_parquet(val, columns=["data_source"])) != files.n_val:
        raise ValueError(f"{val}: expected {files.n_val} evaluation rows; delete {out} to export again")
    return files


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None, **_: Any
) -> float:
    """verl's custom reward entry: ``runners.data.rewards`` for the row's reward function, in [0, 1].

    ``extra_info["reward_fn"]`` names the reward (written at export); ``extra_info["question"]`` is
    passed as ``prompt`` for the echo check. Raises ``KeyError`` naming the data source if the row
    carries no reward name (a parquet file not written by ``prepare_datasets``).
    """
    from runners.data.rewards import compute_reward

    info = extra_info or {}
    name = info.get("reward_fn")
    if not name:
        raise KeyError(
            f"verl row from data source {data_source!r} has no extra_info.reward_fn (not a trustbench export)"
        )
    return compute_reward(str(name), solution_str, str(ground_truth), prompt=info.get("question"))
