"""Off-policy regimes of the built-in trainer: stale rollouts and a bf16 sampler beside an fp32 trainer.

- ``RolloutPolicy`` samples with the weights of exactly ``staleness`` iterations ago (checked against
  the weights recorded after each update), in the rollout dtype, and is the trained model itself by default;
- on the embedded default, the regimes make the mismatch visible under verl's ``rollout_corr/*`` names
  (zero up to sampler numerics on-policy, clearly positive with staleness 2 or a bf16 sampler), and
  TRM's sample-based mask rejects sequences it accepts on-policy;
- a stale run killed after 2 of 4 iterations resumes to the same numbers as an uninterrupted one (the
  weight history is part of the checkpoint).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from runners.backends.local.rollout_policy import RolloutPolicy
from runners.config import compose

BASE = [
    "trainer.total_steps=4",
    "trainer.prompts_per_step=4",
    "trainer.n=4",
    "trainer.mini_batch_prompts=4",
    "trainer.eval_every=0",
    "trainer.checkpoint_every=2",
    "trainer.lr=1e-3",
    "progress=false",
    "backend.num_threads=1",
]


def test_rollout_policy_lags_by_staleness_iterations():
    model = torch.nn.Linear(3, 2)
    policy = RolloutPolicy(model, staleness=2)
    seen = [{k: v.clone() for k, v in model.state_dict().items()}]
    for _ in range(5):
        with torch.no_grad():
            model.weight.add_(1.0)
        policy.after_update()
        seen.append({k: v.clone() for k, v in model.state_dict().items()})
        expected = seen[max(0, len(seen) - 1 - 2)]
        sampler = policy.sampler()
        assert sampler is not model
        assert torch.equal(sampler.weight, expected["weight"])
    assert RolloutPolicy(model).sampler() is model  # on-policy: no copy
    low = RolloutPolicy(model, dtype="bfloat16").sampler()
    assert low.weight.dtype == torch.bfloat16 and torch.equal(low.weight, model.weight.bfloat16())


def _final(overrides, tmp_path, monkeypatch, name):
    from runners.run import run

    monkeypatch.setenv("TRUSTBENCH_HOME", str(tmp_path / name))
    cfg, choices = compose([*BASE, *overrides])
    return run(cfg, choices)["metrics"]


def _histories(home, run_id: str) -> dict[str, list[float]]:
    """Every metric of the run, by step, read back with MLflow's client."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    return {
        key: [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]
        for key in client.get_run(run_id).data.metrics
    }


def _run(overrides, tmp_path, monkeypatch, name) -> tuple[dict, dict[str, list[float]]]:
    """(final metrics, metric histories) of one cell of ``BASE`` + ``overrides``."""
    from runners.run import run

    monkeypatch.setenv("TRUSTBENCH_HOME", str(tmp_path / name))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg, choices = compose([*BASE, *overrides])
    out = run(cfg, choices)
    return out["metrics"], _histories(tmp_path / name, out["run_id"])


@pytest.mark.slow
def test_regimes_show_the_mismatch_and_trm_acts_on_it(tmp_path, monkeypatch):
    """Final-step divergences, and TRM's acceptance over the run: rejection is per batch, so one step of a
    short run can accept every sequence (the bf16 run's last of 4 steps did, 0.94 before), the run cannot."""
    trm = ["mask=trm_max_k2", "mask.delta=0.02"]
    on, on_h = _run(trm, tmp_path, monkeypatch, "on")
    stale, stale_h = _run([*trm, "rollout.staleness=2"], tmp_path, monkeypatch, "stale")
    low, low_h = _run([*trm, "rollout.dtype=bfloat16"], tmp_path, monkeypatch, "bf16")
    assert on["rollout_corr/k3_kl"] < 1e-4 and set(on_h["trm/accept_rate"]) == {1.0}
    assert "actor/post_update_kl_sampler" not in on  # on-policy: one centre
    for regime, history in ((stale, stale_h), (low, low_h)):
        assert regime["rollout_corr/k3_kl"] > 100 * max(on["rollout_corr/k3_kl"], 1e-9)
        # the KL from the sampling copy, beside the one from pi_old (tests/backends/test_post_update_sampler_kl.py)
        assert regime["actor/post_update_kl_sampler"] != regime["actor/post_update_kl"]
        assert regime["rollout_corr/log_ppl_abs_diff"] > on["rollout_corr/log_ppl_abs_diff"]
        assert min(history["trm/accept_rate"]) < 1.0
    assert stale["rollout_corr/chi2_token"] > 0


@pytest.mark.slow
def test_a_stale_run_resumes_to_the_same_numbers(tmp_path, monkeypatch):
    from runners.run import RunFailed, run

    overrides = ["rollout.staleness=1"]
    straight = _final(overrides, tmp_path, monkeypatch, "straight")
    monkeypatch.setenv("TRUSTBENCH_HOME", str(tmp_path / "resumed"))
    cfg, choices = compose([*BASE, *overrides, "debug.fail_at_step=2"])
    with pytest.raises(RunFailed):
        run(cfg, choices)
    cfg, choices = compose([*BASE, *overrides])
    resumed = run(cfg, choices)["metrics"]
    for key in ("critic/score/mean", "actor/pg_loss", "rollout_corr/k3_kl", "actor/entropy"):
        assert resumed[key] == straight[key], key


# -- the demo's regime: every method shown acts ---------------------------------------------------------
def _demo_histories(method: str, tmp_path, monkeypatch, steps: int = 3) -> dict[str, list[float]]:
    """The metric histories of one demo cell (sweeps/demo.yaml, seed 0) cut to ``steps`` steps."""
    from runners.run import run

    home = tmp_path / method
    monkeypatch.setenv("TRUSTBENCH_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    overrides = ["+sweeps=demo", f"+method={method}", "seed=0", f"trainer.total_steps={steps}"]
    cfg, choices = compose([*overrides, "trainer.eval_every=0", "trainer.checkpoint_every=0", "progress=false"])
    return _histories(home, run(cfg, choices)["run_id"])


@pytest.mark.slow
def test_in_the_demo_regime_troll_projects_trm_rejects_and_adapo_departs_from_dapo(tmp_path, monkeypatch):
    """At the demo's settings (stale rollouts, two epochs of two mini-batches) the methods the demo shows
    act within a few steps: TROLL projects tokens, TRM-Max rejects sequences, and ADAPO's moving eps_high
    changes DAPO's update (on-policy the first two were idle and ADAPO's run was DAPO's, bit for bit)."""
    troll = _demo_histories("grpo_troll", tmp_path, monkeypatch)
    assert float(np.mean(troll["troll/projected_frac"])) > 0.0
    trm = _demo_histories("grpo_trm", tmp_path, monkeypatch)
    assert float(np.mean(trm["trm/accept_rate"])) < 1.0
    dapo = _demo_histories("dapo", tmp_path, monkeypatch)
    adapo = _demo_histories("adapo", tmp_path, monkeypatch)
    assert adapo["entropy/eps_high"][-1] != adapo["entropy/eps_high"][0]
    # the same first step (eps_high starts at DAPO's 0.28), then a different update
    assert adapo["actor/pg_loss"][0] == pytest.approx(dapo["actor/pg_loss"][0], rel=1e-6)
    assert adapo["actor/pg_loss"][1:] != dapo["actor/pg_loss"][1:]
