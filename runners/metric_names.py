"""The metric schema: one set of names for every backend, aligned with verl's.

Both backends log per-step metrics under these names (MLflow step = global training step), and
``analysis`` reads them. verl's own names are used where verl has the quantity; method metrics use
a ``<method>/`` prefix. MLflow forbids ``@`` in metric names, so verl's ``mean@N`` becomes
``mean_at_N`` (verl's MLflow logger does the same substitution).

This module is import-light (no torch) on purpose.
"""

from __future__ import annotations

# -- training data ---------------------------------------------------------------------------
SCORE_MEAN = "critic/score/mean"  # mean sequence reward of the training batch (success rate)
SCORE_MAX = "critic/score/max"
SCORE_MIN = "critic/score/min"
ADVANTAGES_MEAN = "critic/advantages/mean"
ADVANTAGES_MAX = "critic/advantages/max"
ADVANTAGES_MIN = "critic/advantages/min"
RETURNS_MEAN = "critic/returns/mean"
VALUES_MEAN = "critic/values/mean"
VF_LOSS = "critic/vf_loss"
VF_CLIPFRAC = "critic/vf_clipfrac"
RESPONSE_LENGTH_MEAN = "response_length/mean"
RESPONSE_LENGTH_MAX = "response_length/max"
RESPONSE_LENGTH_MIN = "response_length/min"
RESPONSE_LENGTH_CLIP_RATIO = "response_length/clip_ratio"  # fraction hitting max length
PROMPT_LENGTH_MEAN = "prompt_length/mean"

# -- actor update ----------------------------------------------------------------------------
ENTROPY = "actor/entropy"  # mean token entropy of the current policy on the training batch
PG_LOSS = "actor/pg_loss"
PG_CLIPFRAC = "actor/pg_clipfrac"
PG_CLIPFRAC_LOWER = "actor/pg_clipfrac_lower"
PPO_KL = "actor/ppo_kl"
GRAD_NORM = "actor/grad_norm"
LR = "actor/lr"
# token KL(pi_new || pi_old) on the step's batch measured AFTER the actor update (mean / max over response
# tokens; pi_old = the old-log-prob pass, pi_new = the updated weights, one extra forward pass; the direction
# TROLL's trust region bounds, on pi_old's top-K plus a rest bin). Every method logs it, so TROLL's region can
# be compared with what Clip actually does (claim checks).
POST_UPDATE_KL = "actor/post_update_kl"
POST_UPDATE_KL_MAX = "actor/post_update_kl_max"
# the fraction of response tokens whose post-update KL(pi_new || pi_old) exceeds eps, for each eps below: how
# often a per-token trust region of that size (TROLL, arXiv 2510.03817, eq. 3) is left after the update
POST_UPDATE_KL_THRESHOLDS = (0.01, 0.02, 0.05, 0.1, 0.2)
POST_UPDATE_KL_FRAC_PREFIX = "actor/post_update_kl_frac_above_"


# token KL(pi_new || pi_sampler) after the actor update (mean / max, and the share above each eps): the
# post_update_kl statistics measured from the sampling policy (its top-K plus a rest bin), logged where it is a
# separate copy of the model (stale rollouts, a lower-precision sampler); that copy is what TROLL's region is
# centred on in the built-in trainer. On-policy the sampler is pi_old and these are not logged.
POST_UPDATE_KL_SAMPLER = "actor/post_update_kl_sampler"
POST_UPDATE_KL_SAMPLER_MAX = "actor/post_update_kl_sampler_max"
POST_UPDATE_KL_SAMPLER_FRAC_PREFIX = "actor/post_update_kl_sampler_frac_above_"


def post_update_kl_frac_above(eps: float, *, sampler: bool = False) -> str:
    """``actor/post_update_kl_frac_above_0.05``: the share of tokens with post-update KL above ``eps``;
    ``sampler=True``: ``actor/post_update_kl_sampler_frac_above_0.05``, the KL from the sampling policy."""
    return f"{POST_UPDATE_KL_SAMPLER_FRAC_PREFIX if sampler else POST_UPDATE_KL_FRAC_PREFIX}{eps:g}"


# -- timing and throughput -------------------------------------------------------------------
TIMING_GEN = "timing_s/gen"
TIMING_OLD_LOG_PROB = "timing_s/old_log_prob"
TIMING_REF = "timing_s/ref"
TIMING_ADV = "timing_s/adv"
TIMING_UPDATE_ACTOR = "timing_s/update_actor"
TIMING_UPDATE_CRITIC = "timing_s/update_critic"
TIMING_STEP = "timing_s/step"
TIMING_TESTING = "timing_s/testing"
TIMING_PHASES = (TIMING_GEN, TIMING_OLD_LOG_PROB, TIMING_UPDATE_ACTOR, TIMING_UPDATE_CRITIC)
# CPU time (user + system of the training process and its threads, time.process_time) of the same phases,
# logged beside wall time so that a step slowed by other load on the machine can be told apart
TIMING_CPU_PREFIX = "timing_cpu_s/"


def timing_cpu(wall_metric: str) -> str:
    """CPU-time twin of a wall-time phase metric: ``timing_s/gen`` -> ``timing_cpu_s/gen``."""
    if not wall_metric.startswith("timing_s/"):
        raise ValueError(f"not a timing_s/<phase> metric: {wall_metric!r}")
    return TIMING_CPU_PREFIX + wall_metric.split("/", 1)[1]


TIMING_CPU_GEN = timing_cpu(TIMING_GEN)
TIMING_CPU_OLD_LOG_PROB = timing_cpu(TIMING_OLD_LOG_PROB)
TIMING_CPU_UPDATE_ACTOR = timing_cpu(TIMING_UPDATE_ACTOR)
TIMING_CPU_UPDATE_CRITIC = timing_cpu(TIMING_UPDATE_CRITIC)
TIMING_CPU_STEP = timing_cpu(TIMING_STEP)
# machine load during the step: 1-minute load average (os.getloadavg) and the cores this process may use
# (len(os.sched_getaffinity(0))); load above the cores means other work competed for them
LOAD_AVG_1M = "perf/load_avg_1m"
CPU_COUNT_AVAILABLE = "perf/cpu_count_available"
THROUGHPUT = "perf/throughput"  # tokens (prompt + response) per second over the whole step
GEN_THROUGHPUT = "perf/gen_throughput"  # generated tokens per second during rollout
TOTAL_NUM_TOKENS = "perf/total_num_tokens"
MAX_MEMORY_ALLOCATED_GB = "perf/max_memory_allocated_gb"
CPU_MEMORY_USED_GB = "perf/cpu_memory_used_gb"
# Model FLOPs utilisation of the actor update (verl's name): matmul FLOPs of forward and backward on the
# real tokens (runners/perf/flops.py) / (update time x the machine's peak: the GPU table's dense BF16
# rate, or a CPU's measured fp32 matmul rate, runners/perf/hardware.py)
MFU_ACTOR = "perf/mfu/actor"
# Roofline points measured by a backend, per phase: arithmetic intensity (model FLOPs / modelled bytes moved,
# FLOP/byte) and achieved TFLOP/s (model FLOPs / the phase's wall time). Phases: rollout (generation),
# old_log_prob, update_actor; a phase that did no work in the step (a skipped old-log-prob pass) logs none.
ROOFLINE_PHASES = ("rollout", "old_log_prob", "update_actor")


def arithmetic_intensity(phase: str) -> str:
    """``perf/<phase>_arithmetic_intensity`` (FLOP/byte) of a phase in ``ROOFLINE_PHASES``."""
    if phase not in ROOFLINE_PHASES:
        raise ValueError(f"unknown Roofline phase {phase!r}; valid: {', '.join(ROOFLINE_PHASES)}")
    return f"perf/{phase}_arithmetic_intensity"


def achieved_tflops(phase: str) -> str:
    """``perf/<phase>_tflops`` (achieved TFLOP/s) of a phase in ``ROOFLINE_PHASES``."""
    if phase not in ROOFLINE_PHASES:
        raise ValueError(f"unknown Roofline phase {phase!r}; valid: {', '.join(ROOFLINE_PHASES)}")
    return f"perf/{phase}_tflops"


ROLLOUT_ARITHMETIC_INTENSITY = arithmetic_intensity("rollout")
ROLLOUT_TFLOPS = achieved_tflops("rollout")
# the machine's ceilings the points are measured against (constant over a run): peak TFLOP/s and memory TB/s
PEAK_TFLOPS = "perf/peak_tflops"
PEAK_MEM_BW_TBS = "perf/peak_mem_bw_tbs"
# -- method metrics --------------------------------------------------------------------------
# verl's training-inference mismatch diagnostics (runners.algorithms.rollout_correction logs them all)
ROLLOUT_CORR_PREFIX = "rollout_corr/"
ROLLOUT_CORR_KL = ROLLOUT_CORR_PREFIX + "kl"  # E[log pi_rollout - log pi_old] per token: the gap's size
TROLL_PROJECTED_FRAC = "troll/projected_frac"
TROLL_KEPT_TOKENS = "troll/kept_tokens"
TROLL_KEPT_MASS = "troll/kept_mass"
TROLL_KL_BEFORE = "troll/kl_before"
TROLL_KL_AFTER = "troll/kl_after"
TROLL_DUAL_STEPS = "troll/dual_steps"
TRM_ACCEPT_RATE = "trm/accept_rate"
TRM_PPL_GAP = "trm/ppl_gap"  # log absolute PPL gap
TRM_MAX_KL = "trm/max_kl"
TRM_MEAN_KL = "trm/mean_kl"
GTPO_CONFLICT_FRAC = "gtpo/conflict_frac"
GTPO_FILTERED_FRAC = "gtpo/filtered_frac"
# mean over conflict tokens (GTPO, arXiv 2508.03772, section 5: same token at the same forward/backward position in a positive
# and a negative response of a group) of log pi_new(token) - log pi_old(token) after the actor update. GTPO logs
# it on the tokens it protects; GRPO (any group method) logs it on the conflict tokens found by the same rule in
# its own batch, without changing its update, so the two can be compared.
GTPO_CONFLICT_PROB_DELTA = "gtpo/conflict_prob_delta"
ENTROPY_ZETA = "entropy/zeta"
ENTROPY_EPS_HIGH = "entropy/eps_high"
ENTROPY_BONUS_COEF = "entropy/bonus_coef"
ENTROPY_TARGET = "entropy/target"
ENTROPY_COV = "entropy/cov"  # Corollary-1 covariance diagnostic


def trm_accept_rate_bucket(lo: int, hi: int) -> str:
    """Acceptance rate of responses with lo <= length < hi (TRM, arXiv 2512.23075, table D.1)."""
    return f"trm/accept_rate/len_{lo}_{hi}"


def trm_tv_position_bucket(lo: int, hi: int) -> str:
    """Mean token TV distance at positions lo <= t < hi (input of the Adaptive bound)."""
    return f"trm/tv/pos_{lo}_{hi}"


# -- evaluation --------------------------------------------------------------------------------
def val_acc_mean(data: str, n: int = 1) -> str:
    """Mean accuracy over n samples per prompt (pass@1 estimate when n samples are drawn)."""
    return f"val-core/{data}/acc/mean_at_{n}"


def val_acc_best(data: str, k: int) -> str:
    """pass@k: fraction of prompts with at least one correct of k samples."""
    return f"val-core/{data}/acc/best_at_{k}/mean"


def val_acc_maj(data: str, k: int) -> str:
    """maj@k: fraction of prompts whose majority answer over k samples is correct."""
    return f"val-core/{data}/acc/maj_at_{k}/mean"


def val_entropy(data: str) -> str:
    return f"val-aux/{data}/entropy/mean"


def val_response_length(data: str) -> str:
    return f"val-aux/{data}/response_length/mean"


# per-prompt results of one evaluation, a JSON artifact of the run (the built-in trainer writes it at every
# evaluation, ``analysis.eval_error`` reads it): {"step", "n", "sources": {<data>: {"keys": [...], "scores":
# [[n scores of the prompt], ...]}}}, a prompt's key being its dataset index (its position when it has none)
PER_PROMPT_ARTIFACT_PREFIX = "eval/per_prompt/"


def per_prompt_artifact(step: int) -> str:
    """``eval/per_prompt/step_000020.json``: the artifact of the per-prompt results of the evaluation at ``step``."""
    return f"{PER_PROMPT_ARTIFACT_PREFIX}step_{step:0>6}.json"


# -- run tags ----------------------------------------------------------------------------------
# MLflow run statuses of a run that ended (FINISHED is also the status that makes a rerun skip the cell)
TERMINAL_STATUSES = ("FINISHED", "FAILED", "KILLED")
TAG_RUN_KEY = "trustbench.run_key"
TAG_ALGORITHM = "algorithm"
TAG_METHOD = "method"  # display label of the method, e.g. "GRPO+TROLL" (tables and legends)
TAG_OBJECTIVE = "objective"
TAG_ESTIMATOR = "estimator"
TAG_MASK = "mask"
TAG_ENTROPY_CONTROL = "entropy_control"
TAG_ROLLOUT_CORRECTION = "rollout_correction"  # verl's training-inference mismatch correction (none, token_tis, ...)
TAG_REGIME = "regime"  # the off-policy regime (runners.config.regime.regime_label): "on-policy", "stale k=2", ...
TAG_MODEL = "model"
TAG_DATASET = "dataset"
TAG_SEED = "seed"
TAG_BACKEND = "backend"
TAG_SWEEP = "sweep"
TAG_GIT_REVISION = "git_revision"  # the source tree's commit, "-dirty.<hash of the diff>" if edited
TAG_PACKAGE_VERSION = "trustbench.version"  # the installed trustbench package's version
TAG_HOST = "host"
TAG_FAILURE = "trustbench.failure"  # reason a run FAILED


def code_version_label(version: str | None, revision: str | None) -> str:
    """How sweeps and reports name the code of a run: ``0.1.0 @ 1a2b3c4d5e6f`` (package version, git
    revision), ``?`` for a part the run did not record, ``unrecorded`` when it recorded neither."""
    known = [v if v and v != "unknown" else None for v in (version, revision)]
    return "unrecorded" if not any(known) else f"{known[0] or '?'} @ {known[1] or '?'}"
