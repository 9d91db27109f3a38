"""Fixtures of the report tests: a synthetic sweep that exercises every registered table and figure
(in memory: the MLflow round trip is tested in tests/analysis), and reports built from it once."""

from __future__ import annotations

import pytest

from analysis.synthetic import REPO_R_CAPS, SyntheticSpec, _m, synthetic_data

ALL_FAMILIES = frozenset({"core", "timing", "perf", "roofline", "trm", "claims"})


def kitchen_sink_spec(experiment: str = "kitchen_sink") -> SyntheticSpec:
    """Clip, TROLL, chunked TROLL, T-PPO, a TRM mask and REPO-R; every metric family; AIME + MATH + in-domain evals."""
    return SyntheticSpec(
        experiment,
        [
            _m("GRPO", "grpo", violation_p=1e-3),
            _m("GRPO+TROLL", "grpo", "troll", final=0.7, violation_p=1e-3),
            _m("GRPO+TROLL (chunked)", "grpo", "troll", params={"algorithm.troll.chunk_size": 1024}),
            _m("PPO", "ppo"),
            _m("T-PPO", "tppo"),
            _m("TRM-Max", "grpo", "token_is", mask="trm_max", violation_p=1e-4),
            _m("REPO-R", "repo_r", entropy_control="repo_r", zeta_growth=10.0, params=dict(REPO_R_CAPS)),
        ],
        seeds=(0, 1),
        steps=24,  # 6 evaluations at positive compute: the reward-vs-compute fit needs 6
        eval_every=4,
        eval_sets=("dapo_math", "aime24", "aime25", "math500"),
        model="qwen3_8b",
        families=ALL_FAMILIES,
    )


@pytest.fixture(scope="session")
def sink():
    return synthetic_data(kitchen_sink_spec())


@pytest.fixture(scope="session")
def built_report(tmp_path_factory, sink):
    """The trm_acceptance report of the kitchen-sink data, with its PDF when Chromium exists."""
    from reports.build import build_report
    from reports.chromium import ChromiumMissingError, find_chromium

    try:
        find_chromium()
        pdf = True
    except ChromiumMissingError:
        pdf = False
    out = tmp_path_factory.mktemp("report_trm")
    return build_report(
        "trm_acceptance", tracking_uri="sqlite:///unused.db", out_dir=out, data=sink[0], pdf=pdf, log_to_mlflow=False
    )
