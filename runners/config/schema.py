"""Structured configs of a cell (the run settings), registered in Hydra's ConfigStore.

The root schema types every plain group (rollout, model, dataset, trainer, ...). Each option file of
a component group (estimator, objective, mask, entropy_control, loss_agg) starts with
``defaults: [schema_<name>]``, the dataclass its registry entry declares (``runners.algorithms``;
the dataclasses and their checks are in ``runners.algorithms.components``). Hydra thus type-checks
every file and rejects unknown keys at compose time; ``runners.config.validate`` then checks values
(ranges, cross-field rules) and names the offending key. A test binds every component option to
its function's signature so config and code cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from runners.algorithms.components import NamedComponent

# ----------------------------------------------------------------------------------------------
# run settings (the algorithm components' dataclasses are in runners/algorithms/components.py)
# ----------------------------------------------------------------------------------------------


# rollout.mode -> its label in run names: "full": every response completes within a step; "truncated":
# T-PPO windows (arXiv 2506.15050)
ROLLOUT_MODES = {"full": "Full", "truncated": "Truncated"}
# launcher.name -> where its cells train: "here" (this machine) or "cluster" (a node the scheduler picks)
LAUNCHERS = {"local": "here", "submitit_local": "here", "slurm": "cluster"}


def launched_here(cfg) -> bool:
    """Whether the cell's launcher trains it on this machine (not on a cluster node)."""
    return LAUNCHERS.get(str(cfg.launcher.name)) == "here"


@dataclass
class RolloutConfig:
    # a key of ROLLOUT_MODES: "full" | "truncated"
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
    # off-policy regimes (built-in backend): sample with the policy this many iterations behind the trained
    # one (asynchronous RL), and/or in this dtype while training keeps the model's (an inference engine in
    # bf16 beside an fp32 trainer); "auto" = the model's dtype
    staleness: int = 0
    dtype: str = "auto"


@dataclass
class AlgorithmConfig:
    # preset name (conf/algorithm/<name>.yaml)
    name: str = MISSING
    # display label in tables and the MLflow UI (e.g. "GRPO")
    label: str = MISSING
    # the components the preset selects (used to label runs that swap one): read from the preset's defaults
    # list (runners.config.preset_components), not written in the preset
    components: dict[str, str] = "${preset_components:${.name}}"


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
    # longest prompt + response the model takes (its config's max_position_embeddings, from its model
    # card); a local model.path's config.json wins; null = unknown, not checked (tiny and embedded: 2048)
    context_length: Optional[int] = None
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
    # precision of log-probs and ratios: fp32 | bf16 (Entropy-preserving RL, arXiv 2603.11682, section 4 ablation)
    logprob_precision: str = "fp32"
    # evaluate every N steps (and before the first and after the last step); 0 = never
    eval_every: int = 10
    # samples per evaluation prompt (mean@n, pass@k and maj@k for k <= n)
    eval_n: int = 4
    # sampling temperature for evaluation
    eval_temperature: float = 1.0
    # save a checkpoint every N steps (and at the end); 0 = only at the end
    checkpoint_every: int = 10
    # after each update, one no-grad forward for actor/post_update_kl and gtpo/conflict_prob_delta
    post_update_diagnostics: bool = True
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
    # start a server on a host other than loopback without authentication when
    # MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD are not set (a private network only)
    trusted_network: bool = False
    # seconds between asynchronous metric flushes
    flush_every_s: float = 5.0


@dataclass
class LauncherConfig:
    # a key of LAUNCHERS: local | submitit_local | slurm
    name: str = "local"
    # local launcher: cells trained at once, each in its own process (1 = one after another in this process)
    parallel: int = 1
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
    # limit on the resident memory of a run's processes, in GiB: passing it ends the run FAILED (resumable)
    # before the machine runs out of memory; null = 90% of what the cell may use (available memory, the
    # cgroup's limit: a container, an enforcing Slurm job; its share of a parallel local sweep); 0 = no limit
    # (runners/memory_guard.py)
    memory_limit_gb: Optional[float] = None
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
    # limits it is capped so that it never comes in a job's first 10 s (runners.cluster.queue.signal_delay)
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
    # verl: its output and Ray's on the terminal too (always in the run's verl/verl.<attempt>.log)
    verbose: bool = False
    # allocate and keep this many MiB more after every step, as if memory leaked (tests of launcher.memory_limit_gb)
    grow_memory_mb: int = 0


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
    rollout_correction: Any = MISSING
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)


def register_configs() -> None:
    """Register the root schema and every component's schema in Hydra's ConfigStore (idempotent).

    A component's schema is declared on its registry entry (``runners.algorithms``); option files of a
    component group name it ``schema_<registry name>`` in their defaults list.
    """
    from runners.algorithms.method import GROUPS

    cs = ConfigStore.instance()
    cs.store(name="trustbench_schema", node=TrustbenchConfig)
    for group, registry in GROUPS.items():
        for name in registry.names():
            cs.store(group=group, name=f"schema_{name}", node=registry.schema(name) or NamedComponent)
