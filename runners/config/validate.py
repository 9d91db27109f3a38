"""Compose-time validation: every value checked before anything trains or is submitted.

Hydra already rejects unknown presets and mistyped keys of the option files; this module re-checks
each component node against its dataclass (catching ``+key=value`` additions), checks ranges and
cross-field rules (more in ``runners.config.validate_more``), and raises ``ConfigError`` naming the
offending key, e.g. ``config key 'objective.eps': must be > 0 (got -0.1)``.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from runners.algorithms.components import field_checks
from runners.config.errors import Checker, ConfigError
from runners.config.schema import LAUNCHERS, ROLLOUT_MODES, RolloutConfig, TrainerConfig
from runners.config.validate_more import check_more
from runners.paths import conf_options

DTYPES = ("float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
# seeds: the range Python's, numpy's (np.random.seed) and torch's generators all take whole
SEED_MAX = 2**32 - 1
# experiment names name directories under the trustbench home (artifacts, hydra, reports): a slug
EXPERIMENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
TOTAL_STEPS_MAX = 10_000_000
STEPS_WHY = "116 days at a step a second: a typo"
STEP_TOKEN_BYTES = 8 + 4 + 1  # a step holds per response token, any model: id (int64), log-prob (fp32), mask


def _check_plain_keys(cfg: DictConfig) -> None:
    """No key outside the root schema, and in each plain group (trainer, dataset, ...) none outside
    its dataclass: ``+trainer.typo=1`` is added by Hydra even in struct mode."""
    from runners.config.schema import TrustbenchConfig

    top = {f.name for f in dataclasses.fields(TrustbenchConfig)}
    unknown = sorted(set(cfg.keys()) - top - {"hydra"})
    if unknown:
        raise ConfigError(unknown[0], f"not a config key; top-level keys: {', '.join(sorted(top))}")
    for f in dataclasses.fields(TrustbenchConfig):
        schema, node = f.default_factory, cfg.get(f.name)
        if not (dataclasses.is_dataclass(schema) and isinstance(node, DictConfig)):
            continue  # the component groups are checked against their own schemas
        allowed = {g.name for g in dataclasses.fields(schema)}
        unknown = sorted(set(node.keys()) - allowed)
        if unknown:
            raise ConfigError(
                f"{f.name}.{unknown[0]}", f"not a key of {f.name}; valid keys: {', '.join(sorted(allowed))}"
            )


def _check_component_schemas(cfg: DictConfig) -> None:
    """Each component node: a registered name, only its schema's keys, its declared checks."""
    from runners.algorithms.method import GROUPS

    for group, registry in GROUPS.items():
        node = cfg.get(group)
        if node is None or not isinstance(node, DictConfig) or "name" not in node:
            raise ConfigError(group, f"missing; choose one of {', '.join(registry.names())}")
        name = node.name
        if name not in registry:
            raise ConfigError(f"{group}.name", f"unknown {group} {name!r}; valid names: {', '.join(registry.names())}")
        schema = registry.schema(name)
        if schema is None:  # a plugin's component without a schema: nothing to check against
            continue
        allowed = {f.name for f in dataclasses.fields(schema)}
        unknown = sorted(set(node.keys()) - allowed)
        if unknown:
            raise ConfigError(
                f"{group}.{unknown[0]}",
                f"not a parameter of {group} {name!r}; valid keys: {', '.join(sorted(allowed - {'name'}))}",
            )
        try:
            OmegaConf.merge(OmegaConf.structured(schema), node)
        except OmegaConfBaseException as err:
            key = getattr(err, "full_key", None) or getattr(err, "key", None) or "?"
            raise ConfigError(f"{group}.{key}", f"{err.msg if hasattr(err, 'msg') else err}") from None
        _check_fields(group, schema, node)


def _check_fields(group: str, schema: type, node: DictConfig) -> None:
    for key, check in field_checks(schema):
        value = node.get(key)
        if not check.holds(value):
            raise ConfigError(f"{group}.{key}", f"{check.what} (got {value!r})")
    cross = getattr(schema, "cross_checks", None)
    for key, ok, what in cross(node) if cross is not None else ():
        if not ok:
            raise ConfigError(f"{group}.{key}", f"{what} (got {node.get(key)!r})")


def _check_method(cfg: DictConfig):
    """What the components need from each other (e.g. ADAPO steers a clip objective) and agree on."""
    from runners.algorithms.method import CAPABILITIES, Method

    method = Method.from_config(cfg)
    for group, need in method.unmet():
        others = ", ".join(f"{g}={n}" for g, n in method.names().items() if g != group)
        raise ConfigError(
            f"{group}.name",
            f"{group} {getattr(method, group)!r} needs {need} ({CAPABILITIES[need]}); none of {others} provides it",
        )
    for key, first, second in method.trainer_key_conflicts():
        raise ConfigError(
            f"{second}.{key}",
            f"must equal {first}.{key} (both set the stored sparse distribution): "
            f"{method.trainer_kw[second][key]!r} vs {method.trainer_kw[first][key]!r}",
        )
    return method


def _check_rollout(c: Checker, cfg: DictConfig, method) -> None:
    from runners.algorithms import ESTIMATORS

    r = cfg.rollout
    c.one_of("rollout.mode", ROLLOUT_MODES)
    c.at_least("rollout.max_response_length", 1)
    c.at_least("rollout.max_prompt_length", 1)
    c.positive("rollout.temperature")
    c.require("rollout.top_p", lambda v: 0 < v <= 1, "must be in (0, 1]")
    c.non_negative("rollout.drop_last_k")
    c.non_negative("rollout.staleness")
    c.one_of("rollout.dtype", ("auto", *DTYPES))
    if r.mode != "truncated":
        if r.drop_last_k:
            raise ConfigError("rollout.drop_last_k", "only applies to rollout.mode=truncated")
        return
    c.require("rollout.window", lambda v: v is not None and v >= 1, "truncated rollouts need a window >= 1")
    c.require(
        "rollout.window",
        lambda v: v <= r.max_response_length,
        f"window longer than rollout.max_response_length={r.max_response_length}",
    )
    c.require("rollout.drop_last_k", lambda v: v < r.window, f"must be < rollout.window={r.window}")
    if "partial_responses" not in method.provided:
        able = ", ".join(n for n in ESTIMATORS.names() if "partial_responses" in ESTIMATORS.entry(n).provides)
        raise ConfigError(
            "rollout.mode",
            f"truncated rollouts leave responses unfinished and split prompt groups across steps; estimator "
            f"{method.estimator!r} cannot score them (use an estimator with a critic: {able})",
        )


def _check_trainer(c: Checker, cfg: DictConfig, method) -> None:
    t = cfg.trainer
    c.at_least("trainer.total_steps", 1)
    c.require("trainer.total_steps", lambda v: v <= TOTAL_STEPS_MAX, f"must be <= {TOTAL_STEPS_MAX:,} ({STEPS_WHY})")
    c.at_least("trainer.prompts_per_step", 1)
    c.at_least("trainer.n", 1)
    if method.requires("groups"):
        c.require(
            "trainer.n",
            lambda v: v >= 2,
            f"{', '.join(method.needing('groups'))} compare responses within a group: needs n >= 2",
        )
    c.at_least("trainer.ppo_epochs", 1)
    c.at_least("trainer.mini_batch_prompts", 1)
    c.require(
        "trainer.mini_batch_prompts",
        lambda v: t.prompts_per_step % v == 0,
        f"must divide trainer.prompts_per_step={t.prompts_per_step}",
    )
    c.non_negative("trainer.micro_batch_size", "trainer.weight_decay", "trainer.grad_clip", "trainer.warmup_steps")
    c.non_negative("trainer.kl_coef", "trainer.eval_every", "trainer.checkpoint_every")
    c.positive("trainer.lr", "trainer.critic_lr", "trainer.eval_temperature")
    c.positive("trainer.value_clip_low", "trainer.value_clip_high")
    for key in ("trainer.adam_beta1", "trainer.adam_beta2"):
        c.require(key, lambda v: 0 <= v < 1, "must be in [0, 1)")
    c.at_least("trainer.eval_n", 1)
    c.one_of("trainer.logprob_precision", ("fp32", "bf16"))
    c.require(
        "trainer.length_buckets",
        lambda v: len(v) >= 2 and all(a < b for a, b in zip(v, v[1:])),
        "must be an increasing list of at least two edges",
    )


def _check_model(c: Checker, cfg: DictConfig) -> None:
    from runners.models.loader import MODEL_KINDS, TINY_ARCHS
    from runners.models.options import option_keys

    m = cfg.model
    c.one_of("model.kind", MODEL_KINDS.names())
    c.one_of("model.dtype", DTYPES)
    needs = MODEL_KINDS.entry(m.kind).needs
    for key, takes in (("path", m.kind == "hub" or "path" in needs), ("arch", m.kind == "hub" or "arch" in needs)):
        if m.get(key) is not None and not takes:  # the loader refuses it (runners.models.loader.load_model)
            raise ConfigError(f"model.{key}", f"model.kind={m.kind} takes no {key} (got {m.get(key)!r})")
    if "path" in needs:
        c.require("model.path", lambda v: bool(v), f"model.kind={m.kind} needs a hub id or a local directory")
        if str(m.path).startswith(("/", "./", "../", "~")):
            c.require("model.path", lambda v: Path(v).expanduser().exists(), "local model directory does not exist")
    if "arch" in needs:
        c.one_of("model.arch", TINY_ARCHS)
    c.non_negative("model.params_b")
    if m.options:
        _check_options("model.options", m.options, option_keys(m.kind, m.get("arch")), f"model kind {m.kind!r}")


def _check_options(key: str, options, valid, owner: str) -> None:
    """Every key of the ``options`` node is one of ``valid`` (None: not checked)."""
    unknown = sorted(set(options or {}) - set(valid)) if valid is not None else []
    if unknown:
        raise ConfigError(
            f"{key}.{unknown[0]}", f"not an option of {owner}; valid options: {', '.join(sorted(valid)) or '(none)'}"
        )


def _check_dataset(c: Checker, cfg: DictConfig) -> None:
    from runners.data.datasets import PRESETS

    d = cfg.dataset
    c.one_of("dataset.name", sorted(PRESETS))
    if d.eval_name is not None:
        c.one_of("dataset.eval_name", sorted(PRESETS))
    c.require(
        "dataset.extra_eval",
        lambda v: all(x in PRESETS for x in v),
        f"every entry must be one of {', '.join(sorted(PRESETS))}",
    )
    for name in {d.name, d.eval_name or d.name}:
        _check_options("dataset.options", d.options, PRESETS[name].options, f"dataset preset {name!r}")
    _check_dataset_files(c, cfg)
    for key in ("train_limit", "eval_limit"):
        if d.get(key) is not None:
            c.at_least(f"dataset.{key}", 1)
    if d.reward is not None:
        from runners.data.rewards import REWARDS

        c.one_of("dataset.reward", REWARDS.names())


def _check_dataset_files(c: Checker, cfg: DictConfig) -> None:
    """Each local dataset file is read as the run will read it (cached per file version): an empty,
    malformed or unreadable file, or rows without the preset's fields, fail here naming the file."""
    from runners.data.datasets import DatasetError, check_source

    d = cfg.dataset
    options = OmegaConf.to_container(d.options, resolve=True) if d.options else {}
    for key, preset, split in (("path", d.name, d.train_split), ("eval_path", d.eval_name or d.name, d.eval_split)):
        if not d.get(key):
            continue
        c.require(f"dataset.{key}", lambda v: Path(v).expanduser().is_file(), "dataset file not found")
        try:
            check_source(preset, split=split, path=d.get(key), **options)
        except DatasetError as err:
            raise ConfigError(f"dataset.{key}", str(err)) from None


def _check_infrastructure(c: Checker, cfg: DictConfig) -> None:
    # the backend group's options (each registered in runners.backends.BACKENDS: tests/test_registry.py);
    # read from the conf tree so that the config layer never imports the backends above it
    c.one_of("backend.name", conf_options("backend"))
    c.one_of("backend.device", DEVICES)
    c.non_negative("backend.num_threads")
    c.one_of("tracking.kind", ("sqlite", "server"))
    c.require("tracking.port", lambda v: 0 < v < 65536, "must be a TCP port")
    c.positive("tracking.flush_every_s")
    c.one_of("launcher.name", LAUNCHERS)
    c.non_negative("launcher.max_requeues")
    c.at_least("launcher.time_min", 1)
    c.at_least("launcher.parallel", 1)
    c.non_negative("debug.step_delay_s")
    for key in ("debug.delay_steps_below", "debug.fail_at_step"):
        if c.get(key) is not None:
            c.non_negative(key)


def _check_experiment(name: Any) -> None:
    """A slug: it names directories under the trustbench home, so no "/", "..", or absolute path."""
    if not isinstance(name, str) or not name:
        raise ConfigError("experiment", f"must be a non-empty name (got {name!r})")
    if not EXPERIMENT_NAME.fullmatch(name):
        shown = repr(name) if len(name) <= 100 else f"{len(name)} characters, {name[:40]!r}..."
        raise ConfigError(
            "experiment",
            "must be 1-100 characters, letters, digits, '.', '_' or '-', starting with a letter or a digit "
            f"(it names directories under the trustbench home) (got {shown})",
        )


def step_memory(cfg: Any) -> tuple[int, int]:
    """(bytes, limit): a lower bound of a step's memory at full-length responses, and the memory it runs in (this
    machine's; ``launcher=slurm``: ``launcher.mem_gb``). A response holds ``STEP_TOKEN_BYTES`` a token; with the
    embedded model (shape known unloaded) a forward keeps, per token of its micro-batch (one response on verl),
    each layer's residual stream and the logits (hidden x layers + vocab)."""
    t, r, m = cfg["trainer"], cfg["rollout"], cfg["model"]
    tokens = int(r["max_prompt_length"]) + int(r["max_response_length"])
    need = int(t["prompts_per_step"]) * int(t["n"]) * tokens * STEP_TOKEN_BYTES
    if m["kind"] == "embedded":
        from runners.data.embedded import EMBEDDED_ALPHABET
        from runners.models.embedded import EmbeddedRecipe as R

        o = m.get("options") or {}
        width = int(o.get("hidden_size", R.hidden_size)) * int(o.get("num_hidden_layers", R.num_hidden_layers))
        rows = int(t["micro_batch_size"]) or int(t["mini_batch_prompts"]) * int(t["n"])
        rows = rows if cfg["backend"]["name"] == "local" else 1
        need += rows * tokens * (4 if m["dtype"] == "float32" else 2) * (width + len(EMBEDDED_ALPHABET))
    if cfg["launcher"]["name"] == "slurm":
        from runners.config.resources import cell_resources

        return need, cell_resources(cfg)["mem_gb"] * 2**30
    return need, os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _check_step_memory(cfg: DictConfig) -> None:
    """Refuse a step that cannot fit, naming the size furthest above its default (``runners.config.schema``)."""
    need, limit = step_memory(cfg)
    if need > limit:
        default = {"rollout": RolloutConfig, "trainer": TrainerConfig}  # the sizes' defaults, written once
        sizes = ("rollout.max_response_length", "rollout.max_prompt_length", "trainer.prompts_per_step", "trainer.n")
        key = max(sizes, key=lambda k: OmegaConf.select(cfg, k) / getattr(default[k.split(".")[0]], k.split(".")[1]))
        t, r, where = cfg.trainer, cfg.rollout, "launcher.mem_gb" if cfg.launcher.name == "slurm" else "this machine"
        shape = f"{t.prompts_per_step} prompts x {t.n} responses of {r.max_prompt_length}+{r.max_response_length}"
        big = f"{need / 2**30:,.1f} GiB ({shape} tokens), more than the {limit / 2**30:,.1f} GiB of {where}"
        raise ConfigError(key, f"a training step needs at least {big} (got {OmegaConf.select(cfg, key)!r})")


def check_seed(cfg: DictConfig) -> None:
    """``seed`` in [0, SEED_MAX]. Not part of ``validate``, which never reads the seed: the sweep
    planner validates cells that differ only in it once (``runners.config.grid``) and checks each
    cell's seed with this; ``runners.run.run`` calls both."""
    Checker(cfg).require(
        "seed",
        lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= SEED_MAX,
        f"must be an integer in [0, {SEED_MAX}] (2**32 - 1, the largest seed numpy takes)",
    )


def validate(cfg: DictConfig) -> None:
    """Raise ``ConfigError`` (naming the key) if ``cfg`` cannot run; return None otherwise."""
    try:
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "?"
        raise ConfigError(str(key), "is missing or cannot be resolved") from None
    _check_plain_keys(cfg)
    _check_component_schemas(cfg)
    method = _check_method(cfg)
    checker = Checker(cfg)
    _check_experiment(cfg.experiment)
    _check_rollout(checker, cfg, method)
    _check_trainer(checker, cfg, method)
    _check_model(checker, cfg)
    _check_dataset(checker, cfg)
    _check_infrastructure(checker, cfg)
    check_more(cfg)
    _check_step_memory(cfg)
