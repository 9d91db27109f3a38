"""Structured configs: one dataclass per config node, registered in Hydra's ConfigStore.

The root schema types every plain group (rollout, model, dataset, trainer, ...); each option file
of a component group (estimator, objective, mask, entropy_control, loss_agg) starts with
``defaults: [schema_<name>]``. Hydra thus type-checks every file and rejects unknown keys at compose
time; ``runners.config.validate`` then checks
values (ranges, cross-field rules) and names the offending key. Fields of an algorithm component
(estimator, objective, mask, entropy control) other than ``name`` are passed as keyword arguments
to the registered function (``runners.algorithms``); a test binds every option to its function's
signature so the two cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

# ----------------------------------------------------------------------------------------------
# algorithm components
# ----------------------------------------------------------------------------------------------


@dataclass
class NamedComponent:
    # registry name of the component (runners.algorithms registries)
    name: str = MISSING


# -- estimators (runners/algorithms/estimators.py) ---------------------------------------------
@dataclass
class GrpoEstimator(NamedComponent):
    # added to the group std before dividing
    eps: float = 1e-6
    # divide by the group std (False gives Dr.GRPO's advantage)
    norm_by_std: bool = True


@dataclass
class RfppEstimator(NamedComponent):
    # discount factor of token returns
    gamma: float = 1.0
    # subtract the batch mean before the global std normalisation
    center: bool = True


@dataclass
class GpgEstimator(NamedComponent):
    # rescaling of the advantage: "verl" (share of groups with non-zero signal) | "none"
    rescale: str = "verl"
    # GPG's normalisation constant f_norm
    f_norm: float = 1.0


@dataclass
class GaeEstimator(NamedComponent):
    # discount factor
    gamma: float = 1.0
    # GAE lambda (bias-variance trade-off)
    lam: float = 1.0
    # whiten advantages over the batch (verl's GAE does)
    whiten: bool = True


# -- objectives (runners/algorithms/objectives.py, troll.py, gtpo.py) --------------------------
@dataclass
class ClipObjective(NamedComponent):
    # lower clip range: ratio >= 1 - clip_ratio_low
    clip_ratio_low: float = 0.2
    # upper clip range: ratio <= 1 + clip_ratio_high (DAPO: 0.28)
    clip_ratio_high: float = 0.2
    # dual-clip bound c > 1 for negative advantages (None = off)
    clip_ratio_c: Optional[float] = None


@dataclass
class GspoObjective(NamedComponent):
    # sequence-ratio clip ranges (GSPO: 3e-4 / 4e-4)
    clip_ratio_low: float = 3e-4
    clip_ratio_high: float = 4e-4


@dataclass
class BapoObjective(NamedComponent):
    # target share of the loss from positive-advantage tokens (BAPO rho_0)
    rho: float = 0.5
    # lower ratio bound: start value and upper limit of its search
    ratio_low_start: float = 0.6
    ratio_low_max: float = 0.9
    # upper ratio bound: start value and upper limit of its search
    ratio_high_start: float = 1.2
    ratio_high_max: float = 3.0
    # search steps of the two bounds
    ratio_low_step: float = 0.05
    ratio_high_step: float = 0.05
    # "paper" (BAPO Algorithm 1) | "recipe" (the authors' training recipe)
    rule: str = "paper"
    # optional dual-clip bound for negative advantages
    clip_ratio_c: Optional[float] = None


@dataclass
class TrollObjective(NamedComponent):
    # trust-region radius: KL(q_new || q_old) <= eps per token (troll.txt: 0.05)
    eps: float = 0.05
    # weight of the regression term KL(q_new || stopgrad(q_proj)) (eq. 5)
    alpha: float = 1.0
    # GSPO variant: sequence geometric mean of the projected ratios
    sequence: bool = False
    # sparse storage of the old distribution: at most k kept tokens per position (section 3.2)
    k: int = 64
    # kept tokens cover probability mass 1 - delta
    delta: float = 1e-5
    # default probability of tokens outside the kept set
    p_default: float = 1e-12
    # tokens per chunk when sparsifying / projecting
    chunk_size: int = 1024
    # dual solver (Listing 3): interior points per bracketing step, max steps, stop width
    num_points: int = 8
    max_steps: int = 20
    tol: float = 1e-5
    # search range of the dual variable eta
    eta_min: float = 1e-7
    eta_max: float = 100.0


@dataclass
class GtpoObjective(NamedComponent):
    # entropy coefficient gamma of eq. 7
    gamma: float = 0.1
    # how forward and backward conflict weights combine: "or" (paper) | "product" (authors' code)
    combine: str = "or"
    # "penalty" (eq. 7, paper) | "advantage_shift" (authors' code)
    entropy_term: str = "penalty"
    # entropy filter threshold (ln 2) on a response's mean token entropy
    entropy_threshold: float = 0.6931471805599453
    # weight of positive-advantage tokens on a conflict span (negative ones get 0)
    conflict_weight: float = 2.0
    # prompts used to measure the initial model's entropy H_ini for the entropy filter
    h_ini_prompts: int = 100


# -- sequence masks (runners/algorithms/trm.py) ---------------------------------------------------
@dataclass
class TrmMaxMask(NamedComponent):
    # max token KL threshold (TRM-Max: 0.05)
    delta: float = 0.05


@dataclass
class TrmAvgMask(NamedComponent):
    # mean token KL threshold (TRM-Avg: 0.001)
    delta_avg: float = 0.001


@dataclass
class TrmMaxAvgMask(NamedComponent):
    # both criteria (Max&Avg: 0.1 and 0.002)
    delta: float = 0.1
    delta_avg: float = 0.002


@dataclass
class LnTrmMask(NamedComponent):
    # per-token divergence scale of the weights w_t
    delta: float = 1e-4
    # threshold on the normalised weighted deviation
    delta_w: float = 0.05


@dataclass
class SerMask(NamedComponent):
    # threshold on the mean |r - 1| of a sequence (0.03 .. 0.10)
    delta_ser: float = 0.05


# -- entropy control (runners/algorithms/entropy.py) ---------------------------------------------
@dataclass
class RepoControl(NamedComponent):
    # initial zeta
    zeta0: float = 1e-3
    # |zeta| bounds of the bidirectional controller (REPO-R [1e-4, 0.05], REPO-D [1e-3, 10])
    zeta_min: float = 1e-4
    zeta_max: float = 0.05
    # target entropy; None = the first iteration's entropy
    target: Optional[float] = None


@dataclass
class AdapoControl(NamedComponent):
    # fixed lower clip range
    eps_low: float = 0.2
    # initial upper clip range and its bounds
    eps_high: float = 0.28
    eps_high_min: float = 0.2
    eps_high_max: float = 0.32
    # multiplicative steps when entropy is below / above the target
    increase: float = 1.05
    decrease: float = 0.95
    # target entropy; None = the first iteration's entropy
    target: Optional[float] = None


@dataclass
class BonusControl(NamedComponent):
    # initial entropy-bonus coefficient beta and its bounds
    beta0: float = 1e-3
    beta_min: float = 1e-3
    beta_max: float = 10.0
    # adapt beta towards the target entropy
    adaptive: bool = True
    # target entropy; None = the first iteration's entropy
    target: Optional[float] = None


# -- loss aggregation --------------------------------------------------------------------------
@dataclass
class LossAggConfig(NamedComponent):
    # constant divisor of seq-mean-token-sum-norm (None: rollout.max_response_length)
    norm_len: Optional[int] = None


# ----------------------------------------------------------------------------------------------
# run settings
# ----------------------------------------------------------------------------------------------


@dataclass
class RolloutConfig:
    # "full": every response completes within a step; "truncated": T-PPO windows
    mode: str = "full"
    # longest response in tokens (all windows together)
    max_response_length: int = 48
    # longest prompt in tokens (longer prompts are rejected when the dataset is loaded)
    max_prompt_length: int = 64
    # tokens generated per step in truncated mode (T-PPO window l)
    window: Optional[int] = None
    # truncated mode: last k tokens of unfinished responses are left out of the policy loss
    drop_last_k: int = 0
    # sampling temperature
    temperature: float = 1.0
    # nucleus sampling
    top_p: float = 1.0


@dataclass
class AlgorithmConfig:
    # preset name (conf/algorithm/<name>.yaml)
    name: str = MISSING
    # display label in tables and the MLflow UI (e.g. "GRPO")
    label: str = MISSING
    # the components the preset selects (used to label runs that swap one)
    components: dict = field(default_factory=dict)


@dataclass
class ModelConfig:
    # preset name
    name: str = MISSING
    # embedded | smollm2 | hub | tiny
    kind: str = MISSING
    # hub id or local directory (kind=hub)
    path: Optional[str] = None
    # architecture of a tiny random model (kind=tiny): qwen2 | qwen3 | llama
    arch: Optional[str] = None
    # parameter dtype: float32 | bfloat16 | float16
    dtype: str = "float32"
    # parameters in billions (sizes the GPU request of a cell)
    params_b: float = 0.0
    # format prompts with the tokenizer's chat template
    chat_template: bool = False
    # extra keyword arguments of the model builder (e.g. the embedded recipe)
    options: dict = field(default_factory=dict)


@dataclass
class DatasetConfig:
    # preset name in runners.data.datasets
    name: str = MISSING
    # local file for training (parquet/jsonl/json); None = the preset's source
    path: Optional[str] = None
    # preset used for evaluation; None = the training preset
    eval_name: Optional[str] = None
    # local file for evaluation; None = the preset's source
    eval_path: Optional[str] = None
    # more evaluation presets (their test splits), reported per data source (e.g. [math500, aime24])
    extra_eval: list = field(default_factory=list)
    train_split: str = "train"
    eval_split: str = "test"
    # cap on the number of examples (None = all)
    train_limit: Optional[int] = None
    eval_limit: Optional[int] = 64
    # reward function name (runners.data.rewards); None = the preset's
    reward: Optional[str] = None
    # preset options (e.g. the embedded task's difficulty)
    options: dict = field(default_factory=dict)


@dataclass
class TrainerConfig:
    # RL iterations (one rollout + update each)
    total_steps: int = 30
    # prompts per iteration
    prompts_per_step: int = 8
    # responses sampled per prompt (group size G)
    n: int = 8
    # passes over each iteration's data
    ppo_epochs: int = 1
    # prompts per optimiser step; prompts_per_step must be a multiple of it
    mini_batch_prompts: int = 8
    # responses per forward/backward (gradient accumulation); 0 = a whole mini-batch
    micro_batch_size: int = 0
    # actor learning rate (AdamW)
    lr: float = 1e-4
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    # global gradient-norm clip (0 = off)
    grad_clip: float = 1.0
    # linear learning-rate warm-up steps
    warmup_steps: int = 0
    # critic learning rate (estimators gae / egae)
    critic_lr: float = 1e-4
    # critic value-clip ranges around the old values (PPO/verl: 0.5 / 0.5; T-PPO: 0.5 / 0.6)
    value_clip_low: float = 0.5
    value_clip_high: float = 0.5
    # KL-to-reference loss coefficient (k3); 0 = no reference model
    kl_coef: float = 0.0
    # precision of log-probs and ratios: fp32 | bf16 (entropy.txt section 4 ablation)
    logprob_precision: str = "fp32"
    # evaluate every N steps (and before the first and after the last step); 0 = never
    eval_every: int = 10
    # samples per evaluation prompt (mean@n, pass@k and maj@k for k <= n)
    eval_n: int = 4
    # sampling temperature for evaluation
    eval_temperature: float = 1.0
    # save a checkpoint every N steps (and at the end); 0 = only at the end
    checkpoint_every: int = 10
    # stratification edges of the TRM acceptance rate by response length
    length_buckets: list = field(default_factory=lambda: [0, 8, 16, 32, 64, 128, 256, 512, 1024])


@dataclass
class BackendConfig:
    # local | verl
    name: str = "local"
    # auto | cpu | cuda
    device: str = "auto"
    # torch threads (0 = all cores)
    num_threads: int = 0
    # backend-specific settings (verl: passed through to its trainer config)
    options: dict = field(default_factory=dict)


@dataclass
class TrackingConfig:
    # sqlite (a local file) | server (an MLflow tracking server)
    kind: str = "sqlite"
    # explicit tracking URI; None = $MLFLOW_TRACKING_URI or .trustbench/mlflow.db
    uri: Optional[str] = None
    # tracking server address (kind=server)
    host: str = "127.0.0.1"
    port: int = 5000
    # start the server if nothing answers at host:port (kind=server)
    start_server: bool = True
    # seconds between asynchronous metric flushes
    flush_every_s: float = 5.0


@dataclass
class LauncherConfig:
    # local | submitit_local | slurm
    name: str = "local"
    # Slurm resources (launcher=slurm); None = derived from the model and backend
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    time_min: int = 60
    nodes: Optional[int] = None
    gpus_per_node: Optional[int] = None
    cpus_per_gpu: int = 8
    cpus_per_task: Optional[int] = None
    mem_gb: Optional[int] = None
    constraint: Optional[str] = None
    array_parallelism: int = 64
    # shell lines run before the job (module load, conda activate, ...)
    setup: list = field(default_factory=list)
    # extra sbatch keys (e.g. {reservation: x})
    additional_parameters: dict = field(default_factory=dict)
    # requeues allowed after preemption or time-out before the cell counts as failed
    max_requeues: int = 3
    # seconds before the time limit Slurm signals a job (it checkpoints and requeues itself); must
    # exceed one training step plus a checkpoint. Slurm may send it up to 30 s early; for short
    # limits it is capped so that it never comes in a job's first 10 s (runners.sweep.signal_delay)
    signal_delay_s: int = 300


@dataclass
class DebugConfig:
    # raise at this step (tests of failure handling); None = never
    fail_at_step: Optional[int] = None
    # sleep this long after every step, as if steps were slow (tests that interrupt a run mid-way);
    # a stop signal ends the sleep early
    step_delay_s: float = 0.0
    # only steps below this index sleep (None = every step): a slow start, then full speed
    delay_steps_below: Optional[int] = None


@dataclass
class TrustbenchConfig:
    # MLflow experiment (the sweep name for sweeps)
    experiment: str = "default"
    # random seed of the run (data order, sampling, init of new heads)
    seed: int = 0
    # display label; None = derived from the algorithm and swapped components
    label: Optional[str] = None
    # show a progress bar
    progress: bool = True
    # start this cell afresh even if its MLflow run exists (new run, checkpoint discarded)
    force: bool = False
    estimator: Any = MISSING
    objective: Any = MISSING
    mask: Any = MISSING
    entropy_control: Any = MISSING
    loss_agg: Any = MISSING
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)


# component group -> registry name -> dataclass of its keyword arguments. Option files of a
# component group name their schema ``schema_<registry name>`` in their defaults list.
COMPONENTS: dict[str, dict[str, type]] = {
    "estimator": {
        "grpo": GrpoEstimator,
        "drgrpo": NamedComponent,
        "rloo": NamedComponent,
        "loop": NamedComponent,
        "rfpp": RfppEstimator,
        "rfpp_baseline": NamedComponent,
        "gpg": GpgEstimator,
        "gae": GaeEstimator,
        "egae": GaeEstimator,
    },
    "objective": {
        "clip": ClipObjective,
        "token_is": NamedComponent,
        "gspo": GspoObjective,
        "gpg": NamedComponent,
        "bapo": BapoObjective,
        "troll": TrollObjective,
        "gtpo": GtpoObjective,
    },
    "mask": {
        "none": NamedComponent,
        "trm_max": TrmMaxMask,
        "trm_avg": TrmAvgMask,
        "trm_max_avg": TrmMaxAvgMask,
        "trm_max_k2": TrmMaxMask,
        "trm_avg_k3": TrmAvgMask,
        "trm_max_avg_sample": TrmMaxAvgMask,
        "ln_trm": LnTrmMask,
        "ser": SerMask,
    },
    "entropy_control": {
        "none": NamedComponent,
        "bonus": BonusControl,
        "repo_r": RepoControl,
        "repo_d": RepoControl,
        "adapo": AdapoControl,
    },
    "loss_agg": {
        "token-mean": LossAggConfig,
        "seq-mean-token-mean": LossAggConfig,
        "seq-mean-token-sum": LossAggConfig,
        "seq-mean-token-sum-norm": LossAggConfig,
    },
}


def register_configs() -> None:
    """Register the root schema and every group schema in Hydra's ConfigStore (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="trustbench_schema", node=TrustbenchConfig)
    for group, by_name in COMPONENTS.items():
        for name, node in by_name.items():
            cs.store(group=group, name=f"schema_{name}", node=node)


def component_schema(group: str, name: str) -> type | None:
    """The dataclass of component ``name`` in ``group`` (None for names added by plugins)."""
    return COMPONENTS[group].get(name)
