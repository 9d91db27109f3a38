"""The training and evaluation examples of a cell, the same for every backend.

``dataset.name`` / ``dataset.path`` give the training split; evaluation uses ``dataset.eval_name``
(default: the training preset) and its ``eval_split`` / ``eval_path``, plus every preset listed in
``dataset.extra_eval`` (their ``test`` split), each capped at ``dataset.eval_limit``. Metrics are
reported per data source (``val-core/<data_source>/...``), so one run evaluates on several
benchmarks (TROLL's Math-Eval suite: ``dataset.extra_eval=[math500,amc23,aime24,...]``).
``dataset.reward`` overrides every example's reward function.

A dataset that cannot be used as configured (``DatasetError``: an empty or malformed file, an
unknown option or split) is a ``ConfigError`` naming the key to change (``dataset.path``,
``dataset.eval_path``, ``dataset.options``, ...), so the run ends as a configuration mistake, not
as a crash; ``runners.config.validate`` reads local files the same way before anything starts.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from omegaconf import DictConfig, OmegaConf

from runners.checks import ConfigError
from runners.data.datasets import DatasetError, load_examples


def _options(cfg: DictConfig) -> dict[str, Any]:
    return OmegaConf.to_container(cfg.dataset.options, resolve=True)  # type: ignore[return-value]


def _with_reward(cfg: DictConfig, examples: list) -> list:
    reward = cfg.dataset.reward
    return [dataclasses.replace(e, reward_fn=str(reward)) for e in examples] if reward else examples


def _load(key: str, preset: str, **kwargs: Any) -> list:
    try:
        return load_examples(preset, **kwargs)
    except DatasetError as err:
        raise ConfigError(key, str(err)) from None


def train_examples(cfg: DictConfig) -> list:
    d = cfg.dataset
    key = "dataset.path" if d.path else "dataset.name"
    examples = _load(key, d.name, split=d.train_split, path=d.path, limit=d.train_limit, seed=cfg.seed, **_options(cfg))
    return _with_reward(cfg, examples)


def eval_examples(cfg: DictConfig) -> list:
    d = cfg.dataset
    key = "dataset.eval_path" if d.eval_path else "dataset.eval_name" if d.eval_name else "dataset.name"
    examples = _load(
        key,
        d.eval_name or d.name,
        split=d.eval_split,
        path=d.eval_path,
        limit=d.eval_limit,
        seed=cfg.seed,
        **_options(cfg),
    )
    for name in d.extra_eval:
        examples += _load("dataset.extra_eval", str(name), split="test", limit=d.eval_limit, seed=cfg.seed)
    return _with_reward(cfg, examples)
