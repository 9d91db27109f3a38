"""verl parquet export: read back with pandas and loaded by verl's own RLHFDataset (the consumer)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from runners.data.datasets import load_examples
from runners.data.rewards import compute_reward
from runners.data.verl_format import compute_score, to_verl_record, write_verl_parquet

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "datasets"


def _examples():
    return (
        load_examples("math500", split="test", path=FIXTURES / "math500.jsonl")
        + load_examples("eurus2_code", split="test", path=FIXTURES / "eurus2.jsonl")
        + load_examples("embedded", split="test", limit=3)
    )


def test_record_schema():
    example = load_examples("eurus2_math", split="train", path=FIXTURES / "eurus2.jsonl")[0]
    record = to_verl_record(example, 7)
    assert set(record) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert record["data_source"] == "eurus2_math" and record["ability"] == "math"
    assert record["reward_model"] == {"style": "rule", "ground_truth": "50"}
    assert record["extra_info"]["index"] == 7 and record["extra_info"]["split"] == "train"
    assert record["extra_info"]["reward_fn"] == "math" and record["extra_info"]["source"] == "numina_synthetic_math"
    assert [m["role"] for m in record["prompt"]] == ["user"]


def test_parquet_round_trip_with_pandas(tmp_path):
    examples = _examples()
    path = write_verl_parquet(tmp_path / "sub" / "data.parquet", examples)
    frame = pd.read_parquet(path)
    assert list(frame.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert len(frame) == len(examples)
    assert list(frame["data_source"]) == [e.data_source for e in examples]
    assert list(frame["ability"]) == ["math", "math", "code", "code", "arithmetic", "arithmetic", "arithmetic"]
    for (_, row), example in zip(frame.iterrows(), examples):
        messages = list(row["prompt"])
        assert messages[-1]["role"] == "user" and example.prompt_text().strip() in messages[-1]["content"]
        assert row["reward_model"]["ground_truth"] == example.answer
        # the stored ground truth still verifies through our reward registry
        if example.reward_fn == "embedded_int":
            assert (
                compute_reward(row["extra_info"]["reward_fn"], example.solution, row["reward_model"]["ground_truth"])
                == 1.0
            )
    assert list(frame["extra_info"].map(lambda x: x["index"])) == list(range(len(examples)))
    with pytest.raises(ValueError, match="empty"):
        write_verl_parquet(tmp_path / "empty.parquet", [])


@pytest.mark.verl
def test_verl_rlhf_dataset_reads_our_parquet(tmp_path):
    """verl's RLHFDataset (the consumer) loads the file, filters by prompt length and yields our rows."""
    from omegaconf import OmegaConf
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from verl.utils.dataset.rl_dataset import RLHFDataset

    core = Tokenizer(models.WordLevel({"<unk>": 0, "<pad>": 1}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", pad_token="<pad>")
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    examples = _examples()
    path = write_verl_parquet(tmp_path / "train.parquet", examples)
    cfg = OmegaConf.create(
        {
            "prompt_key": "prompt",
            "max_prompt_length": 4096,
            "filter_overlong_prompts": True,
            "filter_overlong_prompts_workers": 1,
            "cache_dir": str(tmp_path / "cache"),
        }
    )
    dataset = RLHFDataset(str(path), tok, cfg)
    assert len(dataset) == len(examples)
    for i, example in enumerate(examples):
        item = dataset[i]
        assert item["index"] == i and item["data_source"] == example.data_source
        assert item["raw_prompt"] == to_verl_record(example, i)["prompt"]
        assert item["reward_model"]["ground_truth"] == example.answer


@pytest.mark.verl
def test_compute_score_loads_through_verls_custom_reward_hook():
    """verl imports compute_score from this file by path and calls it as its reward managers do."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    import runners.data.verl_format as module

    hook = {"path": module.__file__, "name": "compute_score", "reward_kwargs": {"timeout_s": 5.0}}
    fn = get_custom_reward_fn(OmegaConf.create({"reward": {"custom_reward_function": hook}}))
    record = to_verl_record(load_examples("math500", split="test", path=FIXTURES / "math500.jsonl")[1], 0)
    kwargs = {
        "data_source": record["data_source"],
        "ground_truth": record["reward_model"]["ground_truth"],
        "extra_info": record["extra_info"],
    }
    assert fn(solution_str="so \\boxed{\\frac{2}{4}}", **kwargs) == 1.0
    assert fn(solution_str="\\boxed{\\frac{3}{4}}", **kwargs) == 0.0
    assert compute_score("gsm8k", "#### 12", "12") == 1.0  # no extra_info: the preset's reward
    with pytest.raises(KeyError, match="not a preset"):
        compute_score("openai/gsm8k", "#### 12", "12")
