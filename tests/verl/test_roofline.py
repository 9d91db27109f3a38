"""Roofline points of verl runs (``runners.backends.verl.plugins.roofline``) against the built-in trainer's.

- the shape read from a saved model's config on the meta device equals ``TransformerShape.from_model``
  on the loaded model, with the bytes of the dtype the actor computes in (verl's FSDP default bf16;
  CPU mode's fp32);
- epochs and optimiser steps come from verl's own composed config;
- on the same lengths and phase times the verl path gives the built-in trainer's points
  (``runners.backends.local.perf.batch_work`` on a ``RolloutBatch``-shaped batch), the ceiling the actor
  workers report, and no ``perf/mfu/actor`` (verl logs its own).

The stage (``tests/verl/test_cpu_stage.py``, ``test_cpu_cross_backend.py``) checks real verl runs log
them, with the lengths verl trained on.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from runners import metric_names as names
from runners.backends.local.perf import batch_work
from runners.models.tiny import build_tiny_model
from runners.perf.flops import TransformerShape
from runners.perf.hardware import Ceiling
from runners.perf.roofline import roofline_metrics

pytestmark = pytest.mark.verl
pytest.importorskip("verl")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_qwen3")
    build_tiny_model("qwen3", vocab_size=37, seed=0).save_pretrained(path)
    return path


def _config(model_dir, *overrides):
    from tests.verl._verl_config import make_verl_config

    base = [
        f"actor_rollout_ref.model.path={model_dir}",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_epochs=3",
    ]
    return make_verl_config()([*base, *overrides])


@pytest.mark.parametrize(("dtype", "size"), [(None, 2), ("fp32", 4), ("bf16", 2)])
def test_shape_from_config_and_update_settings(model_dir, monkeypatch, dtype, size):
    from runners.backends.verl.plugins.roofline import StepRoofline

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    extra = [f"+actor_rollout_ref.actor.fsdp_config.mixed_precision={{param_dtype:{dtype}}}"] if dtype else []
    ceiling = Ceiling(0.5, 0.25, "fake")
    workers = SimpleNamespace(roofline_ceiling=lambda: [ceiling.__dict__, ceiling.__dict__])
    trainer = SimpleNamespace(config=_config(model_dir, *extra), actor_rollout_wg=workers)
    roofline = StepRoofline.for_trainer(trainer)
    loaded = TransformerShape.from_model(build_tiny_model("qwen3", vocab_size=37, seed=0))
    assert roofline.shape == TransformerShape(**{**loaded.__dict__, "bytes_per_param": size})
    assert (roofline.epochs, roofline.steps) == (3, 12)  # 3 epochs x 8 / 2 mini-batches
    assert roofline.ceiling == ceiling


def test_same_points_as_the_builtin_trainer(model_dir, monkeypatch):
    from runners.backends.verl.plugins.roofline import StepRoofline

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    shape = TransformerShape.from_model(build_tiny_model("qwen3", vocab_size=37, seed=0))
    ceiling = Ceiling(0.5, 0.25, "fake")
    prompts, responses, context = [3, 5, 4, 5], [2, 7, 1, 4], 5
    width = max(responses)
    attention = torch.zeros(4, context + width, dtype=torch.long)
    response_mask = torch.zeros(4, width)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        attention[i, context - p : context + r] = 1
        response_mask[i, :r] = 1
    batch = SimpleNamespace(
        # distinct contexts: the built-in trainer runs a context shared by several rows once and counts
        # it once; verl's path counts every row's
        input_ids=torch.arange(4 * (context + width)).view(4, context + width),
        attention_mask=attention,
        context_length=context,
        response_mask=response_mask,
        group_index=torch.tensor([0, 0, 1, 1]),
    )
    timing_raw = {"gen": 0.5, "old_log_prob": 0.125, "update_actor": 0.25, "adv": 0.01}
    expected = roofline_metrics(
        batch_work(shape, batch, old_pass=True, epochs=2, mini_batch_share=0.5),
        {f"timing_s/{k}": v for k, v in timing_raw.items()},
        ceiling,
    )
    got = StepRoofline(shape, ceiling, epochs=2, steps=4).metrics(prompts, responses, timing_raw)
    assert names.MFU_ACTOR in expected and names.MFU_ACTOR not in got
    assert got == {k: v for k, v in expected.items() if k != names.MFU_ACTOR}
    for phase in names.ROOFLINE_PHASES:
        assert got[names.achieved_tflops(phase)] > 0 and got[names.arithmetic_intensity(phase)] > 0
    bypass = StepRoofline(shape, None, epochs=2, steps=4).metrics(
        prompts, responses, {"gen": 0.5, "update_actor": 0.25}
    )
    assert names.arithmetic_intensity("old_log_prob") not in bypass and names.PEAK_TFLOPS not in bypass


def test_unreadable_model_gives_no_points(tmp_path, monkeypatch):
    from runners.backends.verl.plugins.roofline import StepRoofline

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    trainer = SimpleNamespace(config=_config(tmp_path / "missing"), actor_rollout_wg=None)
    assert StepRoofline.for_trainer(trainer) is None
