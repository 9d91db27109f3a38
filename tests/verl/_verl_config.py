"""verl's own config for the tests: a cell's translated overrides applied to verl 0.9.1's ppo_trainer.yaml.

``make_verl_config()`` returns ``make(overrides) -> verl DictConfig`` (Hydra's compose of verl's
``ppo_trainer`` once, then Hydra's own override parser and applier per call, what compose does after the
defaults list); ``verl_accepts`` does what ``main_ppo`` does with a config before training. Model presets
from the hub are only named, never downloaded.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import os
import warnings

from omegaconf import OmegaConf

from runners.config import compose

SMOLLM2_DIR = "/models/smollm2-converted"


@functools.cache
def _compose(overrides: tuple[str, ...]):
    cfg, _ = compose(["backend=verl", *overrides])
    return cfg


def _paths(tmp: str = "/runs/cell/verl"):
    from runners.backends.verl.layout import VerlPaths

    return VerlPaths.under(tmp)


def _translate(cfg, **kw):
    from runners.backends.verl.translate import build_overrides

    model_path = SMOLLM2_DIR if cfg.model.kind == "smollm2" else None
    return build_overrides(cfg, _paths(), model_path=model_path, **kw)


def _hydra_compose_verl(config_dir: str, overrides: list[str]):
    """Hydra's compose of verl's ppo_trainer (runners.config keeps its own Hydra initialised: reset it)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose("ppo_trainer", overrides=overrides)


def make_verl_config():
    """``make(overrides) -> verl DictConfig``: verl's ppo_trainer.yaml with the overrides applied."""
    import verl
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser

    import runners.backends.verl.plugins.register  # noqa: F401  (registers the trustbench_* names in verl)

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    base = _hydra_compose_verl(config_dir, [])
    parser = OverridesParser.create()

    def make(overrides):
        cfg = copy.deepcopy(base)
        OmegaConf.set_struct(cfg, True)
        ConfigLoaderImpl._apply_overrides_to_config(parser.parse_overrides(list(overrides)), cfg)
        return cfg

    make.config_dir = config_dir
    return make


def verl_accepts(vc):
    """What ``main_ppo`` does with a config before training: validate, build the dataclasses, look up names."""
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn
    from verl.trainer.ppo.utils import need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # the critic needs its model's files (no download here): test_critic_config builds it from a local model
        validate_config(vc, use_reference_policy=need_reference_policy(vc), use_critic=False)
    algo = omega_conf_to_dataclass(vc.algorithm)
    actor = omega_conf_to_dataclass(vc.actor_rollout_ref.actor)
    get_policy_loss_fn(actor.policy_loss.loss_mode)
    if algo.adv_estimator not in ("gae", "grpo"):  # dispatched by name in verl's compute_advantage
        get_adv_estimator_fn(algo.adv_estimator)
    return algo, actor
