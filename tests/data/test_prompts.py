"""Prompt formatting: the embedded prompt stays verbatim, instruct prompts carry the instruction
that matches the preset's reward, and chat templates render as the hand-written ChatML string."""

from __future__ import annotations

from pathlib import Path

import pytest

from runners.data.datasets import load_examples
from runners.data.prompts import INSTRUCTIONS, TROLL_SYSTEM_PROMPT, build_messages, encode_prompt, format_prompt
from runners.data.rewards import compute_reward

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "datasets"
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture
def chat_tokenizer():
    """A tiny whitespace word-level tokenizer with a ChatML template (no hub access)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = "<unk> <pad> <bos> user assistant system Simplify".split()
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    # like many base tokenizers, it prepends <bos> when asked for special tokens
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", pad_token="<pad>", bos_token="<bos>")
    tok.chat_template = CHATML
    return tok


def test_embedded_prompt_is_verbatim_and_encodes_with_bos():
    from runners.data.embedded import EMBEDDED_ALPHABET
    from runners.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer(EMBEDDED_ALPHABET)
    example = load_examples("embedded", split="test", limit=1)[0]
    assert format_prompt(example, tok, chat=True) == example.prompt  # never templated
    ids = encode_prompt(example, tok, chat=True)
    assert ids[0] == tok.bos_token_id and len(ids) == len(example.prompt) + 1
    assert tok.decode(ids, skip_special_tokens=True) == example.prompt


def test_chat_template_rendering_by_hand(chat_tokenizer):
    example = load_examples("math500", split="test", path=FIXTURES / "math500.jsonl")[0]
    expected = (
        "<|im_start|>user\nSimplify $\\sqrt{50}$.\n\n" + INSTRUCTIONS["boxed"] + "<|im_end|>\n<|im_start|>assistant\n"
    )
    assert format_prompt(example, chat_tokenizer) == expected
    ids = encode_prompt(example, chat_tokenizer, chat=True)
    assert ids == chat_tokenizer(expected, add_special_tokens=False)["input_ids"]  # no extra <bos>
    assert chat_tokenizer(expected)["input_ids"][0] == chat_tokenizer.bos_token_id != ids[0]


@pytest.mark.parametrize(
    ("preset", "fixture", "split", "instruction", "reward_response"),
    [
        ("gsm8k", "gsm8k.jsonl", "train", "gsm8k", "#### 26"),
        ("math500", "math500.jsonl", "test", "boxed", "\\boxed{5\\sqrt{2}}"),
        ("eurus2_code", "eurus2.jsonl", "test", "code", None),
    ],
)
def test_instruction_matches_the_reward_convention(preset, fixture, split, instruction, reward_response):
    """The instruction each preset appends asks for exactly the form its reward extracts."""
    example = load_examples(preset, split=split, path=FIXTURES / fixture)[0]
    messages = build_messages(example)
    assert messages[-1]["role"] == "user" and messages[-1]["content"].endswith(INSTRUCTIONS[instruction])
    if reward_response is not None:
        assert compute_reward(example.reward_fn, reward_response, example.answer) == 1.0


def test_troll_system_prompt_and_paper_instruction():
    example = load_examples("dapo_math", split="train", path=FIXTURES / "dapo_math.jsonl", holdout=1)[0]
    system, user = build_messages(example, system_prompt="troll")
    assert system == {"role": "system", "content": TROLL_SYSTEM_PROMPT}
    assert user["content"].endswith("Present the answer in LaTeX format: \\boxed{Your answer}.")
    assert build_messages(example, style="answer_line")[-1]["content"].endswith(INSTRUCTIONS["answer_line"])


def test_plain_fallback_without_template_and_unknown_style():
    example = load_examples("aime25", split="test", path=FIXTURES / "aime25.jsonl")[0]
    text = format_prompt(example, tokenizer=None)
    assert text.startswith("Find the remainder") and text.endswith(INSTRUCTIONS["boxed"] + "\n")
    with pytest.raises(ValueError, match="valid styles"):
        build_messages(example, style="latex")
