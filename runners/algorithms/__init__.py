"""Backend-independent algorithm library: the formulas of the five papers and their baselines.

Both backends call these functions: the built-in trainer (``runners.backends.local``) directly,
verl through plugins (``runners.backends.verl``). Importing this package does not import torch:
every built-in entry is a lazy ``"module:attr"`` target (see ``runners.registry``).

Extension points and their call contracts (tensors: B responses, T response positions):

- ``ESTIMATORS[name](inp: AdvantageInputs, **params) -> (advantages [B,T], returns [B,T])``
- ``OBJECTIVES[name](inp: PolicyInputs, **params) -> ObjectiveOutput`` (per-token loss matrix,
  to be reduced by a loss aggregation with ``inp.response_mask``)
- ``MASKS[name](inp: PolicyInputs, **params) -> MaskOutput`` (per-sequence keep weights [B]; the
  trainer multiplies the loss matrix by them and keeps the response mask as the denominator,
  TRM (arXiv 2512.23075) eq. 50)
- ``ENTROPY_CONTROLLERS[name](**params)`` -> a controller object (see ``entropy.py``)
- ``LOSS_AGGS[name](loss_mat, loss_mask, **kw) -> scalar``
- ``ROLLOUT_CORRECTIONS[name](old_logp, rollout_logp, response_mask, **params) -> CorrectionOutput``
  (verl's training-inference mismatch corrections: importance weights and/or a shrunk response mask,
  once per iteration; see ``rollout_correction.py``)

Each entry also declares what its component needs (the current logits, the sparse old
distribution, entropy with gradient, a critic, rollout log-probs, GTPO's H_ini, whole prompt
groups), what it provides to the others, the config keys the trainer consumes, and its config
dataclass, and its display name in run labels (``label``; estimators and loss aggregations have none
and show as ``estimator=rloo``); ``method.Method`` combines the declarations of a cell and
``policy_loss.PolicyLoss`` is the one place that assembles a (micro-)batch's policy loss from the
components, for every backend.
"""

from runners.checks import GREATER_THAN_ONE, OPEN_UNIT_OR_ONE, POSITIVE
from runners.registry import Registry

_PKG = "runners.algorithms"
# the components' config dataclasses (and the builder of those declared as a mapping on their registry line)
_SCHEMA = "runners.algorithms.components"

_BUILDER = f"{_SCHEMA}:component_dataclass"

ESTIMATORS = Registry("estimator", schema_builder=_BUILDER)
OBJECTIVES = Registry("objective", schema_builder=_BUILDER)
MASKS = Registry("mask", schema_builder=_BUILDER)
ENTROPY_CONTROLLERS = Registry("entropy_control", schema_builder=_BUILDER)
LOSS_AGGS = Registry("loss_agg", schema_builder=_BUILDER)
ROLLOUT_CORRECTIONS = Registry("rollout_correction", schema_builder=_BUILDER)

# what a component needs / provides: the words of runners.algorithms.method.CAPABILITIES
_GROUPS = ("groups",)
_CRITIC = ("critic",)
_EXACT = ("logits", "sparse_old")
_SAMPLE = ("rollout_logp",)
_SPARSE_KEYS = ("top_k", "tail_mass")  # size of the stored sparse distribution (trainer-owned)

# name: (target, schema, declarations)
for _name, (_attr, _schema, _decl) in {
    "grpo": ("compute_grpo_advantages", "GrpoEstimator", {"needs": _GROUPS}),
    "drgrpo": ("compute_drgrpo_advantages", None, {"needs": _GROUPS}),
    "rloo": ("compute_rloo_advantages", None, {"needs": _GROUPS}),
    "loop": ("compute_loop_advantages", None, {"needs": _GROUPS}),
    "rfpp": ("compute_rfpp_advantages", "RfppEstimator", {}),
    "rfpp_baseline": ("compute_rfpp_baseline_advantages", None, {"needs": _GROUPS}),
    "gpg": ("compute_gpg_advantages", "GpgEstimator", {"needs": _GROUPS}),
    "gae": ("compute_gae_advantages", "GaeEstimator", {"needs": _CRITIC, "provides": ("partial_responses",)}),
    "egae": ("compute_egae_advantages", "EgaeEstimator", {"needs": _CRITIC, "provides": ("partial_responses",)}),
}.items():
    ESTIMATORS.register(_name, f"{_PKG}.estimators:{_attr}", schema=_schema and f"{_SCHEMA}:{_schema}", **_decl)

for _name, (_target, _schema, _decl) in {
    "clip": (
        "objectives:clip_objective",
        "ClipObjective",
        {
            "provides": ("token_clip",),
            "label": "Clip",
            "preset_labels": {"dapo_clip": "Clip-Higher", "dual_clip": "Dual-Clip"},
        },
    ),
    "token_is": ("objectives:token_is_objective", None, {"label": "Token-IS"}),
    "gspo": ("objectives:gspo_objective", "GspoObjective", {"label": "GSPO"}),
    "gpg": ("objectives:gpg_objective", None, {"label": "GPG"}),
    "bapo": ("objectives:bapo_objective", "BapoObjective", {"label": "BAPO"}),
    "cispo": (
        "cispo:cispo_objective",
        {"clip_ratio_low": (float, 1.0, OPEN_UNIT_OR_ONE), "clip_ratio_high": (float, 0.28, POSITIVE)},
        {"label": "CISPO"},
    ),
    "troll": (
        "troll:troll_objective",
        "TrollObjective",
        {
            "needs": _EXACT,
            "trainer_keys": _SPARSE_KEYS,
            "label": "TROLL",
            "preset_labels": {"troll_seq": "TROLL-Seq"},
        },
    ),
    "gtpo": (
        "gtpo:gtpo_objective",
        "GtpoObjective",
        {"needs": ("grad_entropy", "h_ini", "groups"), "trainer_keys": ("h_ini_prompts",), "label": "GTPO"},
    ),
}.items():
    _schema = _schema if isinstance(_schema, dict) else _schema and f"{_SCHEMA}:{_schema}"
    OBJECTIVES.register(_name, f"{_PKG}.{_target}", schema=_schema, **_decl)

for _name, (_attr, _schema, _needs, _label) in {
    "none": ("no_mask", None, (), "NoMask"),
    "trm_max": ("trm_max_mask", "TrmMaxExactMask", _EXACT, "TRM-Max"),
    "trm_avg": ("trm_avg_mask", "TrmAvgExactMask", _EXACT, "TRM-Avg"),
    "trm_max_avg": ("trm_max_avg_mask", "TrmMaxAvgExactMask", _EXACT, "TRM-Max&Avg"),
    "trm_max_k2": ("trm_max_k2_mask", "TrmMaxMask", _SAMPLE, "TRM-Max(k2)"),
    "trm_avg_k3": ("trm_avg_k3_mask", "TrmAvgMask", _SAMPLE, "TRM-Avg(k3)"),
    "trm_max_avg_sample": ("trm_max_avg_sample_mask", "TrmMaxAvgMask", _SAMPLE, "TRM-Max&Avg(k2,k3)"),
    "ln_trm": ("ln_trm_mask", "LnTrmMask", _SAMPLE, "LN-TRM"),
    "ser": ("ser_mask", "SerMask", _SAMPLE, "SER"),
}.items():
    MASKS.register(
        _name,
        f"{_PKG}.trm:{_attr}",
        schema=_schema and f"{_SCHEMA}:{_schema}",
        needs=_needs,
        trainer_keys=_SPARSE_KEYS if _needs == _EXACT else (),
        label=_label,
    )

for _name, (_attr, _schema, _needs, _label) in {
    "none": ("NoEntropyControl", None, (), "NoEC"),
    "bonus": ("EntropyBonusController", "BonusControl", ("grad_entropy", "batch_entropy"), "EntBonus"),
    "repo_r": ("RepoRController", "RepoControl", ("batch_entropy",), "REPO-R"),
    "repo_d": ("RepoDController", "RepoDControl", ("batch_entropy",), "REPO-D"),
    "adapo": ("AdapoController", "AdapoControl", ("token_clip", "batch_entropy"), "ADAPO"),
}.items():
    ENTROPY_CONTROLLERS.register(
        _name, f"{_PKG}.entropy:{_attr}", schema=_schema and f"{_SCHEMA}:{_schema}", needs=_needs, label=_label
    )

for _name, _attr in {
    "token-mean": "token_mean",
    "seq-mean-token-mean": "seq_mean_token_mean",
    "seq-mean-token-sum": "seq_mean_token_sum",
    "seq-mean-token-sum-norm": "seq_mean_token_sum_norm",
}.items():
    LOSS_AGGS.register(
        _name,
        f"{_PKG}.loss_agg:{_attr}",
        schema=f"{_SCHEMA}:LossAggConfig",
        needs=("norm_len",) if _name == "seq-mean-token-sum-norm" else (),
    )

for _name, (_attr, _schema, _label) in {
    "none": ("no_correction", None, "NoRC"),
    "token_tis": ("token_tis", {"cap": (float, 2.0, GREATER_THAN_ONE)}, "TIS"),
    "seq_max_k2": ("seq_max_k2", {"threshold": (float, 0.05, POSITIVE)}, "RS-max-k2"),
    "seq_max_k3": ("seq_max_k3", {"threshold": (float, 0.05, POSITIVE)}, "RS-max-k3"),
}.items():
    ROLLOUT_CORRECTIONS.register(
        _name,
        f"{_PKG}.rollout_correction:{_attr}",
        schema=_schema,
        needs=("rollout_logp",) if _schema else (),
        label=_label,
    )

REGISTRIES = {
    "estimator": ESTIMATORS,
    "objective": OBJECTIVES,
    "mask": MASKS,
    "entropy_control": ENTROPY_CONTROLLERS,
    "loss_agg": LOSS_AGGS,
    "rollout_correction": ROLLOUT_CORRECTIONS,
}

__all__ = [
    "ENTROPY_CONTROLLERS",
    "ESTIMATORS",
    "LOSS_AGGS",
    "MASKS",
    "OBJECTIVES",
    "REGISTRIES",
    "ROLLOUT_CORRECTIONS",
]
