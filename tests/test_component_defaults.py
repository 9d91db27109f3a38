"""Each component default and check has one home: the schema, the function, the YAML and the registry agree.

(a) every schema field's default equals the registered function's (or class's) signature default;
(b) every value an option's conf YAML sets is the schema default or a listed, deliberate preset value;
(c) the objectives check their arguments with their schema's rules (``runners.checks.check_arguments``),
    so the values the copies disagreed on get one verdict from the config and from the function.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
from omegaconf import OmegaConf

from runners.algorithms import REGISTRIES
from runners.algorithms.components import TrollObjective
from runners.algorithms.method import SPARSE_DEFAULTS
from runners.algorithms.types import PolicyInputs
from runners.config import CONF_DIR

GROUPS = ("estimator", "objective", "mask", "entropy_control", "loss_agg", "rollout_correction")
COMPANIONS = {("entropy_control", "adapo"): ["algorithm=dapo"]}
# option values that differ from the schema default on purpose (presets of the same entry)
DELIBERATE = {
    ("objective", "dapo_clip", "clip_ratio_high"): 0.28,
    ("objective", "dual_clip", "clip_ratio_c"): 3.0,
    ("objective", "troll_seq", "sequence"): True,
}


def entries(group):
    registry = REGISTRIES[group]
    return [(group, name) for name in registry.names() if registry.schema(name) is not None]


ALL = [e for g in GROUPS for e in entries(g)]


def fields(group, name):
    registry = REGISTRIES[group]
    trainer = set(registry.entry(name).trainer_keys)
    return [f for f in dataclasses.fields(registry.schema(name)) if f.name != "name" and f.name not in trainer]


@pytest.mark.parametrize("group,name", ALL, ids=[f"{g}.{n}" for g, n in ALL])
def test_schema_defaults_equal_the_signature_defaults(group, name):
    params = inspect.signature(REGISTRIES[group].get(name)).parameters
    differ = {
        f.name: (f.default, params[f.name].default)
        for f in fields(group, name)
        if f.name in params
        and params[f.name].default is not inspect.Parameter.empty
        and f.default != params[f.name].default
    }
    assert differ == {}, differ


def test_sparse_defaults_equal_the_schemas():
    defaults = {f.name: f.default for f in dataclasses.fields(TrollObjective)}
    assert SPARSE_DEFAULTS == {key: defaults[key] for key in SPARSE_DEFAULTS}
    for name in REGISTRIES["mask"].with_need("sparse_old"):
        schema = {f.name: f.default for f in dataclasses.fields(REGISTRIES["mask"].schema(name))}
        assert (schema["top_k"], schema["tail_mass"]) == (SPARSE_DEFAULTS["top_k"], SPARSE_DEFAULTS["tail_mass"])


def yaml_options():
    for group in GROUPS:
        for path in sorted((CONF_DIR / group).glob("*.yaml")):
            yield group, path.stem, OmegaConf.to_container(OmegaConf.load(path))


def test_option_yaml_values_are_schema_defaults_or_deliberate():
    other = {}
    for group, option, node in yaml_options():
        schema = REGISTRIES[group].schema(node["name"])
        defaults = {f.name: f.default for f in dataclasses.fields(schema)} if schema else {}
        for key, value in node.items():
            if key in ("name", "defaults"):
                continue
            if key not in defaults or value != defaults[key]:
                other[(group, option, key)] = value
    assert other == DELIBERATE


def _inputs(group):
    """A small valid input of an objective or a sample-based mask: 4 sequences of 3 tokens, advantages of
    both signs, the old log-probs near the new ones."""
    g = torch.Generator().manual_seed(0)
    b, t = 4, 3
    logp = torch.log(torch.rand(b, t, generator=g) * 0.8 + 0.1)
    old_logp = logp + 0.05 * torch.randn(b, t, generator=g)
    return (PolicyInputs(
        logp=logp, old_logp=old_logp, advantages=torch.tensor([1.0, -1, 0.5, -0.5]).unsqueeze(-1).expand(b, t),
        response_mask=torch.ones(b, t), rollout_logp=old_logp,
    ),)  # fmt: skip


# -- (c) one rule per check ----------------------------------------------------------------------------
def test_check_arguments_applies_a_schemas_field_and_cross_field_rules():
    """The helper the objectives call refuses what the schema's checks refuse, naming the parameter."""
    from runners.algorithms.components import BapoObjective, ClipObjective
    from runners.checks import check_arguments

    check_arguments("objective 'clip':", ClipObjective, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    for key, bad in (
        ("clip_ratio_low", 0.0),
        ("clip_ratio_low", 1.0),
        ("clip_ratio_high", -0.1),
        ("clip_ratio_c", 1.0),
    ):
        with pytest.raises(ValueError, match=rf"objective 'clip': {key} .*\(got {bad!r}\)"):
            check_arguments("objective 'clip':", ClipObjective, **{key: bad})
    with pytest.raises(ValueError, match="ratio_low_max"):  # a cross-field rule: start <= max
        check_arguments("objective 'bapo':", BapoObjective, ratio_low_start=0.5, ratio_low_max=0.4)


def test_the_config_and_the_functions_refuse_the_same_boundary_values():
    """Values the copies disagreed on before: the composed config and the function now give one verdict."""
    from runners.algorithms.objectives import bapo_objective, clip_objective
    from runners.algorithms.trm import trm_max_k2_mask
    from runners.config import ConfigError, compose

    (inp,) = _inputs("objective")
    for override, call in (
        ("objective.clip_ratio_low=0", lambda: clip_objective(inp, clip_ratio_low=0.0)),
        ("objective.clip_ratio_high=0", lambda: clip_objective(inp, clip_ratio_high=0.0)),
    ):
        with pytest.raises(ConfigError):
            compose(["objective=clip", override])
        with pytest.raises(ValueError):
            call()
    with pytest.raises(ConfigError):
        compose(["objective=bapo", "objective.rho=1.0"])
    with pytest.raises(ValueError):
        bapo_objective(inp, rho=1.0)
    # a TRM threshold is inclusive: 0 keeps only divergence-free sequences, in the config and in the function
    compose(["mask=trm_max_k2", "mask.delta=0"])
    assert trm_max_k2_mask(inp, delta=0.0, monitor=False).seq_mask.shape == (4,)
    with pytest.raises(ConfigError):
        compose(["mask=trm_max_k2", "mask.delta=-0.1"])
    with pytest.raises(ValueError, match="must be >= 0"):
        trm_max_k2_mask(inp, delta=-0.1, monitor=False)
