"""The curves of a synthetic run (``analysis.synthetic``): the methods and sweeps they are drawn for, and
one generator per family of metrics (core, timing, perf, roofline, trm, claims, machine load).

Every curve is a closed-form function of the step plus Gaussian noise from a stream seeded by the
experiment, the method's key and the seed, so the same spec always gives the same arrays, and the
parameters of ``SyntheticMethod`` put known effects into them (a higher final success rate, faster
entropy decay, a controller that drifts to its cap, ...).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace

import numpy as np

from runners import metric_names

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
