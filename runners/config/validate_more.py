"""More compose-time checks, called by ``runners.config.validate.validate`` (then the step-memory bound).

Each names the offending key (``ConfigError``) for a value that would otherwise surface only once the
cell runs (a FAILED run, or a traceback):

- the tracking store (``tracking.uri``, else ``$MLFLOW_TRACKING_URI``): a scheme MLflow opens
  (``runners.paths.tracking_uri_problem``), and a server's ``tracking.host``;
- the Slurm request's sizes (``launcher.*``): whole, positive numbers;
- ``trainer.length_buckets``: integer token counts;
- ``dataset.train_split`` / ``dataset.eval_split``: splits the preset has (``runners.data.datasets``), and
  a generated dataset's options (``dataset.options``: the generator's own checks);
- the embedded model's recipe (``model.options`` of ``model.kind=embedded``): each field's type and range;
- ``rollout.max_prompt_length + rollout.max_response_length`` within the model's context length
  (``context_length``: a local ``model.path``'s ``config.json``, else ``model.context_length``, else the
  tiny architectures' positions).

The sweep file itself (text, a ``@package _global_`` mapping, axes with values) is checked by
``check_sweep_file`` before Hydra reads it.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from runners.config.errors import Checker, ConfigError

# embedded recipe fields (runners.models.embedded.EmbeddedRecipe) -> (what, rule)
_WHOLE = ("a whole number >= 1", lambda v: _is_int(v) and v >= 1)
_WHOLE0 = ("a whole number >= 0", lambda v: _is_int(v) and v >= 0)
_SHARE = ("a number in [0, 1]", lambda v: _is_num(v) and 0 <= v <= 1)
_RECIPE_RULES: dict[str, tuple[str, Any]] = {
    **dict.fromkeys(
        ("digits", "n_train", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads"), _WHOLE
    ),
    **dict.fromkeys(("intermediate_size", "steps", "batch_size"), _WHOLE),
    **dict.fromkeys(("long_digits", "seed"), _WHOLE0),
    **dict.fromkeys(("long_fraction", "warmup_ratio", "min_lr_ratio"), _SHARE),
    "label_smoothing": ("a number in [0, 1)", lambda v: _is_num(v) and 0 <= v < 1),
    "lr": ("a number > 0", lambda v: _is_num(v) and v > 0),
    "weight_decay": ("a number >= 0", lambda v: _is_num(v) and v >= 0),
    "grad_clip": ("a number >= 0", lambda v: _is_num(v) and v >= 0),
    "ops": ("a non-empty string of the operators + - *", lambda v: isinstance(v, str) and v and set(v) <= set("+-*")),
}
# Slurm request sizes (runners.config.resources.cell_resources): None = derived from the model and backend
_LAUNCHER_SIZES = {"nodes": 1, "gpus_per_node": 0, "cpus_per_task": 1, "mem_gb": 1}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_more(cfg: DictConfig) -> None:
    """Raise ``ConfigError`` naming the key for any of the mistakes of the module docstring (``validate`` then
    checks that a training step fits in memory, ``validate._check_step_memory``, which reads the recipe's sizes)."""
    c = Checker(cfg)
    _check_tracking(c, cfg)
    for key, low in _LAUNCHER_SIZES.items():
        if c.get(f"launcher.{key}") is not None:
            c.require(f"launcher.{key}", lambda v, low=low: _is_int(v) and v >= low, f"must be a whole number >= {low}")
    c.at_least("launcher.cpus_per_gpu", 1)
    c.at_least("launcher.array_parallelism", 1)
    c.non_negative("launcher.signal_delay_s")
    c.require(
        "trainer.length_buckets",
        lambda v: all(_is_int(x) and x >= 0 for x in v),
        "every edge must be a whole number of tokens >= 0",
    )
    _check_splits(cfg)
    _check_generated_data(cfg)
    if cfg.model.kind == "embedded" and cfg.model.options:
        _check_recipe(cfg.model.options)
    _check_context(c, cfg)


def context_length(model: DictConfig) -> tuple[int | None, str]:
    """(the longest prompt + response ``model`` takes, where that number comes from); (None, "") unknown."""
    from runners.models.loader import TINY_CONTEXT

    if model.get("path"):
        config = Path(os.path.expanduser(str(model.path))) / "config.json"
        try:
            n = json.loads(config.read_text()).get("max_position_embeddings") if config.is_file() else None
        except (OSError, ValueError, AttributeError):
            n = None
        if _is_int(n) and n > 0:
            return n, f"max_position_embeddings in {config}"
    if model.get("context_length") is not None:
        return int(model.context_length), f"model.context_length of the preset {model.name!r}"
    if model.kind in ("tiny", "embedded"):
        overrides = dict(model.get("options") or {})
        n = overrides.get("max_position_embeddings", TINY_CONTEXT)
        return (n, f"the {model.kind} model's max_position_embeddings") if _is_int(n) else (None, "")
    return None, ""


def _check_context(c: Checker, cfg: DictConfig) -> None:
    """A prompt and response longer than the model's positions: no error from the model, only garbage."""
    c.require(
        "model.context_length", lambda v: v is None or (_is_int(v) and v >= 1), "must be a whole number >= 1 or null"
    )
    limit, source = context_length(cfg.model)
    r = cfg.rollout
    if limit is None or not (_is_int(r.max_prompt_length) and _is_int(r.max_response_length)):
        return
    total = r.max_prompt_length + r.max_response_length
    if total > limit:
        # the key to change: the prompt's when it alone leaves no room for a response
        raise ConfigError(
            "rollout.max_prompt_length" if r.max_prompt_length >= limit else "rollout.max_response_length",
            f"rollout.max_prompt_length + rollout.max_response_length = {r.max_prompt_length} + "
            f"{r.max_response_length} = {total} tokens, beyond the {limit} of model {cfg.model.name!r} ({source})",
        )


def _check_tracking(c: Checker, cfg: DictConfig) -> None:
    from runners.paths import tracking_uri_problem

    uri, key = cfg.tracking.uri, "tracking.uri"
    if not uri:
        uri, key = os.environ.get("MLFLOW_TRACKING_URI"), "MLFLOW_TRACKING_URI"
    problem = tracking_uri_problem(str(uri)) if uri else None
    if problem:
        raise ConfigError(key, f"{problem} (got {str(uri)!r})")
    if cfg.tracking.kind == "server" and not uri:  # the server trustbench starts or reaches at host:port
        c.require(
            "tracking.host",
            lambda v: isinstance(v, str) and v.strip() == v and v and not set(v) & set("/ "),
            "must be a host name or address (e.g. 127.0.0.1)",
        )


def _check_splits(cfg: DictConfig) -> None:
    from runners.data.datasets import PRESETS, DatasetError, _canonical_split

    d = cfg.dataset
    for key, name in (("train_split", d.name), ("eval_split", d.eval_name or d.name)):
        try:
            _canonical_split(PRESETS[name], str(d.get(key)))
        except DatasetError as err:
            raise ConfigError(f"dataset.{key}", str(err)) from None


def _check_generated_data(cfg: DictConfig) -> None:
    """A generated dataset (``embedded``, without a file) with its options: the generator's own checks, on
    zero examples (``runners.data.embedded.generate_embedded`` names the knob)."""
    from omegaconf import OmegaConf

    from runners.data.datasets import PRESETS, _generate

    d = cfg.dataset
    options = OmegaConf.to_container(d.options, resolve=True) if d.options else {}
    for split, name, path in (("train", d.name, d.path), ("test", d.eval_name or d.name, d.eval_path)):
        preset = PRESETS[name]
        if preset.hub_id is not None or path:
            continue
        merged = {**preset.options, **options}
        for key, default in preset.options.items():
            if _is_num(default) and not _is_num(merged[key]):
                raise ConfigError(f"dataset.options.{key}", f"must be a number (got {merged[key]!r})")
        try:
            _generate(preset, "train", 0, 0, merged)
        except (ValueError, TypeError) as err:
            words = str(err).split()
            knob = words[1] if len(words) > 1 and words[1] in merged else None
            raise ConfigError("dataset.options" + (f".{knob}" if knob else ""), str(err)) from None
        _check_generated_size(d, split, merged)


def _check_generated_size(d: DictConfig, split: str, opts: dict) -> None:
    """As many problems as the split holds at most (``runners.data.embedded.split_capacity``): asking for
    more would draw for ever before failing (``dataset.train_limit=1000000000`` did)."""
    from runners.data.embedded import split_capacity

    limit_key = "train_limit" if split == "train" else "eval_limit"
    limit = d.get(limit_key)
    key, n = (
        (f"dataset.{limit_key}", limit)
        if limit is not None
        else (f"dataset.options.{split}_size", opts.get(f"{split}_size"))
    )
    if not _is_int(n):
        return
    capacity = split_capacity(split, int(opts["digits"]), str(opts["ops"]), float(opts["test_fraction"]),
                              float(opts["long_fraction"]), int(opts["long_digits"]))  # fmt: skip
    if n > capacity:
        raise ConfigError(key, f"{n:,} problems asked; the generated {split} split holds {capacity:,} with "
                               f"digits={opts['digits']}, ops={opts['ops']!r}: raise dataset.options.digits or "
                               "ask for fewer")  # fmt: skip


def _check_recipe(options) -> None:
    from runners.models.loader import TINY_ARCHS

    for key, value in options.items():
        what, ok = _RECIPE_RULES.get(key, (None, None))
        if key == "arch":
            what, ok = f"one of {', '.join(TINY_ARCHS)}", lambda v: v in TINY_ARCHS
        if ok is not None and not ok(value):
            raise ConfigError(f"model.options.{key}", f"must be {what} (got {value!r})")
    merged = _recipe_values(options)
    heads, kv = merged["num_attention_heads"], merged["num_key_value_heads"]
    if merged["hidden_size"] % heads:
        raise ConfigError("model.options.hidden_size", f"must be a multiple of num_attention_heads={heads}")
    if heads % kv:
        raise ConfigError("model.options.num_key_value_heads", f"must divide num_attention_heads={heads} (got {kv})")


def _recipe_values(options) -> dict[str, Any]:
    from dataclasses import asdict

    from runners.models.embedded import EmbeddedRecipe

    return {**asdict(EmbeddedRecipe()), **options}


def check_sweep_file(path: Path) -> None:
    """A sweep file Hydra can read as one: UTF-8 text without NUL bytes, a ``# @package _global_`` mapping,
    ``hydra.sweeper.params`` (when given) a mapping whose every axis has values; ``ConfigError`` naming the
    file (and the axis) otherwise."""
    import yaml

    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        where = f"byte 0x{data[err.start]:02x} at offset {err.start}"
        raise ConfigError("sweep", f"sweep file {path} is not UTF-8 text ({where}); save it as UTF-8 YAML") from None
    if b"\0" in data:
        raise ConfigError("sweep", f"sweep file {path} is not text (a NUL byte at offset {data.index(0)})")
    with path.open(encoding="utf-8") as stream:  # a syntax error: messages.describe names the file and the line
        content = yaml.safe_load(stream)
    if content is None:
        raise ConfigError("sweep", f"sweep file {path} is empty: it needs '# @package _global_' and the sweep's keys")
    if not isinstance(content, dict):
        raise ConfigError(
            "sweep", f"sweep file {path} must be a mapping of config keys (got a {type(content).__name__})"
        )
    header = [line for line in _leading_comments(text) if "@package" in line]
    if not header or "_global_" not in header[0]:
        raise ConfigError("sweep", f"sweep file {path} must start with the line '# @package _global_'")
    hydra = content.get("hydra") if isinstance(content.get("hydra"), dict) else {}
    params = (hydra.get("sweeper") if isinstance(hydra.get("sweeper"), dict) else {}).get("params", {})
    if not isinstance(params, dict):
        raise ConfigError("hydra.sweeper.params", f"must map each axis to its values, in {path}")
    for axis, values in params.items():
        if values is None or (isinstance(values, str) and not values.strip()):
            raise ConfigError(f"hydra.sweeper.params.{axis}", f"axis has no values (e.g. 0,1,2) in {path}")


def _leading_comments(text: str) -> list[str]:
    """The comment lines above a YAML file's first key (where Hydra reads its ``@package`` directive)."""
    lines = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            break
        lines.append(line)
    return lines
