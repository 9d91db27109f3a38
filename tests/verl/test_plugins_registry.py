"""The plugin module as verl loads it, and the config route of the method parameters.

- a fresh Python process with only ``VERL_USE_EXTERNAL_MODULES`` set finds every trustbench policy
  loss, advantage estimator and the ``trustbench_sync`` trainer in verl's registries after
  ``import verl`` (verl's own loading mechanism, nothing imported by hand);
- ``import runners.backends.verl`` imports neither torch nor verl;
- ``plugin_overrides`` composed into verl's ``ppo_trainer.yaml`` with Hydra and built with verl's
  ``omega_conf_to_dataclass`` (what every worker does) yields ``TrustbenchPolicyLossConfig`` with
  the method parameters, resolved by ``loss_settings`` as the built-in trainer reads its nodes.

Run: ``pytest tests/verl/test_plugins_registry.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from runners.backends.verl import ADV_ESTIMATORS, LOSS_MODES, PLUGIN_MODULE, TRAINER_MODE, plugin_overrides

pytestmark = pytest.mark.verl
pytest.importorskip("verl")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_PROBE = """
import json, sys
import verl
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY
from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
print(json.dumps({
    "policy_loss": sorted(POLICY_LOSS_REGISTRY),
    "adv_estimator": sorted(ADV_ESTIMATOR_REGISTRY),
    "trainer": sorted(TRAINER_REGISTRY),
    "plugin_imported": "runners.backends.verl.plugins.register" in sys.modules,
}))
"""


def _run(code: str, **env) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_fresh_process_registers_everything_through_verl_env():
    found = json.loads(_run(_PROBE, VERL_USE_EXTERNAL_MODULES=PLUGIN_MODULE))
    assert found["plugin_imported"]
    assert set(LOSS_MODES) <= set(found["policy_loss"])
    assert set(ADV_ESTIMATORS) <= set(found["adv_estimator"])
    assert TRAINER_MODE in found["trainer"]
    # verl's built-ins are still there
    assert {"vanilla", "gspo", "gpg"} <= set(found["policy_loss"]) and "grpo" in found["adv_estimator"]


def test_package_import_is_light():
    out = _run(
        "import sys, runners.backends.verl as v; print(sorted(m for m in ('torch', 'verl') if m in sys.modules))"
    )
    assert out == "[]"


def _compose(overrides: list[str]):
    """verl's ppo_trainer config with ``overrides``; Hydra's global state is restored afterwards."""
    import verl
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    backup = get_gh_backup()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            return compose(
                "ppo_trainer",
                overrides=[
                    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                    "actor_rollout_ref.rollout.n=4",
                    *overrides,
                ],
            )
    finally:
        restore_gh_from_backup(backup)


def test_overrides_survive_hydra_and_omega_conf_to_dataclass():
    from verl.utils.config import omega_conf_to_dataclass

    from runners.backends.verl.plugins.advantages import estimator_params
    from runners.backends.verl.plugins.config import TrustbenchPolicyLossConfig, loss_settings

    overrides = plugin_overrides(
        objective="troll",
        objective_params={"eps": 0.05, "top_k": 32, "tail_mass": 1e-4, "sequence": True, "chunk_size": 512},
        mask="trm_max",
        mask_params={"delta": 0.05, "length_edges": [0, 64, 128]},
        entropy_control="repo_r",
        entropy_control_params={"zeta0": 0.001, "target": None},
        estimator="grpo",
        estimator_params={"eps": 1e-6, "norm_by_std": False},
    )
    cfg = _compose(overrides)
    assert cfg.trainer.v1.trainer_mode == TRAINER_MODE
    assert cfg.algorithm.adv_estimator == "trustbench_grpo"
    assert estimator_params(cfg.algorithm) == {"eps": 1e-6, "norm_by_std": False}
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    policy_loss = actor.policy_loss
    assert isinstance(policy_loss, TrustbenchPolicyLossConfig)
    assert policy_loss.loss_mode == "trustbench_troll_seq"
    assert policy_loss.mask_params == {"delta": 0.05, "length_edges": [0, 64, 128]}
    assert policy_loss.entropy_control_params == {"zeta0": 0.001, "target": None}
    settings = loss_settings(policy_loss)
    assert settings.objective == "troll" and settings.objective_kw == {"eps": 0.05, "chunk_size": 512, "sequence": True}
    assert settings.sparse == {"k": 32, "delta": 1e-4, "p_default": 1e-12, "chunk_size": 512}
    assert settings.needs_sparse_old and not settings.needs_grad_entropy
    # the same config through verl's DictConfig (the trainer process reads it undataclassed)
    assert loss_settings(cfg.actor_rollout_ref.actor.policy_loss) == settings


def test_invalid_names_are_named():
    with pytest.raises(ValueError, match="unknown mask 'trm'"):
        plugin_overrides(objective="clip", mask="trm")
    with pytest.raises(ValueError, match="unknown objective 'ppo'"):
        plugin_overrides(objective="ppo")
    with pytest.raises(ValueError, match="unknown estimator 'grpoo'"):
        plugin_overrides(objective="clip", estimator="grpoo")
    from runners.backends.verl.plugins.config import loss_settings

    with pytest.raises(ValueError, match="loss_mode='vanilla' is not a trustbench loss"):
        loss_settings({"loss_mode": "vanilla"})
    with pytest.raises(ValueError, match="entropy_control='repo'"):
        loss_settings({"loss_mode": "trustbench_clip", "entropy_control": "repo"})
    # a parameter the loss mode fixes is not silently overridden (TROLL's GSPO form has its own mode)
    with pytest.raises(
        ValueError,
        match=r"objective_params.sequence=True contradicts loss_mode='trustbench_troll'.*"
        r"loss_mode='trustbench_troll_seq' sets sequence=True",
    ):
        loss_settings({"loss_mode": "trustbench_troll", "objective_params": {"sequence": True}})
    assert loss_settings({"loss_mode": "trustbench_troll", "objective_params": {"sequence": False}}).method
