"""A cell's method (runners/algorithms/method.py): ``Method.from_params`` splits each group's parameters
into the component's keyword arguments and the trainer-owned keys its registry line declares, drops the
config node's ``name``, accepts plain dicts, OmegaConf nodes and None, passes ``norm_len`` / ``kl_coef``
through, and rejects unknown arguments and names; ``needs`` / ``provided`` / ``requires`` read the
registry declarations (TROLL needs the current logits and the sparse old distribution, TROLL section
3.2; GAE needs a critic and scores unfinished responses; the group-relative estimators need groups).

Written for mutation testing (``make mutation``). Expected values are written out here.

Run: ``pytest tests/algorithms/test_method_mutants.py``.
"""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from runners.algorithms.method import Method
from runners.registry import UnknownNameError

DEFAULT_NAMES = {
    "estimator": "grpo",
    "objective": "clip",
    "mask": "none",
    "entropy_control": "none",
    "loss_agg": "token-mean",
    "rollout_correction": "none",
}


def test_from_params_without_arguments_is_the_default_method():
    method = Method.from_params()
    assert method == Method()
    assert method.names() == DEFAULT_NAMES
    assert method.estimator_kw == {} and method.objective_kw == {} and method.mask_kw == {}
    assert method.entropy_control_kw == {} and method.rollout_correction_kw == {}
    assert method.trainer_kw == {} and method.norm_len is None and method.kl_coef == 0.0


def test_from_params_splits_trainer_keys_and_drops_the_name():
    method = Method.from_params(
        estimator="gae",
        estimator_params={"name": "gae", "gamma": 0.99, "lam": 0.95},
        objective="troll",
        objective_params={"name": "troll", "top_k": 16, "tail_mass": 1e-4, "p_default": 1e-10},
        mask="trm_max",
        mask_params={"name": "trm_max", "delta": 0.1, "top_k": 16},
        entropy_control="bonus",
        entropy_control_params={"name": "bonus", "coef": 0.01},
        loss_agg="seq-mean-token-sum-norm",
        loss_agg_params={"name": "seq-mean-token-sum-norm"},
        rollout_correction="token_tis",
        rollout_correction_params={"cap": 3.0},
        norm_len=512,
        kl_coef=0.01,
    )
    assert method == Method(
        estimator="gae",
        objective="troll",
        mask="trm_max",
        entropy_control="bonus",
        loss_agg="seq-mean-token-sum-norm",
        rollout_correction="token_tis",
        estimator_kw={"gamma": 0.99, "lam": 0.95},
        objective_kw={"p_default": 1e-10},
        mask_kw={"delta": 0.1},
        entropy_control_kw={"coef": 0.01},
        rollout_correction_kw={"cap": 3.0},
        trainer_kw={"objective": {"top_k": 16, "tail_mass": 1e-4}, "mask": {"top_k": 16}},
        norm_len=512,
        kl_coef=0.01,
    )
    assert method.names() == {
        "estimator": "gae",
        "objective": "troll",
        "mask": "trm_max",
        "entropy_control": "bonus",
        "loss_agg": "seq-mean-token-sum-norm",
        "rollout_correction": "token_tis",
    }


def test_from_params_without_the_declared_trainer_keys():
    method = Method.from_params(objective="troll", objective_params={"p_default": 1e-10}, mask="trm_max")
    assert method.trainer_kw == {}
    assert method.objective_kw == {"p_default": 1e-10}
    assert method.mask_kw == {}


def test_from_params_reads_omegaconf_nodes():
    node = OmegaConf.create({"name": "clip", "clip_ratio_low": 0.1, "clip_ratio_high": "${.clip_ratio_low}"})
    method = Method.from_params(objective="clip", objective_params=node)
    assert method.objective_kw == {"clip_ratio_low": 0.1, "clip_ratio_high": 0.1}
    assert type(method.objective_kw) is dict


def test_from_params_rejects_unknown_arguments_and_names():
    with pytest.raises(TypeError, match=r"^Method.from_params got unknown arguments \['bogus', 'mask_param'\]$"):
        Method.from_params(mask_param={}, bogus=1, norm_len=8, kl_coef=0.1)
    with pytest.raises(UnknownNameError, match=r"^unknown mask 'nope'; valid names: .*trm_max"):
        Method.from_params(mask="nope")
    with pytest.raises(UnknownNameError, match=r"^unknown estimator 'nope'; valid names: .*grpo"):
        Method(estimator="nope")


def test_needs_provided_and_requires_read_the_declarations():
    method = Method(estimator="gae", objective="troll", rollout_correction="token_tis")
    assert method.needs == frozenset({"critic", "logits", "sparse_old", "rollout_logp"})
    assert method.provided == frozenset({"partial_responses"})
    assert method.requires("logits") and method.requires("critic") and method.requires("rollout_logp")
    assert not method.requires("groups") and not method.requires("grad_entropy")
    default = Method()
    assert default.needs == frozenset({"groups"}) and default.provided == frozenset({"token_clip"})
    assert default.requires("groups") and not default.requires("logits")
    with pytest.raises(KeyError, match="unknown capability 'bogus'"):
        default.requires("bogus")
