"""trustbench advantage estimators in verl's registry (``register_adv_est``): one per library estimator.

Design: ``trustbench_<name>`` (grpo, drgrpo, rloo, loop, rfpp, rfpp_baseline, gpg, gae, egae) calls
``runners.algorithms.ESTIMATORS[name]`` on verl's tensors: ``token_level_rewards`` and
``response_mask`` [B,T], ``index`` = verl's ``uid`` per response (prompt groups). The estimator's
keyword arguments are read from ``algorithm.trustbench_estimator`` (``ESTIMATOR_PARAMS_KEY``), the
same dict as the trustbench estimator node without ``name``. Where verl has the method built in
(grpo, rloo, reinforce_plus_plus, gpg, gae) the library agrees with it (tests/algorithms); these
plugins exist for what verl lacks (EGAE, LOOP, estimator options verl fixes) and so that a run
uses one code path on both backends.

verl's generic estimator call passes no critic values; ``trustbench_gae`` / ``trustbench_egae``
receive ``values`` [B,T] (and, for EGAE, ``finished`` [B] bool) from the trustbench trainer
(``plugins_trainer``), which needs ``critic.enable=true``. verl's rollouts generate whole responses,
so every response is finished and EGAE equals GAE there, unless the batch carries a ``finished``
field (responses cut at a window, T-PPO).

    from verl.trainer.ppo.core_algos import get_adv_estimator_fn
    adv, returns = get_adv_estimator_fn("trustbench_grpo")(token_level_rewards=r, response_mask=m,
                                                          index=uids, config=algorithm_cfg)

Tests: ``pytest tests/verl/test_plugins_advantages.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor
from verl.trainer.ppo.core_algos import register_adv_est

from runners.algorithms import ESTIMATORS
from runners.algorithms.types import AdvantageInputs
from runners.backends.verl import ADV_ESTIMATORS, ESTIMATOR_PARAMS_KEY


def estimator_params(config: Any) -> dict[str, Any]:
    """Keyword arguments of the library estimator from verl's ``algorithm`` node (or None)."""
    if config is None:
        return {}
    params = (
        config.get(ESTIMATOR_PARAMS_KEY, None)
        if hasattr(config, "get")
        else getattr(config, ESTIMATOR_PARAMS_KEY, None)
    )
    if params is None:
        return {}
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(params, DictConfig):
            params = OmegaConf.to_container(params, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    if not isinstance(params, Mapping):
        raise TypeError(f"algorithm.{ESTIMATOR_PARAMS_KEY} must be a mapping, got {params!r}")
    return dict(params)


def _make_estimator(name: str):
    def estimator(
        token_level_rewards: Tensor,
        response_mask: Tensor,
        config: Any = None,
        index: Any = None,
        values: Tensor | None = None,
        finished: Tensor | None = None,
        **_: Any,
    ) -> tuple[Tensor, Tensor]:
        if "critic" in ESTIMATORS.entry(name).needs and values is None:
            raise ValueError(
                f"advantage estimator trustbench_{name} needs critic values: run verl with critic.enable=true "
                "and trainer.v1.trainer_mode=trustbench_sync (it passes the values)"
            )
        if finished is None:  # verl generates whole responses: every one ended (EOS or max length)
            finished = response_mask.new_ones(response_mask.shape[0], dtype=bool)
        inp = AdvantageInputs(
            token_rewards=token_level_rewards,
            response_mask=response_mask,
            group_index=index,
            values=values,
            finished=finished,
        )
        return ESTIMATORS.get(name)(inp, **estimator_params(config))

    estimator.__name__ = estimator.__qualname__ = f"compute_trustbench_{name}_advantages"
    estimator.__doc__ = f"verl advantage estimator 'trustbench_{name}': runners.algorithms estimator {name!r}."
    return estimator


ESTIMATOR_FNS = {plugin: register_adv_est(plugin)(_make_estimator(name)) for plugin, name in ADV_ESTIMATORS.items()}
# plugins that need the critic's values (passed by the trustbench trainer)
VALUE_ESTIMATORS = frozenset(
    plugin for plugin, name in ADV_ESTIMATORS.items() if "critic" in ESTIMATORS.entry(name).needs
)

__all__ = ["ESTIMATOR_FNS", "VALUE_ESTIMATORS", "estimator_params"]
