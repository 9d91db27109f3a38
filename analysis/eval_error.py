"""Evaluation sampling error: how much of a final pass@1 (and of a difference between methods) comes from
evaluating on a finite set of prompts, from the per-prompt results the built-in trainer logs.

Why: every run of a sweep evaluates on the same held-out prompts (``n`` samples each), and the report's
intervals are over seeds only: a method's pass@1 on 128 prompts also carries the error of those 128 prompts
standing for the task. Since the prompts are shared, the difference between two methods can be bootstrapped
over prompts *paired*: prompt j is resampled jointly for both methods, so the difficulty the two share cancels.

Data: the artifact ``runners.metric_names.per_prompt_artifact(step)`` of each run's FINAL evaluation (the
step of ``analysis.aggregate.final_evals``, the rule every table uses), holding per data source each prompt's
key and its ``n`` sample scores. Runs without it (older runs, the verl backend) are left out.

Statistics, for one method with seeds s and prompts j, ``x[s, j]`` = the mean score of prompt j in seed s's
final evaluation (all numpy, a fixed seed, ``B`` bootstrap draws):

- pass@1: ``mean_s mean_j x[s, j]`` (the report's final value: the mean over seeds of each run's pass@1);
- eval-sampling interval: percentile bootstrap resampling prompts only, the same prompt indices for every
  seed, seeds fixed (``prompt_draws``);
- difference to the baseline, on the seeds both ran (paired by seed): ``d[s, j] = a[s, j] - b[s, j]``; its
  paired per-prompt bootstrap resamples prompt indices shared by both methods, seeds fixed
  (``paired_prompt_draws``); the two-level bootstrap resamples the paired seeds, then the prompts
  (``two_level_draws``): the combined uncertainty of seeds and prompts.

    from analysis.eval_error import arm_error, diff_error
    arm_error(x)          # x [S, J]: ArmError(pass1, lo, hi, seeds, prompts)
    diff_error(a, b)      # a, b [S, J] on paired seeds: DiffError(diff, lo, hi, two_lo, two_hi, seeds)
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from analysis.aggregate import final_evals
from analysis.arms import run_labels
from analysis.frames import ExperimentData
from runners import metric_names

N_BOOT = 2000
LEVEL = 0.95
SEED = 0
# a run whose artifact's mean differs from its logged final pass@1 by more than this is not used
MATCH_TOLERANCE = 1e-9

Reader = Callable[[str, int], "Mapping | None"]


# -- statistics (pure functions of arrays) -----------------------------------------------------------------
def percentile_interval(draws: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """The percentile interval of bootstrap draws: their (1 - level) / 2 and (1 + level) / 2 quantiles."""
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(np.asarray(draws, dtype=float), [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def _matrix(x) -> np.ndarray:
    m = np.asarray(x, dtype=float)
    if m.ndim != 2 or m.shape[0] < 1 or m.shape[1] < 1:
        raise ValueError(f"expected a [seeds, prompts] array with at least one of each, got shape {m.shape}")
    return m


def prompt_draws(x, n_boot: int = N_BOOT, rng: np.random.Generator | None = None) -> np.ndarray:
    """[B] bootstrap draws of ``mean_s mean_j x[s, j]`` with the prompts resampled (the same indices for every
    seed) and the seeds fixed. x: [S, J]. Linear in x, so one draw is the mean of the per-prompt seed means
    ``mean_s x[s, j]`` over the drawn prompts."""
    m = _matrix(x)
    rng = np.random.default_rng(SEED) if rng is None else rng
    per_prompt = m.mean(axis=0)  # [J]
    idx = rng.integers(0, m.shape[1], size=(n_boot, m.shape[1]))
    return per_prompt[idx].mean(axis=1)


def paired_prompt_draws(a, b, n_boot: int = N_BOOT, rng: np.random.Generator | None = None) -> np.ndarray:
    """[B] draws of the difference ``mean(a) - mean(b)`` with each prompt resampled jointly for both methods;
    a, b: [S, J] on the same (paired) seeds and the same prompts, seeds fixed."""
    a, b = _matrix(a), _matrix(b)
    if a.shape != b.shape:
        raise ValueError(f"paired arrays must have the same [seeds, prompts] shape, got {a.shape} and {b.shape}")
    return prompt_draws(a - b, n_boot, rng)


def two_level_draws(a, b, n_boot: int = N_BOOT, rng: np.random.Generator | None = None) -> np.ndarray:
    """[B] draws of ``mean(a) - mean(b)`` from a two-level bootstrap: the paired seeds resampled (a seed's row
    of both methods together), then the prompts (the same indices for every drawn seed and both methods)."""
    a, b = _matrix(a), _matrix(b)
    if a.shape != b.shape:
        raise ValueError(f"paired arrays must have the same [seeds, prompts] shape, got {a.shape} and {b.shape}")
    rng = np.random.default_rng(SEED) if rng is None else rng
    d = a - b
    n_seeds, n_prompts = d.shape
    seeds = rng.integers(0, n_seeds, size=(n_boot, n_seeds))
    weights = np.zeros((n_boot, n_seeds))
    np.add.at(weights, (np.arange(n_boot)[:, None], seeds), 1.0 / n_seeds)
    per_prompt = weights @ d  # [B, J]: each draw's seed mean of every prompt
    idx = rng.integers(0, n_prompts, size=(n_boot, n_prompts))
    return np.take_along_axis(per_prompt, idx, axis=1).mean(axis=1)


@dataclass(frozen=True)
class ArmError:
    """A method's final pass@1 and its eval-sampling interval (prompts resampled, seeds fixed)."""

    pass1: float
    lo: float
    hi: float
    seeds: int
    prompts: int


@dataclass(frozen=True)
class DiffError:
    """Method minus baseline on paired seeds: the paired per-prompt bootstrap interval (seeds fixed) and the
    two-level one (seeds, then prompts)."""

    diff: float
    lo: float
    hi: float
    two_lo: float
    two_hi: float
    seeds: int
    prompts: int


def arm_error(x, n_boot: int = N_BOOT, seed: int = SEED, level: float = LEVEL) -> ArmError:
    """pass@1 = ``mean_s mean_j x[s, j]`` and its percentile interval over ``prompt_draws``; x: [S, J]."""
    m = _matrix(x)
    lo, hi = percentile_interval(prompt_draws(m, n_boot, np.random.default_rng(seed)), level)
    return ArmError(float(m.mean(axis=1).mean()), lo, hi, m.shape[0], m.shape[1])


def diff_error(a, b, n_boot: int = N_BOOT, seed: int = SEED, level: float = LEVEL) -> DiffError:
    """``mean(a) - mean(b)`` with its paired per-prompt and its two-level intervals; a, b: [S, J] on paired seeds."""
    a, b = _matrix(a), _matrix(b)
    lo, hi = percentile_interval(paired_prompt_draws(a, b, n_boot, np.random.default_rng(seed)), level)
    two_lo, two_hi = percentile_interval(two_level_draws(a, b, n_boot, np.random.default_rng(seed)), level)
    diff = float((a.mean(axis=1) - b.mean(axis=1)).mean())
    return DiffError(diff, lo, hi, two_lo, two_hi, a.shape[0], a.shape[1])


# -- reading the artifacts ---------------------------------------------------------------------------------
def valid_payload(payload: object, step: int) -> bool:
    """Whether ``payload`` is a per-prompt artifact of the evaluation at ``step`` (``runners.metric_names``)."""
    if not isinstance(payload, Mapping) or payload.get("step") != step:
        return False
    sources = payload.get("sources")
    if not isinstance(sources, Mapping):
        return False
    for entry in sources.values():
        keys, scores = (entry.get("keys"), entry.get("scores")) if isinstance(entry, Mapping) else (None, None)
        if not isinstance(keys, list) or not isinstance(scores, list) or len(keys) != len(scores):
            return False
        if not all(isinstance(row, list) and row for row in scores):
            return False
    return True


def mlflow_reader(tracking_uri: str) -> Reader:
    """``read(run_id, step)``: the run's per-prompt artifact of the evaluation at ``step`` from the tracking
    store, or None where the run has none (or it cannot be read, or is not such an artifact)."""
    from mlflow import MlflowClient
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    from runners.paths import sqlite_path

    db = sqlite_path(tracking_uri)
    if db is not None and not db.exists():  # never create a store by reading one
        return lambda run_id, step: None
    client = MlflowClient(tracking_uri)

    def read(run_id: str, step: int) -> Mapping | None:
        try:
            repo = get_artifact_repository(client.get_run(run_id).info.artifact_uri, tracking_uri=tracking_uri)
            with tempfile.TemporaryDirectory(prefix="trustbench-per-prompt-") as tmp:
                local = os.path.join(tmp, "per_prompt.json")
                # one request for one file (download_artifacts lists the path first), as analysis.sources does
                repo._download_file(metric_names.per_prompt_artifact(step), local)
                with open(local) as f:
                    payload = json.load(f)
        except Exception:  # noqa: BLE001 - absent (an older run, the verl backend) or unreadable: left out
            return None
        return payload if valid_payload(payload, step) else None

    return read


@dataclass
class PromptScores:
    """Per-prompt means of the final evaluations of one evaluation set, per method and seed."""

    x: dict[str, dict[int, np.ndarray]]  # {arm: {seed: [J] prompt means}}, prompts in ``keys`` order
    keys: list
    steps: list[int]  # the final-evaluation steps of the runs used
    samples: list[int]  # the samples per prompt of the runs used
    runs: int  # runs with a final evaluation
    used: int  # of those, runs whose artifact was read and matches the logged final value
    missing: int  # of those, runs without per-prompt results of their final evaluation
    notes: list[str] = field(default_factory=list)


def _prompt_means(entry: Mapping) -> tuple[list, np.ndarray]:
    return list(entry["keys"]), np.array([np.mean(np.asarray(row, dtype=float)) for row in entry["scores"]])


def _aligned(found: dict[str, tuple[list, np.ndarray]]) -> tuple[list, dict[str, np.ndarray], list[str]]:
    """The prompts every run evaluated (in the first run's order) and each run's means on them."""
    first = next(iter(found.values()))[0]
    common = set(first)
    for keys, _ in found.values():
        common &= set(keys)
    keys = [k for k in first if k in common]
    notes = []
    if any(len(k) != len(keys) for k, _ in found.values()):
        notes.append(f"runs evaluated different prompts: only the {len(keys)} every run evaluated are used")
    out = {}
    for rid, (run_keys, means) in found.items():
        where = {k: i for i, k in enumerate(run_keys)}
        out[rid] = means[[where[k] for k in keys]]
    return keys, out, notes


def load_prompt_scores(
    data: ExperimentData, data_source: str, metric: str, reader: Reader, cache: dict | None = None
) -> PromptScores:
    """The per-prompt means of every run's final evaluation of ``metric`` (evaluation set ``data_source``),
    read with ``reader``; runs of one method and seed are averaged, as in ``analysis.arms``. ``cache``:
    {(run_id, step): payload} shared between evaluation sets (one artifact holds them all)."""
    cache = {} if cache is None else cache
    finals = final_evals(data, metric)
    finals = finals[np.isfinite(finals["value"].to_numpy(dtype=float))]
    todo = [(str(r), int(s)) for r, s in zip(finals["run_id"], finals["step"]) if (str(r), int(s)) not in cache]
    if todo:
        with ThreadPoolExecutor(max_workers=4) as pool:
            cache.update(zip(todo, pool.map(lambda rs: reader(*rs), todo)))
    found, steps, samples, mismatched, missing = {}, [], [], 0, 0
    for rid, step, value in zip(finals["run_id"].astype(str), finals["step"], finals["value"]):
        payload = cache.get((rid, int(step)))
        entry = payload["sources"].get(data_source) if payload is not None else None
        if entry is None:
            missing += 1
            continue
        keys, means = _prompt_means(entry)
        if not len(means) or abs(float(means.mean()) - float(value)) > MATCH_TOLERANCE:
            mismatched += 1
            continue
        found[rid] = (keys, means)
        steps.append(int(step))
        samples.append(int(payload.get("n", len(entry["scores"][0]))))
    notes = []
    if mismatched:
        notes.append(f"{mismatched} run(s) left out: their per-prompt results do not average to the logged {metric}")
    if not found:
        return PromptScores({}, [], [], [], len(finals), 0, missing, notes)
    keys, means, align_notes = _aligned(found)
    labels = run_labels(data)
    acc: dict[str, dict[int, list[np.ndarray]]] = {}
    for rid, arm, seed in zip(labels["run_id"].astype(str), labels["arm"], labels[metric_names.TAG_SEED]):
        if rid in means:
            acc.setdefault(arm, {}).setdefault(int(seed), []).append(means[rid])
    x = {arm: {s: np.mean(v, axis=0) for s, v in sorted(seeds.items())} for arm, seeds in acc.items()}
    return PromptScores(x, keys, steps, samples, len(finals), len(found), missing, notes + align_notes)


def stack(per_seed: Mapping[int, np.ndarray], seeds=None) -> np.ndarray:
    """[S, J] of ``per_seed`` ({seed: [J]}) on ``seeds`` (default: all, sorted)."""
    return np.vstack([per_seed[s] for s in (sorted(per_seed) if seeds is None else seeds)])
