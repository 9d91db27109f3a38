"""Backend-independent algorithm library (the formulas of shared spec ALGORITHMS.md).

Both backends call these functions: the built-in trainer (``runners.backends.local``) directly,
verl through plugins (``runners.backends.verl``). Importing this package does not import torch:
every built-in entry is a lazy ``"module:attr"`` target (see ``registry.py``).

Extension points and their call contracts (tensors: B responses, T response positions):

- ``ESTIMATORS[name](inp: AdvantageInputs, **params) -> (advantages [B,T], returns [B,T])``
- ``OBJECTIVES[name](inp: PolicyInputs, **params) -> ObjectiveOutput`` (per-token loss matrix,
  to be reduced by a loss aggregation with ``inp.response_mask``)
- ``MASKS[name](inp: PolicyInputs, **params) -> MaskOutput`` (per-sequence keep weights [B]; the
  trainer multiplies the loss matrix by them and keeps the response mask as the denominator,
  trm.txt eq. 50)
- ``ENTROPY_CONTROLLERS[name](**params)`` -> a controller object (see ``entropy.py``)
- ``LOSS_AGGS[name](loss_mat, loss_mask, **kw) -> scalar``
"""

from runners.algorithms.registry import Registry, UnknownNameError

ESTIMATORS = Registry("estimator")
OBJECTIVES = Registry("objective")
MASKS = Registry("mask")
ENTROPY_CONTROLLERS = Registry("entropy_control")
LOSS_AGGS = Registry("loss_agg")

_PKG = "runners.algorithms"

for _name, _attr in {
    "grpo": "compute_grpo_advantages",
    "drgrpo": "compute_drgrpo_advantages",
    "rloo": "compute_rloo_advantages",
    "loop": "compute_loop_advantages",
    "rfpp": "compute_rfpp_advantages",
    "rfpp_baseline": "compute_rfpp_baseline_advantages",
    "gpg": "compute_gpg_advantages",
    "gae": "compute_gae_advantages",
    "egae": "compute_egae_advantages",
}.items():
    ESTIMATORS.register(_name, f"{_PKG}.estimators:{_attr}")

for _name, _target in {
    "clip": "objectives:clip_objective",
    "token_is": "objectives:token_is_objective",
    "gspo": "objectives:gspo_objective",
    "gpg": "objectives:gpg_objective",
    "bapo": "objectives:bapo_objective",
    "troll": "troll:troll_objective",
    "gtpo": "gtpo:gtpo_objective",
}.items():
    OBJECTIVES.register(_name, f"{_PKG}.{_target}")

for _name, _attr in {
    "none": "no_mask",
    "trm_max": "trm_max_mask",
    "trm_avg": "trm_avg_mask",
    "trm_max_avg": "trm_max_avg_mask",
    "trm_max_k2": "trm_max_k2_mask",
    "trm_avg_k3": "trm_avg_k3_mask",
    "trm_max_avg_sample": "trm_max_avg_sample_mask",
    "ln_trm": "ln_trm_mask",
    "ser": "ser_mask",
}.items():
    MASKS.register(_name, f"{_PKG}.trm:{_attr}")

for _name, _attr in {
    "none": "NoEntropyControl",
    "bonus": "EntropyBonusController",
    "repo_r": "RepoRController",
    "repo_d": "RepoDController",
    "adapo": "AdapoController",
}.items():
    ENTROPY_CONTROLLERS.register(_name, f"{_PKG}.entropy:{_attr}")

for _name, _attr in {
    "token-mean": "token_mean",
    "seq-mean-token-mean": "seq_mean_token_mean",
    "seq-mean-token-sum": "seq_mean_token_sum",
    "seq-mean-token-sum-norm": "seq_mean_token_sum_norm",
}.items():
    LOSS_AGGS.register(_name, f"{_PKG}.loss_agg:{_attr}")

REGISTRIES = {
    "estimator": ESTIMATORS,
    "objective": OBJECTIVES,
    "mask": MASKS,
    "entropy_control": ENTROPY_CONTROLLERS,
    "loss_agg": LOSS_AGGS,
}

__all__ = [
    "ENTROPY_CONTROLLERS",
    "ESTIMATORS",
    "LOSS_AGGS",
    "MASKS",
    "OBJECTIVES",
    "REGISTRIES",
    "Registry",
    "UnknownNameError",
]
