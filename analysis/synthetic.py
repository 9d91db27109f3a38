"""Synthetic sweeps logged into a real MLflow store, for tests, benchmarks and report previews.

Design: every curve is a closed-form function of the step plus seeded Gaussian noise, so a test can
recompute any table entry with numpy from the arrays returned by ``log_synthetic_experiment``
(they are exactly what was logged) without calling the analysis code. Runs use the metric names
and tags of ``runners.metric_names`` and are tagged ``trustbench.synthetic=1`` (reports show a banner).
``profile(name)`` gives a sweep shaped like each registered report (``reports.registry``). The methods and
their curves are in ``analysis.synthetic_curves``; this module logs them, or builds the frames in memory.

    python -m analysis.synthetic troll_table1 --tracking-uri sqlite:///$PWD/.trustbench/mlflow.db
    trustbench report troll_table1
"""

from __future__ import annotations

import argparse
import json
import zlib
from dataclasses import replace

import numpy as np
import pandas as pd

from analysis.frames import ExperimentData, normalize_metrics
from analysis.synthetic_curves import (  # noqa: F401  (re-exported: the sweep's parts, imported from here)
    LENGTH_BUCKETS,
    POSITION_BUCKETS,
    SyntheticMethod,
    SyntheticSpec,
    generate_run,
    objective_eps,
    with_regime,
)
from runners import metric_names

TAG_SYNTHETIC = "trustbench.synthetic"


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
        **{f"algorithm.components.{group}": name for group, name in preset_components(method).items()},
        **method.params,
    }


def preset_components(method: SyntheticMethod) -> dict[str, str]:
    """The components a run's algorithm preset declares (real runs log ``algorithm.components.<group>``): the
    method's own estimator and entropy control, no mask, and its objective with TROLL's swapped back to the
    preset's (``troll_seq`` is GSPO's sequence clip)."""
    objective = method.tags.get(metric_names.TAG_OBJECTIVE, "clip")
    if objective.startswith("troll"):
        objective = "gspo" if objective == "troll_seq" else "clip"
    return {
        "estimator": method.tags.get(metric_names.TAG_ESTIMATOR, "grpo"),
        "objective": objective,
        "mask": "none",
        "entropy_control": method.tags.get(metric_names.TAG_ENTROPY_CONTROL, "none"),
    }


# per-prompt results of the synthetic evaluations (``metric_names.per_prompt_artifact``): PROMPTS prompts whose
# difficulty is shared by every method and seed of a sweep, one sample each, averaging exactly to the logged value
PROMPTS = 32


def per_prompt_payloads(spec: SyntheticSpec, curves: dict) -> dict[int, dict]:
    """{eval step: the artifact payload of that evaluation} for one run's ``curves``: prompt j of evaluation set
    ``d`` scores ``v + a c_j`` (c: the sweep's centred prompt difficulties, a within [0, 1]), mean exactly ``v``."""
    rng = np.random.default_rng(zlib.crc32(spec.experiment.encode()))
    c = rng.normal(size=PROMPTS)
    c = (c - c.mean()) / np.abs(c - c.mean()).max()
    payloads: dict[int, dict] = {}
    for data in spec.eval_sets:
        steps, values = curves.get(metric_names.val_acc_mean(data, 1), ((), ()))
        for step, v in zip(steps, values):
            scores = float(v) + 0.8 * min(float(v), 1.0 - float(v)) * c
            sources = payloads.setdefault(int(step), {"step": int(step), "n": 1, "sources": {}})["sources"]
            sources[data] = {"keys": list(range(PROMPTS)), "scores": [[float(x)] for x in scores]}
    return payloads


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
            for step, payload in per_prompt_payloads(spec, curves).items():
                client.log_text(run_id, json.dumps(payload), metric_names.per_prompt_artifact(step))
            client.set_terminated(run_id)
            truth[(method.key, seed)] = {"run_id": run_id, "curves": curves}
    return truth


def synthetic_data(spec: SyntheticSpec) -> tuple[ExperimentData, dict[tuple[str, int], dict]]:
    """The frames ``load_experiment`` would return for ``spec`` once logged, built in memory
    (for tests of tables and reports that do not exercise MLflow); run ids are "<key>-s<seed>" (the method's
    label, with " | <regime>" when it has a regime tag). The runs' per-prompt evaluation results, which a store
    holds as artifacts, are in ``load_info["per_prompt"]`` ({(run_id, step): payload}, ``analysis.eval_error``)."""
    runs, points, truth, per_prompt = [], [], {}, {}
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
            per_prompt.update(((run_id, step), p) for step, p in per_prompt_payloads(spec, curves).items())
    metrics = normalize_metrics(pd.concat(points, ignore_index=True))
    return ExperimentData(runs=pd.DataFrame(runs), metrics=metrics, load_info={"per_prompt": per_prompt}), truth


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
