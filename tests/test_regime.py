"""Off-policy regimes: the presets of conf/regime/ set what their names say, the label a run is tagged with
is read from the settings (not from the preset's name), and arms split by regime are compared within it."""

from __future__ import annotations

import pytest

from runners import metric_names
from runners.config import compose
from runners.config.regime import ON_POLICY, regime_label

# preset -> (ppo_epochs, mini-batches per rollout, staleness, sampler dtype), written from the presets' comments
PRESETS = {
    "on_policy": (1, 1, 0, "auto"),
    "multi_epoch": (4, 4, 0, "auto"),
    "stale2": (1, 1, 2, "auto"),
    "stale4": (1, 1, 4, "auto"),
    "bf16_sampler": (1, 1, 0, "bfloat16"),
}
LABELS = {
    "on_policy": "on-policy",
    "multi_epoch": "4 epochs x 4 mini-batches",
    "stale2": "stale k=2",
    "stale4": "stale k=4",
    "bf16_sampler": "bfloat16 sampler",
}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_each_preset_sets_its_regime_at_the_stability_map_size(preset):
    cfg, _ = compose(["+regime=" + preset, "trainer.prompts_per_step=16"])
    epochs, minis, staleness, dtype = PRESETS[preset]
    t = cfg.trainer
    assert (t.ppo_epochs, t.prompts_per_step // t.mini_batch_prompts) == (epochs, minis)
    assert (cfg.rollout.staleness, cfg.rollout.dtype) == (staleness, dtype)
    assert regime_label(cfg) == LABELS[preset]


def test_multi_epoch_takes_a_quarter_of_any_batch():
    cfg, _ = compose(["+regime=multi_epoch", "trainer.prompts_per_step=128"])
    assert cfg.trainer.mini_batch_prompts == 32
    assert regime_label(cfg) == "4 epochs x 4 mini-batches"


def _cfg(epochs=1, per_step=16, per_mini=16, staleness=0, sampler="auto", model="float32"):
    return {
        "trainer": {"ppo_epochs": epochs, "prompts_per_step": per_step, "mini_batch_prompts": per_mini},
        "rollout": {"staleness": staleness, "dtype": sampler},
        "model": {"dtype": model},
    }


@pytest.mark.parametrize(
    ("cfg", "label"),
    [
        (_cfg(), ON_POLICY),
        # a sampler in the model's own dtype is no mismatch
        (_cfg(sampler="bfloat16", model="bfloat16"), ON_POLICY),
        (_cfg(sampler="float16"), "float16 sampler"),
        (_cfg(epochs=2), "2 epochs x 1 mini-batch"),
        (_cfg(per_mini=8), "1 epoch x 2 mini-batches"),
        # the demo's regime: every departure named, in a fixed order
        (_cfg(epochs=2, per_mini=8, staleness=1), "2 epochs x 2 mini-batches + stale k=1"),
        (_cfg(staleness=3, sampler="bfloat16"), "stale k=3 + bfloat16 sampler"),
    ],
)
def test_the_label_is_read_from_the_settings(cfg, label):
    assert regime_label(cfg) == label


def test_a_run_is_tagged_with_its_regime():
    from runners.run import run_tags

    cfg, choices = compose(["+regime=stale2"])
    assert run_tags(cfg, "GRPO", choices)[metric_names.TAG_REGIME] == "stale k=2"
    # settings written by hand give the same tag as the preset
    cfg, choices = compose(["rollout.staleness=2"])
    assert run_tags(cfg, "GRPO", choices)[metric_names.TAG_REGIME] == "stale k=2"
