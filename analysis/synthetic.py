"""Synthetic sweeps logged into a real MLflow store, for tests, benchmarks and report previews.

Design: every curve is a closed-form function of the step plus seeded Gaussian noise, so a test can
recompute any table entry with numpy from the arrays returned by ``log_synthetic_experiment``
(they are exactly what was logged) without calling the analysis code. Runs use the metric names
and tags of ``runners.metric_names`` and are tagged ``trustbench.synthetic=1`` (reports show a banner).
``profile(name)`` gives a sweep shaped like each registered report (``reports.registry``).

    python -m analysis.synthetic troll_table1 --tracking-uri sqlite:///$PWD/.trustbench/mlflow.db
    trustbench report troll_table1
"""

from __future__ import annotations

import argparse
import hashlib
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from analysis.frames import ExperimentData, normalize_metrics
from runners import metric_names

TAG_SYNTHETIC = "trustbench.synthetic"
# response-length buckets of the TRM acceptance metrics and TV position buckets
LENGTH_BUCKETS = ((0, 256), (256, 1024), (1024, 4096), (4096, 8192))
POSITION_BUCKETS = ((0, 64), (64, 256), (256, 1024), (1024, 4096))


@dataclass
class SyntheticMethod:
    """One method of a synthetic sweep: tags, the curve parameters and method-specific params."""

    label: str
    tags: dict[str, str]
    final: float = 0.6  # asymptotic training success
    rate: float = 0.05  # learning speed per step
    entropy0: float = 0.8  # initial token entropy (nats)
    entropy_decay: float = 0.01  # entropy ~ entropy0 * exp(-decay * t)
    violation_p: float = 1e-4  # TRM per-token violation probability (acceptance by length)
    params: dict[str, object] = field(default_factory=dict)
    seed_sd: float = 0.0  # across-seed sd of ``final`` (a per-seed offset on top of the step noise)
    clipfrac: float = 1.5e-3  # level of actor/pg_clipfrac
    # "claims" family: post-update token KL (None: 0.5 eps for TROLL, 2 eps otherwise), conflict-token
    # log-prob change (None: GTPO +0.002, GRPO -0.02, others not logged), ADAPO's eps_high drift over the run
    post_update_kl: float | None = None
    # share of tokens with post-update KL above TROLL's eps (None: 0.002 for TROLL, 0.04 otherwise), and the
    # across-seed spread of that share (log-normal sd)
    kl_over_eps: float | None = None
    kl_over_eps_seed_sd: float = 0.15
    # the same share measured from the sampling policy (``..._sampler_frac_above_<e>``, logged by stale or
    # lower-precision runs), with the same seed and step noise; None: not logged
    kl_over_eps_sampler: float | None = None
    conflict_delta: float | None = None
    eps_high_drift: float = 0.03
    # "timing" family: CPU seconds per uncontended wall second, wall-time inflation by other load, machine load
    cpu_per_wall: float = 1.0
    contention: float = 1.0
    load: float = 1.0
    cpus: int = 2
    # "stability" knobs (off by default: nothing extra is logged): REPO-R's zeta growing as
    # zeta0 * exp(zeta_growth * t / steps) within entropy_control.zeta_min/max; rollout_corr/kl starting at
    # ``gap`` and multiplied by ``gap_growth`` over the run; the training score falling linearly to
    # (1 - reward_collapse) of its curve over the second half of the run
    zeta_growth: float | None = None
    gap: float | None = None
    gap_growth: float = 1.0
    reward_collapse: float = 0.0

    @property
    def regime(self) -> str | None:
        """The off-policy regime tag (``metric_names.TAG_REGIME``), None when the method has none."""
        return self.tags.get(metric_names.TAG_REGIME)

    @property
    def key(self) -> str:
        """The method's identity in a sweep: its label, with the regime when tagged ("GRPO | stale k=2");
        run ids, run names and the noise streams derive from it."""
        return self.label if self.regime is None else f"{self.label} | {self.regime}"


def with_regime(method: SyntheticMethod, regime: str, **changes: object) -> SyntheticMethod:
    """``method`` in an off-policy ``regime`` (tagged), with its curve parameters changed by ``changes``."""
    return replace(method, tags={**method.tags, metric_names.TAG_REGIME: regime}, **changes)


@dataclass
class SyntheticSpec:
    experiment: str
    methods: list[SyntheticMethod]
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 60
    eval_every: int = 10
    eval_sets: tuple[str, ...] = ("dapo_eval",)
    model: str = "qwen3-8b"
    dataset: str = "dapo_math"
    families: frozenset[str] = frozenset({"core", "timing", "perf", "claims"})  # + "trm", "roofline"
    noise: float = 0.02
    # "roofline" family: the machine's (peak TFLOP/s, memory TB/s) the runs log; default an H100's BF16 row
    ceiling: tuple[float, float] = (989.4, 3.35)


def _rng(*keys: object) -> np.random.Generator:
    digest = hashlib.sha256("|".join(map(str, keys)).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def generate_run(spec: SyntheticSpec, method: SyntheticMethod, seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """All curves of one run: {metric: (steps [S] int, values [S] float)} (steps start at 1)."""
    rng = _rng(spec.experiment, method.key, seed)
    steps = np.arange(1, spec.steps + 1)
    t = steps.astype(float)

    def noisy(x: np.ndarray, scale: float = spec.noise, lo: float = 0.0, hi: float = np.inf) -> np.ndarray:
        return np.clip(x + rng.normal(0.0, scale, size=x.shape), lo, hi)

    # the method's level for this seed: seeds differ by more than step noise in real sweeps
    final = method.final + method.seed_sd * float(_rng(spec.experiment, method.key, seed, "seed").normal())
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    _core(out, spec, method, final, steps, noisy)
    if "timing" in spec.families:
        _timing(out, method, steps, noisy)
    if "perf" in spec.families:
        objective = method.tags.get(metric_names.TAG_OBJECTIVE, "clip")
        base = 25.0 + (1.8 if objective == "troll" else 0.0) + (-0.6 if "chunk" in method.label.lower() else 0.0)
        out[metric_names.MAX_MEMORY_ALLOCATED_GB] = (steps, noisy(np.full_like(t, base), 0.2, lo=0.1))
    if "roofline" in spec.families:
        _roofline(out, spec, method, steps, noisy)
    if "trm" in spec.families:
        _trm(out, method, steps, noisy)
    if "claims" in spec.families:
        _claim_metrics(out, spec, method, steps, rng)
    if "timing" in spec.families:
        _machine(out, method, steps, noisy)
    return out


def _core(out: dict, spec: SyntheticSpec, method: SyntheticMethod, final: float, steps: np.ndarray, noisy) -> None:
    """Training score, evaluations, entropy, response length and the clip/projection fraction."""
    t = steps.astype(float)
    learn = 1.0 - np.exp(-method.rate * t)
    half = spec.steps / 2.0
    fall = 1.0 - method.reward_collapse * np.clip((t - half) / max(half, 1.0), 0.0, 1.0)
    out[metric_names.SCORE_MEAN] = (steps, noisy(final * learn * fall, hi=1.0))
    eval_steps = np.unique(np.r_[0, steps[steps % spec.eval_every == 0]])
    for k, data in enumerate(spec.eval_sets):
        scale = 0.95 - 0.08 * k
        x = final * scale * (1.0 - np.exp(-method.rate * eval_steps)) + 0.05
        out[metric_names.val_acc_mean(data, 1)] = (eval_steps, noisy(x, hi=1.0))
    out[metric_names.ENTROPY] = (steps, noisy(method.entropy0 * np.exp(-method.entropy_decay * t), 0.01, lo=1e-3))
    out[metric_names.RESPONSE_LENGTH_MEAN] = (steps, noisy(200.0 + 150.0 * learn, 5.0, lo=1.0))
    if method.tags.get(metric_names.TAG_OBJECTIVE, "clip") == "troll":
        out[metric_names.TROLL_PROJECTED_FRAC] = (
            steps,
            noisy(np.full_like(t, 2e-3) * (1 + t / spec.steps), 2e-4, lo=0.0),
        )
        out[metric_names.TROLL_KEPT_TOKENS] = (steps, noisy(np.full_like(t, 7.0), 0.5, lo=1.0))
    else:
        out[metric_names.PG_CLIPFRAC] = (steps, noisy(np.full_like(t, method.clipfrac), method.clipfrac / 7.5, lo=0.0))


def _phase_means(method: SyntheticMethod) -> dict[str, float]:
    """Uncontended wall seconds per step of each phase (T-PPO generates in windows: 2.5x shorter)."""
    critic = method.tags.get(metric_names.TAG_ESTIMATOR) in ("gae", "egae")
    truncated = method.tags.get(metric_names.TAG_ALGORITHM) == "tppo"
    troll = method.tags.get(metric_names.TAG_OBJECTIVE, "clip") == "troll"
    return {
        metric_names.TIMING_GEN: 12.0 / (2.5 if truncated else 1.0),
        metric_names.TIMING_OLD_LOG_PROB: 2.0,
        metric_names.TIMING_UPDATE_ACTOR: 5.0 + (1.0 if troll else 0.0),
        metric_names.TIMING_UPDATE_CRITIC: 3.0 if critic else 0.0,
    }


def _timing(out: dict, method: SyntheticMethod, steps: np.ndarray, noisy) -> None:
    """Wall time per phase and step (x ``contention``) and CPU time beside it (x ``cpu_per_wall``, uncontended)."""
    t = steps.astype(float)
    total = np.zeros_like(t)
    for name, mean in _phase_means(method).items():
        if mean > 0:
            vals = noisy(np.full_like(t, mean), 0.3, lo=0.01)
            out[name] = (steps, vals * method.contention)
            total += vals
    rest = noisy(np.full_like(t, 0.5), 0.05, lo=0.0)
    out[metric_names.TIMING_STEP] = (steps, (total + rest) * method.contention)
    for name in (*metric_names.TIMING_PHASES, metric_names.TIMING_STEP):
        if name in out:
            out[metric_names.timing_cpu(name)] = (steps, out[name][1] / method.contention * method.cpu_per_wall)


def _roofline(out: dict, spec: SyntheticSpec, method: SyntheticMethod, steps: np.ndarray, noisy) -> None:
    """Per-phase Roofline points (rollout below the ridge, the update above it), the ceilings, MFU.

    Intensities scale with ``spec.ceiling``'s ridge (T-PPO's 85 / 249 FLOP/byte rollout on an H100-class
    ridge of 295); each phase runs at a fixed fraction of its attainable rate.
    """
    t = steps.astype(float)
    peak, bandwidth = spec.ceiling
    ridge = peak / bandwidth
    rollout = (250.0 if method.tags.get(metric_names.TAG_ALGORITHM) == "tppo" else 85.0) * ridge / 295.0
    for phase, ai, efficiency in (
        ("rollout", rollout, 0.6),
        ("old_log_prob", 1.5 * ridge, 0.5),
        ("update_actor", 2.0 * ridge, 0.4),
    ):
        x = noisy(np.full_like(t, ai), 0.05 * ai, lo=1e-3)
        y = noisy(np.minimum(peak, x * bandwidth) * efficiency, 0.02 * peak, lo=1e-6 * peak)
        out[metric_names.arithmetic_intensity(phase)] = (steps, x)
        out[metric_names.achieved_tflops(phase)] = (steps, y)
    out[metric_names.MFU_ACTOR] = (steps, out[metric_names.achieved_tflops("update_actor")][1] / peak)
    out[metric_names.PEAK_TFLOPS] = (steps, np.full_like(t, peak))
    out[metric_names.PEAK_MEM_BW_TBS] = (steps, np.full_like(t, bandwidth))


def _machine(out: dict, method: SyntheticMethod, steps: np.ndarray, noisy) -> None:
    t = steps.astype(float)
    out[metric_names.LOAD_AVG_1M] = (steps, noisy(np.full_like(t, method.load), 0.1 * method.load, lo=0.0))
    out[metric_names.CPU_COUNT_AVAILABLE] = (steps, np.full_like(t, float(method.cpus)))


def _trm(out: dict, method: SyntheticMethod, steps: np.ndarray, noisy) -> None:
    t = steps.astype(float)
    p = method.violation_p
    accept_buckets = []
    for lo, hi in LENGTH_BUCKETS:
        mid = 0.5 * (lo + hi)
        vals = noisy(np.full_like(t, (1.0 - p) ** mid), 0.01, hi=1.0)
        out[metric_names.trm_accept_rate_bucket(lo, hi)] = (steps, vals)
        accept_buckets.append(vals)
    out[metric_names.TRM_ACCEPT_RATE] = (steps, np.mean(accept_buckets, axis=0))
    out[metric_names.TRM_PPL_GAP] = (steps, noisy(np.full_like(t, 0.01 + 50 * p), 0.002, lo=0.0))
    out[metric_names.TRM_MAX_KL] = (steps, noisy(np.full_like(t, 2e-4 + p), 1e-5, lo=0.0))
    out[metric_names.TRM_MEAN_KL] = (steps, noisy(np.full_like(t, 1e-5 + p / 10), 1e-6, lo=0.0))
    for lo, hi in POSITION_BUCKETS:
        out[metric_names.trm_tv_position_bucket(lo, hi)] = (
            steps,
            noisy(np.full_like(t, 2e-3 / (1 + lo / 256)), 1e-4, lo=0.0, hi=1.0),
        )


def objective_eps(method: SyntheticMethod) -> float:
    """The ``objective.eps`` param of a synthetic run: TROLL's trust region 0.05, else the clip range 0.2."""
    default = 0.05 if method.tags.get(metric_names.TAG_OBJECTIVE, "clip").startswith("troll") else 0.2
    return float(method.params.get("objective.eps", default))


def _claim_metrics(out: dict, spec: SyntheticSpec, method: SyntheticMethod, steps: np.ndarray, rng) -> None:
    """Post-update KL, GTPO conflict-token log-prob change and ADAPO's eps_high (the paper-claim metrics).

    Defaults: post-update KL at 0.5 eps (TROLL's eps 0.05) for TROLL, 2 eps otherwise, log-normal
    10% step noise; the share of tokens above eps (``_kl_shares``); conflict log-prob change +0.002 for GTPO, -0.02 for GRPO (sd 0.005 per step),
    not logged by other methods; eps_high of ADAPO from 0.28 drifting by ``eps_high_drift`` (+-10% per
    seed) within [0.2, 0.32], not logged by methods without ADAPO.
    """
    t = steps.astype(float)
    tags = method.tags
    troll = tags.get(metric_names.TAG_OBJECTIVE, "clip").startswith("troll")
    eps = objective_eps(method) if troll else 0.05
    level = method.post_update_kl if method.post_update_kl is not None else (0.5 if troll else 2.0) * eps
    kl = level * np.exp(rng.normal(0.0, 0.1, size=t.shape))
    out[metric_names.POST_UPDATE_KL] = (steps, kl)
    if troll:
        out[metric_names.TROLL_KL_AFTER] = (steps, np.minimum(kl, eps))
    _kl_shares(out, method, steps, rng, eps, troll)
    algorithm = tags.get(metric_names.TAG_ALGORITHM)
    delta = method.conflict_delta
    if delta is None and algorithm in ("gtpo", "grpo"):
        delta = 0.002 if algorithm == "gtpo" else -0.02
    if delta is not None:
        out[metric_names.GTPO_CONFLICT_PROB_DELTA] = (steps, delta + rng.normal(0.0, 0.005, size=t.shape))
    if tags.get(metric_names.TAG_ENTROPY_CONTROL) == "adapo" or algorithm == "adapo":
        drift = method.eps_high_drift * (1.0 + 0.1 * float(rng.normal()))
        out[metric_names.ENTROPY_EPS_HIGH] = (steps, np.clip(0.28 + drift * t / spec.steps, 0.2, 0.32))
    if method.zeta_growth is not None:
        lo, hi = float(method.params["entropy_control.zeta_min"]), float(method.params["entropy_control.zeta_max"])
        out[metric_names.ENTROPY_ZETA] = (steps, np.clip(1e-3 * np.exp(method.zeta_growth * t / spec.steps), lo, hi))
    if method.gap is not None:
        growth = method.gap_growth ** (t / spec.steps)
        out[metric_names.ROLLOUT_CORR_KL] = (steps, method.gap * growth * np.exp(rng.normal(0.0, 0.1, size=t.shape)))


def _kl_shares(out: dict, method: SyntheticMethod, steps: np.ndarray, rng, eps: float, troll: bool) -> None:
    """``actor/post_update_kl_frac_above_<e>``: the share above ``eps`` (``kl_over_eps`` times a per-seed
    log-normal factor and 10% step noise), and share(e) = share(eps) ** (e / eps) at the other thresholds
    (an exponential tail: larger thresholds, smaller shares); from the sampling policy too where
    ``kl_over_eps_sampler`` is set."""
    share = method.kl_over_eps if method.kl_over_eps is not None else (0.002 if troll else 0.04)
    seed_factor = float(np.exp(rng.normal(0.0, method.kl_over_eps_seed_sd)))
    step_noise = np.exp(rng.normal(0.0, 0.1, size=steps.shape))
    centres = {False: share} if method.kl_over_eps_sampler is None else {False: share, True: method.kl_over_eps_sampler}
    for sampler, level in centres.items():
        at_eps = np.clip(level * seed_factor * step_noise, 1e-9, 1.0)
        for e in metric_names.POST_UPDATE_KL_THRESHOLDS:
            out[metric_names.post_update_kl_frac_above(e, sampler=sampler)] = (steps, at_eps ** (e / eps))


def run_params(spec: SyntheticSpec, method: SyntheticMethod, seed: int) -> dict[str, object]:
    """The flattened config params a synthetic run logs (what differs between methods shows in the config diff)."""
    return {
        "seed": seed,
        "model.name": spec.model,
        "dataset.name": spec.dataset,
        "trainer.total_steps": spec.steps,
        "trainer.test_freq": spec.eval_every,
        "algorithm.name": method.tags.get(metric_names.TAG_ALGORITHM, method.label),
        "algorithm.objective": method.tags.get(metric_names.TAG_OBJECTIVE, "clip"),
        "algorithm.mask": method.tags.get(metric_names.TAG_MASK, "none"),
        "objective.eps": objective_eps(method),
        "optim.lr": 1e-6,
        **method.params,
    }


def log_synthetic_experiment(tracking_uri: str, spec: SyntheticSpec) -> dict[tuple[str, int], dict]:
    """Log ``spec`` into ``tracking_uri``; returns {(method key, seed): {"run_id", "curves"}} (``SyntheticMethod.key``)."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(spec.experiment)
    if exp is None:
        from runners.mlflow_ui import experiment_tags
        from runners.paths import artifact_root

        exp_id = client.create_experiment(
            spec.experiment, artifact_location=(artifact_root() / spec.experiment).as_uri(), tags=experiment_tags()
        )
    else:
        exp_id = exp.experiment_id
    truth = {}
    for method in spec.methods:
        for seed in spec.seeds:
            tags = {
                metric_names.TAG_METHOD: method.label,
                metric_names.TAG_MODEL: spec.model,
                metric_names.TAG_DATASET: spec.dataset,
                metric_names.TAG_SEED: str(seed),
                metric_names.TAG_SWEEP: spec.experiment,
                metric_names.TAG_BACKEND: "synthetic",
                TAG_SYNTHETIC: "1",
                **method.tags,
            }
            run = client.create_run(exp_id, run_name=f"{method.key}-s{seed}", tags=tags)
            run_id = run.info.run_id
            params = run_params(spec, method, seed)
            client.log_batch(run_id, params=[Param(k, str(v)) for k, v in params.items()])
            curves = generate_run(spec, method, seed)
            points = [
                Metric(key, float(v), 1_700_000_000_000 + int(s) * 1000, int(s))
                for key, (steps, values) in curves.items()
                for s, v in zip(steps, values)
            ]
            for i in range(0, len(points), 1000):
                client.log_batch(run_id, metrics=points[i : i + 1000])
            client.set_terminated(run_id)
            truth[(method.key, seed)] = {"run_id": run_id, "curves": curves}
    return truth


def synthetic_data(spec: SyntheticSpec) -> tuple[ExperimentData, dict[tuple[str, int], dict]]:
    """The frames ``load_experiment`` would return for ``spec`` once logged, built in memory
    (for tests of tables and reports that do not exercise MLflow); run ids are "<key>-s<seed>" (the method's
    label, with " | <regime>" when it has a regime tag)."""
    runs, points, truth = [], [], {}
    for i, method in enumerate(spec.methods):
        for seed in spec.seeds:
            run_id = f"{method.key}-s{seed}"
            tags = {
                metric_names.TAG_METHOD: method.label,
                metric_names.TAG_MODEL: spec.model,
                metric_names.TAG_DATASET: spec.dataset,
                metric_names.TAG_SEED: str(seed),
                metric_names.TAG_SWEEP: spec.experiment,
                TAG_SYNTHETIC: "1",
                **method.tags,
            }
            runs.append(
                {
                    "run_id": run_id,
                    "experiment": spec.experiment,
                    "experiment_id": "0",
                    "run_name": run_id,
                    "status": "FINISHED",
                    "start_time": i,
                    "end_time": i + 1,
                    **{f"tags.{k}": v for k, v in tags.items()},
                    **{f"params.{k}": str(v) for k, v in run_params(spec, method, seed).items()},
                }
            )
            curves = generate_run(spec, method, seed)
            for key, (steps, values) in curves.items():
                points.append(
                    pd.DataFrame(
                        {"run_id": run_id, "metric": key, "step": steps, "value": values, "timestamp": steps * 1000}
                    )
                )
            truth[(method.key, seed)] = {"run_id": run_id, "curves": curves}
    metrics = normalize_metrics(pd.concat(points, ignore_index=True))
    return ExperimentData(runs=pd.DataFrame(runs), metrics=metrics), truth


def _m(label: str, algorithm: str, objective: str = "clip", estimator: str | None = None, **kw) -> SyntheticMethod:
    tags = {metric_names.TAG_ALGORITHM: algorithm, metric_names.TAG_OBJECTIVE: objective}
    tags[metric_names.TAG_ESTIMATOR] = estimator or {"ppo": "gae", "tppo": "egae", "gspo": "grpo"}.get(
        algorithm, algorithm
    )
    for key in (metric_names.TAG_MASK, metric_names.TAG_ENTROPY_CONTROL, metric_names.TAG_ROLLOUT_CORRECTION):
        if key in kw:
            tags[key] = kw.pop(key)
    return SyntheticMethod(label, tags, **kw)


ADAPO_CAPS = {"entropy_control.eps_high_min": 0.2, "entropy_control.eps_high_max": 0.32}
REPO_R_CAPS = {"entropy_control.zeta_min": 1e-4, "entropy_control.zeta_max": 0.05}


def stability_methods() -> list[SyntheticMethod]:
    """The stability map's known effects, over three regimes (on-policy, stale k=4, bfloat16 sampler):
    GRPO+TROLL = GRPO on-policy and in bf16 but +0.1 final success when stale; GRPO+TRM-Max +0.03 in bf16
    only; GRPO's entropy and training reward collapse and its training-inference gap blows up when stale;
    ADAPO's eps_high and REPO-R's zeta are pinned at their max cap when stale; the gap is logged off-policy
    only."""
    on, stale, bf16 = "on-policy", "stale k=4", "bfloat16 sampler"
    grpo = _m("GRPO", "grpo", final=0.5, seed_sd=0.02)
    troll = _m("GRPO+TROLL", "grpo", "troll", final=0.5, seed_sd=0.02)
    trm = _m("GRPO+TRM-Max", "grpo", "token_is", mask="trm_max", final=0.5, seed_sd=0.02)
    adapo = _m("ADAPO", "adapo", final=0.5, entropy_control="adapo", params=dict(ADAPO_CAPS), seed_sd=0.02)
    repo = _m("REPO-R", "repo_r", final=0.5, entropy_control="repo_r", params=dict(REPO_R_CAPS), zeta_growth=0.0)
    out = []
    for method in (grpo, troll, trm, adapo, repo):
        out += [
            with_regime(method, on),
            with_regime(method, stale, gap=0.002, gap_growth=1.5),
            with_regime(method, bf16, gap=0.001),
        ]
    changes = {
        ("GRPO", stale): {"entropy_decay": 0.06, "gap_growth": 50.0, "reward_collapse": 1.0},
        ("GRPO+TROLL", stale): {"final": 0.6},
        ("GRPO+TRM-Max", bf16): {"final": 0.53},
        ("ADAPO", stale): {"eps_high_drift": 0.2},
        ("REPO-R", stale): {"zeta_growth": 8.0},
    }
    return [replace(m, **changes.get((m.label, m.regime), {})) for m in out]


def profile(experiment: str, steps: int = 60, seeds: tuple[int, ...] = (0, 1, 2)) -> SyntheticSpec:
    """A synthetic sweep shaped like the report registered for ``experiment`` (generic otherwise)."""
    math7 = ("aime24", "aime25", "amc", "math500", "omni_math", "olympiadbench", "minerva")
    specs = {
        "demo": SyntheticSpec(
            "demo",
            [
                _m("GRPO", "grpo", final=0.5, violation_p=1e-3, seed_sd=0.02),
                _m("GRPO+TROLL", "grpo", "troll", final=0.6, rate=0.08, violation_p=1e-3, seed_sd=0.02),
                _m("GRPO+TRM-Max", "grpo", "token_is", mask="trm_max", final=0.52, violation_p=1e-4, seed_sd=0.02),
                _m("GTPO", "gtpo", "gtpo", final=0.52, violation_p=1e-3, seed_sd=0.02),
                _m("REPO-R", "repo_r", final=0.5, entropy_decay=0.0, entropy_control="repo_r", seed_sd=0.02),
                _m("DAPO", "dapo", final=0.5, entropy_decay=-0.01, seed_sd=0.02),
                _m("ADAPO", "adapo", final=0.51, entropy_decay=0.0, entropy_control="adapo", clipfrac=2.5e-3),
            ],
            eval_sets=("embedded_test",),
            model="tiny-qwen2",
            dataset="embedded",
            families=frozenset({"core", "timing", "perf", "claims", "trm"}),
        ),
        "troll_table1": SyntheticSpec(
            "troll_table1",
            [
                _m("GRPO", "grpo", final=0.62),
                _m("GRPO+TROLL", "grpo", "troll", final=0.7, rate=0.08),
                _m("Dr.GRPO", "drgrpo", final=0.64),
                _m("Dr.GRPO+TROLL", "drgrpo", "troll", final=0.7, rate=0.08),
                _m("GSPO", "gspo", final=0.2),
                _m("GSPO+TROLL", "gspo", "troll", final=0.7, rate=0.08),
            ],
            eval_sets=("dapo_eval", "math_eval"),
            families=frozenset({"core", "timing", "perf", "claims"}),
        ),
        "troll_table4": SyntheticSpec(
            "troll_table4",
            [_m("GRPO", "grpo", final=0.55), _m("GRPO+TROLL", "grpo", "troll", final=0.62, rate=0.08)],
            eval_sets=math7,
        ),
        "troll_table5": SyntheticSpec(
            "troll_table5",
            [
                _m("GRPO", "grpo"),
                _m("GRPO+TROLL", "grpo", "troll"),
                _m("GRPO+TROLL (chunked)", "grpo", "troll", params={"algorithm.troll.chunk_size": 1024}),
            ],
            model="qwen3-1.7b",
            dataset="gsm8k",
            eval_sets=("gsm8k",),
        ),
        "entropy_tables": SyntheticSpec(
            "entropy_tables",
            [
                _m("RLOO", "rloo", final=0.5, entropy_decay=0.002),
                _m("GRPO", "grpo", final=0.47, entropy_decay=0.02),
                _m("DAPO", "dapo", final=0.45, entropy_decay=-0.01),
                _m("ADAPO", "adapo", final=0.46, entropy_decay=0.0, entropy_control="adapo", clipfrac=2.5e-3),
                _m("REPO-R", "repo_r", final=0.48, entropy_decay=-0.001, entropy_control="repo_r"),
            ],
            eval_sets=("aime24", "aime25"),
            dataset="dapo_math",
        ),
        "tppo_table1": SyntheticSpec(
            "tppo_table1",
            [_m("PPO", "ppo", final=0.5), _m("T-PPO", "tppo", final=0.6, rate=0.07)],
            eval_sets=("aime24",),
            model="qwen2.5-32b",
            families=frozenset({"core", "timing", "perf", "roofline", "claims"}),
        ),
        "stability_map": SyntheticSpec(
            "stability_map",
            stability_methods(),
            eval_sets=("embedded_test",),
            model="tiny-qwen2",
            dataset="embedded",
            families=frozenset({"core", "claims"}),
        ),
        "trm_acceptance": SyntheticSpec(
            "trm_acceptance",
            [
                _m("Token-IS", "token_is", "token_is", mask="none", violation_p=1e-3),
                _m("PPO-Clip", "grpo", "clip", mask="none", violation_p=1e-3),
                _m("TRM-Max", "grpo", "token_is", mask="trm_max", violation_p=1e-4),
                _m("TRM-Avg", "grpo", "token_is", mask="trm_avg", violation_p=2e-4),
                _m("PPO-Clip + TIS", "grpo", "clip", mask="none", rollout_correction="token_tis", violation_p=1e-3),
            ],
            eval_sets=("aime25",),
            model="qwen3-8b-base",
            families=frozenset({"core", "timing", "trm"}),
        ),
    }
    base = experiment[: -len("_cpu")] if experiment.endswith("_cpu") else experiment  # CPU-scale variants
    spec = (
        replace(specs[base], experiment=experiment) if base in specs else replace(specs["demo"], experiment=experiment)
    )
    return replace(spec, steps=steps, seeds=seeds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Log a synthetic sweep shaped like a registered report.")
    parser.add_argument("experiment")
    parser.add_argument("--tracking-uri", default=None)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args(argv)
    from runners.paths import default_tracking_uri

    uri = args.tracking_uri or default_tracking_uri()
    truth = log_synthetic_experiment(uri, profile(args.experiment, args.steps, tuple(range(args.seeds))))
    print(f"logged {len(truth)} synthetic runs into experiment {args.experiment!r} at {uri}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
