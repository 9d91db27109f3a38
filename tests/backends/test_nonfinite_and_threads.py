"""A NaN or infinite metric stops the run as FAILED, naming the metric and the step, with the last good
checkpoint kept and nothing of the bad step logged; torch's thread count follows the CPUs this process may
use (a Slurm job's cgroup), not the node's."""

from __future__ import annotations

import math

import pytest

from runners.config import compose

# four steps of 2 prompts x 4 responses: the failure at step 3 needs a checkpoint behind it, not a big batch
BASE = [
    "trainer.total_steps=4",
    "trainer.eval_every=0",
    "trainer.checkpoint_every=1",
    "trainer.prompts_per_step=2",
    "trainer.n=4",
    "trainer.mini_batch_prompts=2",
    "progress=false",
]


def test_a_nan_metric_fails_the_run_naming_it_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    import torch

    from runners import paths, tracking
    from runners.backends.local import actor, checkpoint, trainer
    from runners.config import run_key
    from runners.run import RunFailed, read_status, run

    monkeypatch.setenv("TRUSTBENCH_HOME", str(tmp_path))
    real = actor.update_actor
    calls = {"n": 0}

    def update(*args, **kw):
        metrics, seq_masks = real(*args, **kw)
        calls["n"] += 1
        if calls["n"] == 3:  # the third iteration's loss diverges
            metrics["actor/pg_loss"] = math.nan
        return metrics, seq_masks

    monkeypatch.setattr(trainer, "update_actor", update)
    cfg, choices = compose(BASE)
    with pytest.raises(RunFailed, match=r"'actor/pg_loss' is nan at step 3"):
        run(cfg, choices)
    run_dir = paths.run_dir(run_key(cfg))
    status = read_status(run_dir)
    assert status["status"] == "FAILED" and "actor/pg_loss" in status["reason"]
    assert torch.load(checkpoint.path(run_dir), weights_only=False)["step"] == 2
    found = tracking.find_run(paths.default_tracking_uri(), cfg.experiment, run_key(cfg))
    assert found.info.status == "FAILED"
    client = tracking._client(paths.default_tracking_uri())
    steps = [m.step for m in client.get_metric_history(found.info.run_id, "actor/pg_loss")]
    assert steps == [1, 2]


def test_default_threads_follow_the_cpus_this_process_may_use(monkeypatch):
    import os

    from runners.perf import hardware

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert hardware.available_cpus() == 1
    assert hardware.default_threads() == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 5, 7})
    assert hardware.available_cpus() == 4
    assert hardware.default_threads() == 3  # one core left to the tracker, the OS and neighbours
