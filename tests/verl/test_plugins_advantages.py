"""Advantage-estimator plugins through verl's registry and verl's own dispatcher, against the library.

- every ``trustbench_<name>``, called as verl's ``compute_advantage`` calls a registered estimator
  (``token_level_rewards``, ``response_mask``, ``config`` = the ``algorithm`` node, ``index`` = uid
  strings), equals ``runners.algorithms.ESTIMATORS[name]`` with integer group ids and the params of
  ``algorithm.trustbench_estimator``; GAE/EGAE with critic values (EGAE's bootstrap on unfinished rows);
- verl's trainer-side dispatcher ``compute_advantage(DataProto, ...)`` reaches the plugins;
- verl's built-in estimators looked up by name (grpo / Dr.GRPO, rloo, reinforce_plus_plus(_baseline),
  gpg) equal the plugin of the same method (tests/algorithms compares the functions themselves).

Run: ``pytest tests/verl/test_plugins_advantages.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from runners.algorithms import ESTIMATORS
from runners.algorithms.types import AdvantageInputs

from ..algorithms._ref_batches import outcome_batch

pytestmark = pytest.mark.verl
core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")

PARAMS = {
    "grpo": {"std_eps": 1e-4, "norm_by_std": True},
    "drgrpo": {},
    "rloo": {},
    "loop": {},
    "rfpp": {"gamma": 0.9, "center": False},
    "rfpp_baseline": {},
    "gpg": {"rescale": "groups", "f_norm": 2.0},
    "gae": {"gamma": 0.95, "lam": 0.9, "whiten": True},
    "egae": {"gamma": 1.0, "lam": 0.95, "whiten": False},
}


def _algorithm(params: dict, **extra):
    from runners.backends.verl import ESTIMATOR_PARAMS_KEY

    return OmegaConf.create({ESTIMATOR_PARAMS_KEY: params, "gamma": 1.0, "lam": 1.0, **extra})


def _values(mask: torch.Tensor, seed: int) -> torch.Tensor:
    return torch.randn(mask.shape, generator=torch.Generator().manual_seed(seed)) * mask


@pytest.mark.parametrize("name", sorted(PARAMS))
@pytest.mark.parametrize("seed", [0, 1])
def test_plugin_equals_library_estimator(name, seed):
    from runners.backends.verl.plugins import register  # noqa: F401

    rewards, mask, groups, uids = outcome_batch(seed)
    params = PARAMS[name]
    values = _values(mask, seed) if name in {"gae", "egae"} else None
    finished = torch.arange(mask.shape[0]) % 3 != 0 if name == "egae" else None  # some rows cut at the window
    adv, ret = core_algos.get_adv_estimator_fn(f"trustbench_{name}")(
        token_level_rewards=rewards,
        response_mask=mask,
        config=_algorithm(params),
        index=uids,
        values=values,
        finished=finished,
    )
    ref_adv, ref_ret = ESTIMATORS.get(name)(
        AdvantageInputs(rewards, mask, group_index=groups, values=values, finished=finished), **params
    )
    torch.testing.assert_close(adv, ref_adv)
    torch.testing.assert_close(ret, ref_ret)
    assert adv.abs().sum() > 0


def test_egae_unfinished_rows_bootstrap_and_default_finished():
    """EGAE differs from GAE exactly on unfinished rows; without ``finished`` every row is finished."""
    rewards, mask, groups, uids = outcome_batch(2)
    values = _values(mask, 2)
    egae = core_algos.get_adv_estimator_fn("trustbench_egae")
    gae = core_algos.get_adv_estimator_fn("trustbench_gae")
    cfg = _algorithm({"gamma": 1.0, "lam": 0.95, "whiten": False})
    finished = torch.arange(mask.shape[0]) % 2 == 0
    cut, _ = egae(
        token_level_rewards=rewards, response_mask=mask, config=cfg, index=uids, values=values, finished=finished
    )
    plain, _ = gae(token_level_rewards=rewards, response_mask=mask, config=cfg, index=uids, values=values)
    default, _ = egae(token_level_rewards=rewards, response_mask=mask, config=cfg, index=uids, values=values)
    torch.testing.assert_close(default, plain)
    torch.testing.assert_close(cut[finished], plain[finished])
    assert not torch.allclose(cut[~finished], plain[~finished])
    with pytest.raises(ValueError, match="critic.enable=true"):
        egae(token_level_rewards=rewards, response_mask=mask, config=cfg, index=uids)


@pytest.mark.parametrize("name", ["grpo", "rloo", "gpg", "rfpp_baseline"])
def test_verl_dispatcher_reaches_plugins(name):
    """verl's trainer-side ``compute_advantage`` (DataProto with uid strings) calls the plugin."""
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    rewards, mask, groups, uids = outcome_batch(4)
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask}, non_tensors={"uid": uids}
    )
    out = compute_advantage(data, adv_estimator=f"trustbench_{name}", config=_algorithm(PARAMS[name]))
    ref, _ = ESTIMATORS.get(name)(AdvantageInputs(rewards, mask, group_index=groups), **PARAMS[name])
    torch.testing.assert_close(out.batch["advantages"], ref)


@pytest.mark.parametrize(
    ("verl_name", "plugin", "kwargs"),
    [
        ("grpo", "grpo", {"norm_adv_by_std_in_grpo": True}),
        ("grpo", "drgrpo", {"norm_adv_by_std_in_grpo": False}),
        ("rloo", "rloo", {}),
        ("reinforce_plus_plus", "rfpp", {}),
        ("reinforce_plus_plus_baseline", "rfpp_baseline", {}),
        ("gpg", "gpg", {}),
    ],
)
def test_verl_builtin_estimators_equal_plugins_through_registry(verl_name, plugin, kwargs):
    rewards, mask, groups, uids = outcome_batch(6, binary=True)
    cfg = _algorithm({}, gamma=1.0)
    ref, _ = core_algos.get_adv_estimator_fn(verl_name)(
        token_level_rewards=rewards, response_mask=mask, index=uids, config=cfg, **kwargs
    )
    ours, _ = core_algos.get_adv_estimator_fn(f"trustbench_{plugin}")(
        token_level_rewards=rewards, response_mask=mask, index=uids, config=cfg
    )
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    assert np.isfinite(ours.numpy()).all()


def test_estimator_params_must_be_a_mapping():
    from runners.backends.verl.plugins.advantages import estimator_params

    assert estimator_params(None) == {}
    assert estimator_params(_algorithm({"eps": 0.1})) == {"eps": 0.1}
    with pytest.raises(TypeError, match="trustbench_estimator"):
        estimator_params(OmegaConf.create({"trustbench_estimator": [1, 2]}))
