"""Evaluation sampling error (``analysis.eval_error``, ``analysis.tables.eval_error``).

References: exact enumeration of every bootstrap resample on tiny cases (3 prompts: 27 resamples; with 2
seeds: 4 x 27), a Monte Carlo over simulated evaluation sets whose true prompt difficulties are drawn (the
interval must cover the true pass@1 and the true difference, computed by quadrature over the difficulty
distribution, about 95% of the time), an unpaired bootstrap computed here (the paired one must be narrower
when prompts share their difficulty), the comparison table's own numbers (the final pass@1, the difference
and its seed interval must be the report's), normal approximations of the intervals' widths, and artifacts
written into a real MLflow store and read back through ``load_experiment``.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from scipy import integrate, stats

from analysis.eval_error import (
    arm_error,
    diff_error,
    paired_prompt_draws,
    percentile_interval,
    prompt_draws,
    two_level_draws,
)
from analysis.load import load_experiment
from analysis.skip import SkipItem
from analysis.synthetic import SyntheticSpec, _m, synthetic_data
from analysis.tables.compare import comparison_table
from analysis.tables.eval_error import eval_error_table
from runners import metric_names


def _sigmoid(z):
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(z, dtype=float)))


# -- the bootstrap distributions against exact enumeration ----------------------------------------------------
def _check_distribution(draws: np.ndarray, exact: np.ndarray) -> None:
    """The draws' mean and CDF agree with the exact (equally likely) resample statistics within 5 Monte Carlo SE."""
    b = len(draws)
    assert abs(draws.mean() - exact.mean()) < 5 * exact.std() / np.sqrt(b)
    for t in np.unique(exact):
        p = float(np.mean(exact <= t + 1e-12))
        assert abs(float(np.mean(draws <= t + 1e-12)) - p) < 5 * np.sqrt(p * (1 - p) / b) + 1e-12, t


def test_prompt_bootstrap_is_the_exact_resampling_distribution():
    """2 seeds x 3 prompts: a draw resamples prompts with the same indices for both seeds; its distribution is
    that of the 27 equally likely index triples (enumerated)."""
    x = np.array([[0.0, 0.5, 1.0], [0.0, 0.1, 1.0]])  # prompt means over seeds 0, 0.3, 1: 10 distinct sums
    exact = np.array([x[:, list(idx)].mean() for idx in itertools.product(range(3), repeat=3)])
    draws = prompt_draws(x, n_boot=40000, rng=np.random.default_rng(1))
    _check_distribution(draws, exact)
    ordered = np.sort(exact)  # the exact 2.5% and 97.5% quantiles of 27 equally likely atoms (inverse CDF)
    assert percentile_interval(draws) == (ordered[int(np.ceil(0.025 * 27)) - 1], ordered[int(np.ceil(0.975 * 27)) - 1])


def test_paired_bootstrap_resamples_each_prompt_jointly_for_both_methods():
    a = np.array([[0.2, 0.9, 0.6]])
    b = np.array([[0.1, 0.5, 0.6]])
    exact = np.array([(a[0, list(i)] - b[0, list(i)]).mean() for i in itertools.product(range(3), repeat=3)])
    _check_distribution(paired_prompt_draws(a, b, n_boot=40000, rng=np.random.default_rng(2)), exact)


def test_two_level_bootstrap_is_the_exact_seeds_then_prompts_distribution():
    """2 paired seeds x 3 prompts: seeds resampled (4 equally likely pairs), then prompts (27 triples), the prompt
    indices shared by the drawn seeds and both methods: 108 equally likely resamples."""
    a = np.array([[0.2, 0.9, 0.6], [0.4, 1.0, 0.5]])
    b = np.array([[0.1, 0.5, 0.6], [0.1, 0.2, 0.5]])
    d = a - b
    exact = np.array(
        [
            d[np.ix_(list(s), list(p))].mean()
            for s in itertools.product(range(2), repeat=2)
            for p in itertools.product(range(3), repeat=3)
        ]
    )
    _check_distribution(two_level_draws(a, b, n_boot=40000, rng=np.random.default_rng(3)), exact)


def test_pass1_and_difference_are_means_over_seeds_of_prompt_means():
    a = np.array([[1.0, 0.0, 0.5, 0.5], [1.0, 1.0, 0.0, 0.25]])
    b = np.array([[0.5, 0.0, 0.5, 0.0], [0.0, 1.0, 0.0, 0.25]])
    assert arm_error(a).pass1 == pytest.approx((0.5 + 0.5625) / 2)
    d = diff_error(a, b)
    assert d.diff == pytest.approx(((0.5 - 0.25) + (0.5625 - 0.3125)) / 2)
    assert (d.seeds, d.prompts) == (2, 4)
    with pytest.raises(ValueError, match="same"):
        diff_error(a, b[:1])


# -- coverage over simulated evaluation sets -------------------------------------------------------------------
SD, EFFECT, PROMPTS, SAMPLES = 1.5, 0.4, 100, 4


def _population_pass1(shift: float) -> float:
    """E over prompt difficulties theta ~ N(0, SD^2) of sigmoid(theta + shift), by quadrature."""
    f = lambda t: float(_sigmoid(t + shift)) * stats.norm.pdf(t, scale=SD)  # noqa: E731
    return integrate.quad(f, -np.inf, np.inf)[0]


def _simulated_eval(rng, shared: bool = True):
    """Per-prompt means (n samples each) of two methods on one drawn prompt set; ``shared``: both methods see the
    same prompt difficulties (the evaluation's prompts), else independent ones."""
    theta = rng.normal(0.0, SD, PROMPTS)
    other = theta if shared else rng.normal(0.0, SD, PROMPTS)
    a = rng.binomial(SAMPLES, _sigmoid(theta + EFFECT)) / SAMPLES
    b = rng.binomial(SAMPLES, _sigmoid(other)) / SAMPLES
    return a[None, :], b[None, :]


def test_intervals_cover_the_population_values_about_95_percent_of_the_time():
    """400 evaluation sets of 100 prompts drawn from a known difficulty distribution, 4 samples each: the
    eval-sampling interval covers the population pass@1 and the paired interval the population difference in
    90-98.5% of the sets (95% nominal; an unpaired interval would cover the difference ~99.9% of the time)."""
    true_a, true_b = _population_pass1(EFFECT), _population_pass1(0.0)
    rng = np.random.default_rng(7)
    hits_a = hits_d = 0
    sims = 400
    for i in range(sims):
        a, b = _simulated_eval(rng)
        arm, diff = arm_error(a, n_boot=1000, seed=i), diff_error(a, b, n_boot=1000, seed=i)
        hits_a += arm.lo <= true_a <= arm.hi
        hits_d += diff.lo <= true_a - true_b <= diff.hi
    assert 0.90 <= hits_a / sims <= 0.985
    assert 0.90 <= hits_d / sims <= 0.985


def _unpaired_width(a: np.ndarray, b: np.ndarray, n_boot: int = 4000) -> float:
    """Width of the 95% percentile interval of the difference with the two methods' prompts drawn independently."""
    rng = np.random.default_rng(11)
    j = a.shape[1]
    draws = a[0, rng.integers(0, j, (n_boot, j))].mean(1) - b[0, rng.integers(0, j, (n_boot, j))].mean(1)
    lo, hi = np.quantile(draws, [0.025, 0.975])
    return float(hi - lo)


def test_paired_interval_is_narrower_than_unpaired_when_prompts_share_difficulty():
    rng = np.random.default_rng(5)
    a, b = _simulated_eval(rng, shared=True)
    paired = diff_error(a, b, n_boot=4000)
    assert paired.hi - paired.lo < 0.75 * _unpaired_width(a, b)
    a, b = _simulated_eval(rng, shared=False)  # no shared difficulty: pairing gains nothing
    paired = diff_error(a, b, n_boot=4000)
    assert paired.hi - paired.lo == pytest.approx(_unpaired_width(a, b), rel=0.15)


# -- the table -------------------------------------------------------------------------------------------------
SOURCE, FINAL = "embedded", 20
METRIC = metric_names.val_acc_mean(SOURCE, 1)
EFFECTS = {"GRPO": 0.0, "GRPO+TROLL": 0.5, "GSPO": -0.3}


def _payload(step: int, scores: np.ndarray, keys=None) -> dict:
    keys = list(range(scores.shape[0])) if keys is None else keys
    return {"step": step, "n": scores.shape[1], "sources": {SOURCE: {"keys": keys, "scores": scores.tolist()}}}


def _sweep(seed_sd: float = 0.3, prompts: int = 64):
    """A synthetic sweep (3 methods x 3 seeds) whose final evaluation is the mean of per-prompt scores drawn
    here (prompt difficulty shared by every run, a per-seed offset, 4 samples a prompt): (data, {run_id:
    payload of its final evaluation}, {run_id: [J] prompt means})."""
    methods = [_m("GRPO", "grpo"), _m("GRPO+TROLL", "grpo", "troll"), _m("GSPO", "gspo")]
    spec = SyntheticSpec("eval_error", methods, seeds=(0, 1, 2), steps=FINAL, eval_every=10,
                         eval_sets=(SOURCE,), families=frozenset({"core"}))  # fmt: skip
    data, truth = synthetic_data(spec)
    data.load_info.pop("per_prompt")  # the results drawn here stand in for the synthetic ones
    rng = np.random.default_rng(3)
    theta = rng.normal(0.0, SD, prompts)
    payloads, means = {}, {}
    m = data.metrics
    for (label, _seed), info in truth.items():
        shift = EFFECTS[label] + seed_sd * rng.normal()
        scores = rng.binomial(1, _sigmoid(theta + shift)[:, None], size=(prompts, 4)).astype(float)
        rid = info["run_id"]
        payloads[rid], means[rid] = _payload(FINAL, scores), scores.mean(axis=1)
        final = (m["run_id"] == rid) & (m["metric"] == METRIC) & (m["step"] == FINAL)
        assert final.sum() == 1
        m.loc[final, "value"] = scores.mean()
    return data, payloads, means


def _reader(payloads: dict):
    calls = []

    def read(run_id, step):
        calls.append((run_id, step))
        return payloads.get(run_id) if step == FINAL else None

    read.calls = calls
    return read


def test_table_final_pass1_difference_and_seed_interval_are_the_comparison_tables():
    data, payloads, means = _sweep()
    read = _reader(payloads)
    table = eval_error_table(data, reader=read)
    compare = comparison_table(data)
    label = f"{SOURCE} pass@1 at step {FINAL} (last eval)"
    assert sorted(read.calls) == sorted((rid, FINAL) for rid in payloads)
    assert list(table.values.index) == [(label, a) for a in ("GRPO", "GRPO+TROLL", "GSPO")]
    for arm in ("GRPO", "GRPO+TROLL", "GSPO"):
        row = table.values.loc[(label, arm)]
        reference = compare.values.loc[(label, arm)]
        assert row["pass@1"] == pytest.approx(reference["mean [95% CI]"], abs=1e-12)
        assert (row["seeds"], row["prompts × samples"]) == (3, 64)
        if arm == "GRPO":
            assert row["baseline"] == "GRPO" and np.isnan(float(row["Δ vs baseline"]))
            continue
        assert row["Δ vs baseline"] == pytest.approx(reference["Δ vs baseline [95% CI]"], abs=1e-12)
        for end in ("lo", "hi"):
            assert table.aux[f"seed_{end}"].loc[(label, arm), "value"] == pytest.approx(
                compare.aux[f"diff_{end}"].loc[(label, arm), "value"], abs=1e-12
            )
    assert "step 20" in table.caption and "64 prompts × 4 samples" in table.caption and "2000 draws" in table.caption
    assert table.notes == []
    assert "| embedded pass@1 at step 20 (last eval) | GRPO+TROLL |" in table.to_markdown()


def test_table_intervals_have_the_normal_approximation_widths():
    """Prompt intervals ~ 2 x 1.96 x sd / sqrt(J) of the per-prompt seed means (of the paired differences for Δ)."""
    data, payloads, means = _sweep()
    table = eval_error_table(data, reader=_reader(payloads))
    label = f"{SOURCE} pass@1 at step {FINAL} (last eval)"
    runs = {(r["tags.method"], int(r["tags.seed"])): r["run_id"] for _, r in data.runs.iterrows()}
    per_prompt = {arm: np.mean([means[runs[(arm, s)]] for s in (0, 1, 2)], axis=0) for arm in EFFECTS}
    for arm, x in per_prompt.items():
        expected = 2 * 1.96 * x.std(ddof=1) / np.sqrt(len(x))
        assert table.values.loc[(label, arm), "eval-sampling 95% CI"] == pytest.approx(expected, rel=0.2)
        lo, hi = (table.aux[k].loc[(label, arm), "value"] for k in ("ci_lo", "ci_hi"))
        assert lo < x.mean() < hi
    for arm in ("GRPO+TROLL", "GSPO"):
        d = per_prompt[arm] - per_prompt["GRPO"]
        expected = 2 * 1.96 * d.std(ddof=1) / np.sqrt(len(d))
        assert table.values.loc[(label, arm), "Δ 95% CI: prompts (paired)"] == pytest.approx(expected, rel=0.2)


def test_two_level_interval_adds_the_seed_spread():
    """With large per-seed offsets the seeds-and-prompts interval is much wider than the prompts-only one; without
    them only a little (the seeds then differ by their samples' noise alone)."""
    label = f"{SOURCE} pass@1 at step {FINAL} (last eval)"
    widths = {}
    for seed_sd in (0.0, 1.0):
        data, payloads, _ = _sweep(seed_sd=seed_sd)
        values = eval_error_table(data, reader=_reader(payloads)).values
        row = values.loc[(label, "GRPO+TROLL")]
        widths[seed_sd] = row["Δ 95% CI: seeds and prompts"] / row["Δ 95% CI: prompts (paired)"]
    assert widths[1.0] > 2 * widths[0.0] and 1.0 < widths[0.0] < 1.6


def test_runs_without_the_artifact_are_left_out_in_one_note():
    data, payloads, means = _sweep()
    runs = {(r["tags.method"], int(r["tags.seed"])): r["run_id"] for _, r in data.runs.iterrows()}
    del payloads[runs[("GSPO", 2)]]
    payloads[runs[("GRPO", 1)]]["sources"][SOURCE]["scores"][0][0] += 1.0  # no longer the logged value
    table = eval_error_table(data, reader=_reader(payloads))
    label = f"{SOURCE} pass@1 at step {FINAL} (last eval)"
    assert table.values.loc[(label, "GSPO"), "seeds"] == 2 and table.values.loc[(label, "GRPO"), "seeds"] == 2
    expected_gspo = np.mean([means[runs[("GSPO", s)]].mean() for s in (0, 1)])
    assert table.values.loc[(label, "GSPO"), "pass@1"] == pytest.approx(expected_gspo, abs=1e-12)
    assert "(1 paired)" in table.display.loc[(label, "GSPO"), "Δ vs baseline"]  # seed 0 only: GRPO lacks seed 1
    assert len(table.notes) == 2
    assert table.notes[0].startswith(f"{SOURCE}: 1 of 9 runs have no per-prompt results of their final evaluation")
    assert "1 run(s) left out" in table.notes[1]


def test_table_is_skipped_without_artifacts_or_store():
    data, _, _ = _sweep()
    with pytest.raises(SkipItem, match="^no run logged per-prompt evaluation results"):
        eval_error_table(data, reader=lambda run_id, step: None)
    with pytest.raises(SkipItem, match="not loaded from a tracking store"):
        eval_error_table(data)


def test_runs_built_in_memory_carry_their_per_prompt_results():
    """analysis.synthetic holds the results a store would hold as artifacts in load_info["per_prompt"]: the
    table reads them, and each run's averages to its logged final value (else the run would be left out)."""
    spec = SyntheticSpec("eval_error_mem", [_m("GRPO", "grpo"), _m("GRPO+TROLL", "grpo", "troll")], seeds=(0, 1),
                         steps=FINAL, eval_every=10, eval_sets=(SOURCE,), families=frozenset({"core"}))  # fmt: skip
    data, truth = synthetic_data(spec)
    for info in truth.values():
        steps, values = info["curves"][METRIC]
        payload = data.load_info["per_prompt"][(info["run_id"], int(steps[-1]))]
        scores = np.array(payload["sources"][SOURCE]["scores"])
        assert scores.mean() == pytest.approx(values[-1], abs=1e-12) and np.all((scores >= 0) & (scores <= 1))
    table = eval_error_table(data)
    assert not table.notes and len(table.values) == 2


def test_table_reads_the_artifacts_from_an_mlflow_store(tb_home, tmp_path):
    """Runs logged into a real sqlite store with their artifacts; one run's final evaluation has none (only its
    step-0 evaluation does): the table uses the others and says so."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("eval_error_store", artifact_location=(tmp_path / "artifacts").as_uri())
    metric = metric_names.val_acc_mean(SOURCE, 4)
    rng = np.random.default_rng(0)
    theta = rng.normal(0.0, SD, 32)
    expected: dict[str, list[float]] = {}
    for label, objective in (("GRPO", "clip"), ("GRPO+TROLL", "troll")):
        for seed in (0, 1):
            tags = {"method": label, "algorithm": "grpo", "objective": objective, "seed": str(seed)}
            run_id = client.create_run(exp, tags=tags).info.run_id
            for step in (0, 10):
                scores = rng.binomial(1, _sigmoid(theta + EFFECTS[label])[:, None], size=(32, 4)).astype(float)
                client.log_metric(run_id, metric, float(scores.mean()), step=step)
                if step == 0 or (label, seed) != ("GRPO+TROLL", 1):
                    keys = [f"p{j}" for j in range(32)]
                    text = json.dumps(_payload(step, scores, keys) | {"n": 4})
                    client.log_text(run_id, text, metric_names.per_prompt_artifact(step))
                if step == 10 and (label, seed) != ("GRPO+TROLL", 1):
                    expected.setdefault(label, []).append(float(scores.mean()))
            client.set_terminated(run_id)
    data = load_experiment("eval_error_store", tracking_uri=uri, cache_dir=None)
    table = eval_error_table(data, n_boot=500)
    label = f"{SOURCE} pass@1 at step 10 (last eval)"
    for arm, finals in expected.items():
        assert table.values.loc[(label, arm), "pass@1"] == pytest.approx(np.mean(finals), abs=1e-12)
        assert table.values.loc[(label, arm), "seeds"] == len(finals)
    assert table.display.loc[(label, "GRPO"), "prompts × samples"] == "32 × 4"
    assert table.notes == [f"{SOURCE}: 1 of 4 runs have no per-prompt results of their final evaluation (older "
                           "runs, the verl backend): left out"]  # fmt: skip
    assert "500 draws" in table.caption
