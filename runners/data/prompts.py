"""Prompt formatting: plain prompts for the embedded model, chat-template prompts for instruct models.

Design: an ``Example`` stores the bare question; the answer-format instruction is added here, per
dataset (``DatasetPreset.prompt_style``), so the instruction always matches what the reward
extracts: ``boxed`` for math (last ``\\boxed{}``), ``gsm8k`` for GSM8K's ``#### N``,
``answer_line`` for DAPO-Math's original ``Answer:`` line, ``code`` for a fenced Python block.
The embedded task's prompts are used verbatim (no instruction, no template: a character-level
model learned the format in its warm start).

``system_prompt="troll"`` reproduces TROLL (arXiv 2510.03817) Listing 4 (the thinking-format system prompt used
for DAPO-Train, DAPO-Eval and Math-Eval), with the user turn ending in the paper's
"Present the answer in LaTeX format: \\boxed{Your answer}." instruction.

    from runners.data.prompts import build_messages, format_prompt, encode_prompt
    ids = encode_prompt(example, tokenizer, chat=True)
"""

from __future__ import annotations

from typing import Any

from runners.data.types import ChatMessages, Example

INSTRUCTIONS = {
    "boxed": "Please reason step by step, and put your final answer within \\boxed{}.",
    "troll": "Present the answer in LaTeX format: \\boxed{Your answer}.",
    "gsm8k": 'Solve the problem step by step. Write the final answer as a number on the last line, after "####" (for example "#### 42").',
    "answer_line": (
        "Solve the problem step by step. The last line of your response should be of the form "
        '"Answer: $Answer" (without quotes) where $Answer is the answer to the problem.'
    ),
    "code": "Write a complete Python 3 solution in a single ```python code block at the end of your answer.",
}

# TROLL (arXiv 2510.03817) Listing 4 (system prompt of DAPO-Train, DAPO-Eval and Math-Eval)
TROLL_SYSTEM_PROMPT = (
    "Your task is to follow a systematic, thorough reasoning process before providing the final solution. "
    "This involves analyzing, summarizing, exploring, reassessing, and refining your thought process through "
    "multiple iterations. Structure your response into two sections: Thought and Solution. In the Thought "
    'section, present your reasoning using the format: "<think>\n {thoughts} </think>\n". Each thought should '
    'include detailed analysis, brainstorming, verification, and refinement of ideas. After "</think>\n," in '
    "the Solution section, provide the final, logical, and accurate answer, clearly derived from the "
    "exploration in the Thought section."
)
SYSTEM_PROMPTS = {"none": None, "troll": TROLL_SYSTEM_PROMPT}


def preset_style(example: Example) -> str | None:
    """The prompt style of the example's dataset preset (None for the embedded task)."""
    from runners.data.datasets import PRESETS

    preset = PRESETS.get(example.data_source)
    if preset is not None:
        return preset.prompt_style
    return {"math": "boxed", "math_answer_line": "answer_line", "gsm8k": "gsm8k", "code": "code"}.get(example.reward_fn)


def user_content(example: Example, *, style: str | None = None) -> str:
    """The question followed by the style's instruction (style None: the question alone)."""
    if style is None:
        return example.prompt_text()
    question = example.prompt_text().strip()
    if style not in INSTRUCTIONS:
        raise ValueError(f"unknown prompt style {style!r}; valid styles: {', '.join(sorted(INSTRUCTIONS))}")
    return f"{question}\n\n{INSTRUCTIONS[style]}"


def build_messages(example: Example, *, style: str | None = "preset", system_prompt: str | None = None) -> ChatMessages:
    """Chat messages ``[{"role": "system"?}, {"role": "user"}]`` for an instruct model.

    ``style="preset"`` uses the dataset's style; ``system_prompt`` is a name of ``SYSTEM_PROMPTS``
    (``"troll"`` also switches the math instruction to the paper's wording) or literal text.
    """
    if style == "preset":
        style = preset_style(example)
    if system_prompt == "troll" and style == "boxed":
        style = "troll"
    system = SYSTEM_PROMPTS.get(system_prompt, system_prompt) if system_prompt else None
    messages: ChatMessages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": user_content(example, style=style)})
    return messages


def _is_plain(example: Example) -> bool:
    return example.data_source == "embedded" and isinstance(example.prompt, str)


def format_prompt(
    example: Example,
    tokenizer: Any = None,
    *,
    chat: bool = True,
    style: str | None = "preset",
    system_prompt: str | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> str:
    """The prompt text the policy continues.

    Embedded examples: the stored plain prompt, verbatim. Otherwise, with ``chat`` and a tokenizer
    that has a chat template: ``tokenizer.apply_chat_template(messages, add_generation_prompt=True)``
    (``chat_template_kwargs`` e.g. ``{"enable_thinking": True}`` for Qwen3); else the user content
    followed by a newline.
    """
    if _is_plain(example):
        return example.prompt
    messages = build_messages(example, style=style, system_prompt=system_prompt)
    if chat and tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **(chat_template_kwargs or {})
        )
    return "\n\n".join(m["content"] for m in messages) + "\n"


def encode_prompt(example: Example, tokenizer: Any, *, chat: bool = False, **kwargs: Any) -> list[int]:
    """Token ids of ``format_prompt(...)``.

    A chat-templated text already holds the template's special tokens, so it is encoded without
    adding more; a plain prompt gets the tokenizer's usual specials (the char tokenizer's ``<bos>``).
    """
    templated = chat and bool(getattr(tokenizer, "chat_template", None)) and not _is_plain(example)
    text = format_prompt(example, tokenizer, chat=chat, **kwargs)
    return list(tokenizer(text, add_special_tokens=not templated)["input_ids"])
