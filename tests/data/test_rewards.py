"""Reward functions on adversarial responses (hand-computed verdicts), and agreement with
math-verify itself (the reference implementation) wherever strict extraction leaves it the decision."""

from __future__ import annotations

import threading
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runners.data.answers import extract_answer_line, extract_gsm8k_answer, extract_last_boxed, to_number
from runners.data.rewards import REWARDS, compute_reward, compute_rewards
from runners.data.verify_worker import VerifyWorker

# (reward, response, gold, expected) -- verdicts computed by hand
ADVERSARIAL = [
    # echoes of the question: an unevaluated expression is not an answer
    ("math", r"\boxed{66 + 24} = 110", "90", 0.0),
    ("math", r"The sum is \boxed{66+24}.", "90", 0.0),
    ("gsm8k", "#### 66 + 24", "90", 0.0),
    ("embedded_int", r"\boxed{347+285}", "632", 0.0),
    ("math", r"\boxed{2^{10}}", "1024", 0.0),
    # several boxes: the last one counts
    ("math", r"first \boxed{3}, corrected: \boxed{5}", "5", 1.0),
    ("math", r"first \boxed{3}, corrected: \boxed{5}", "3", 0.0),
    ("embedded_int", "\\boxed{1}\n\\boxed{2}", "1", 0.0),
    # no box / empty / truncated
    ("math", "The answer is 90.", "90", 0.0),
    ("math", "", "90", 0.0),
    ("math", r"so \boxed{9", "9", 0.0),
    ("embedded_int", "", "5", 0.0),
    ("embedded_int", r"\boxed{}", "5", 0.0),
    ("gsm8k", "I think 72", "72", 0.0),
    # units, currency, percent, degrees
    ("math", r"\boxed{5\text{ cm}}", "5", 1.0),
    ("math", r"\boxed{\$18.00}", "18", 1.0),
    ("math", r"\boxed{25\%}", "25", 1.0),
    ("math", r"\boxed{30^\circ}", "30", 1.0),
    ("gsm8k", "#### $1,234 dollars", "1234", 1.0),
    ("math", r"\boxed{5x}", "5", 0.0),
    # LaTeX fractions and decimals
    ("math", r"\boxed{\frac{1}{2}}", "0.5", 1.0),
    ("math", r"\boxed{\dfrac{3}{4}}", r"\frac{3}{4}", 1.0),
    ("math", r"\boxed{-\frac{7}{2}}", "-3.5", 1.0),
    ("math", r"\boxed{\frac12}", "1/2", 1.0),
    ("math", r"\boxed{\frac{1}{3}}", "0.33", 0.0),
    # thousands separators
    ("math", r"\boxed{1,000}", "1000", 1.0),
    ("math", r"\boxed{1{,}000{,}000}", "1000000", 1.0),
    ("gsm8k", "#### 1,000", "1000", 1.0),
    ("math", r"\boxed{1,00}", "100", 0.0),
    # trailing text after the final answer
    ("math", r"\boxed{42}. I hope this helps!", "42", 1.0),
    ("gsm8k", "so she earns 18.\n#### 18\nThat is all.", "18", 1.0),
    ("embedded_int", "7+5=12\n\\boxed{632}\n", "632", 1.0),
    # nested braces and escaped braces
    ("math", r"\boxed{\frac{1}{\sqrt{2}}}", r"\frac{\sqrt{2}}{2}", 1.0),
    ("math", r"\boxed{\{1, 2\}}", r"\{1,2\}", 1.0),
    # symbolic golds go to math-verify
    ("math", r"\boxed{\sqrt{12}}", r"2\sqrt{3}", 1.0),
    ("math", r"\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
    ("math", r"\boxed{x^2+1}", "(x+1)^2", 0.0),
    ("math", r"\boxed{(1, 2)}", "(1,2)", 1.0),
    # conventions: GSM8K prefers ####, answer lines, assignment form
    ("gsm8k", "#### 72\n\\boxed{71}", "72", 1.0),
    ("gsm8k", r"so \boxed{72}", "Natalia sold 48/2 = 24 clips.\n#### 72", 1.0),
    ("math_answer_line", "work...\nAnswer: 34", "34", 1.0),
    ("math_answer_line", "Answer: 12\nwait\n**Answer:** 34", "34", 1.0),
    ("math_answer_line", r"\boxed{34}", "34", 0.0),
    ("math", r"\boxed{x = 5}", "5", 1.0),
]


@pytest.mark.parametrize(("name", "response", "gold", "expected"), ADVERSARIAL)
def test_adversarial_responses(name, response, gold, expected):
    assert compute_reward(name, response, gold) == expected


def test_design_echo_is_credited_by_plain_math_verify_but_not_here():
    """The measured pitfall: math-verify's default parse credits the echo; ours does not."""
    from math_verify import parse, verify

    response = r"\boxed{66 + 24} = 110"
    assert verify(parse("90"), parse(response))  # the pitfall, reproduced with the reference library
    assert compute_reward("math", response, "90") == 0.0


def test_echo_of_a_symbolic_question_is_rejected_when_the_prompt_is_given():
    prompt = r"Simplify $\sqrt{12}$."
    assert compute_reward("math", r"\boxed{\sqrt{12}}", r"2\sqrt{3}") == 1.0
    assert compute_reward("math", r"\boxed{\sqrt{12}}", r"2\sqrt{3}", prompt=prompt) == 0.0
    assert compute_reward("math", r"\boxed{2\sqrt{3}}", r"2\sqrt{3}", prompt=prompt) == 1.0


def test_extractors_by_hand():
    assert extract_last_boxed(r"a \boxed{1} b \boxed{\frac{2}{3}} c") == r"\frac{2}{3}"
    assert extract_last_boxed(r"\boxed 7 apples") == "7"
    assert extract_last_boxed(r"\fbox{8}") == "8"
    assert extract_last_boxed("no box") is None
    assert extract_last_boxed(r"\boxedx{3}") is None  # another command that starts with \boxed
    assert extract_gsm8k_answer("x\n#### 12\n") == "12"
    assert extract_gsm8k_answer("####") is None
    assert extract_answer_line("Final Answer: $\\frac{1}{2}$") == "\\frac{1}{2}"


def _literal(value: Fraction, style: int) -> str:
    if value.denominator == 1 and style == 0:
        return str(value.numerator)
    if style == 1:
        sign = "-" if value < 0 else ""
        return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"
    return f"{value.numerator}/{value.denominator}"


@settings(max_examples=40, deadline=None)
@given(
    a=st.fractions(min_value=-50, max_value=50, max_denominator=12),
    b=st.fractions(min_value=-50, max_value=50, max_denominator=12),
    style_a=st.integers(0, 2),
    style_b=st.integers(0, 2),
    same=st.booleans(),
)
def test_numeric_path_agrees_with_math_verify(a, b, style_a, style_b, same):
    """On number literals our exact comparison gives math-verify's verdict (reference implementation)."""
    from math_verify import parse, verify

    if same:
        b = a
    gold, answer = _literal(a, style_a), _literal(b, style_b)
    reference = verify(parse(f"${gold}$"), parse(f"$\\boxed{{{answer}}}$"))
    assert compute_reward("math", f"\\boxed{{{answer}}}", gold) == float(reference)
    assert to_number(answer) == b


def test_math_reward_from_a_worker_thread():
    """math-verify's signal timeout fails outside the main thread; our wrapper must still verify."""
    results = {}

    def work():
        results["right"] = compute_reward("math", r"\boxed{\sqrt{12}}", r"2\sqrt{3}")
        results["wrong"] = compute_reward("math", r"\boxed{\sqrt{13}}", r"2\sqrt{3}")

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=120)
    assert results == {"right": 1.0, "wrong": 0.0}


def test_helper_exceeding_the_timeout_is_killed_and_replaced():
    worker = VerifyWorker()
    try:
        assert worker.request({"gold": "\\frac{1}{2}", "answer": "0.5"}, 30.0) == {"equal": True}
        assert worker.request({"sleep": 60}, 0.5) is None  # no reply in time: helper killed
        assert worker.restarts == 1
        assert worker.request({"gold": "x+1", "answer": "1+x"}, 30.0) == {"equal": True}  # a fresh helper
    finally:
        worker.close()


def test_helper_works_under_an_unimportable_main(tmp_path):
    """``python -c`` / stdin scripts have no importable __main__ (multiprocessing spawn would fail)."""
    import subprocess
    import sys

    code = (
        "import threading\n"
        "from runners.data.rewards import compute_reward\n"
        "out = []\n"
        "t = threading.Thread(target=lambda: out.append(compute_reward('math', r'\\boxed{\\sqrt{12}}', r'2\\sqrt{3}')))\n"
        "t.start(); t.join()\n"
        "print(out)\n"
    )
    result = subprocess.run([sys.executable, "-"], input=code, capture_output=True, text=True, timeout=300)
    assert result.stdout.strip() == "[1.0]", result.stderr[-2000:]


def test_registry_lists_every_reward_and_rejects_unknown_names():
    assert {"embedded_int", "math", "math_answer_line", "gsm8k", "code"} <= set(REWARDS.names())
    with pytest.raises(KeyError, match="valid names"):
        REWARDS.get("nope")


def test_batch_rewards_match_one_by_one():
    import json

    cases = json.dumps({"inputs": ["2\n"], "outputs": ["4\n"]})
    names = ["math", "code", "gsm8k", "code", "embedded_int"]
    responses = [
        r"\boxed{90}",
        "```python\nprint(int(input()) * 2)\n```",
        "#### 7",
        "```python\nprint(5)\n```",
        r"\boxed{3}",
    ]
    golds = ["90", cases, "8", cases, "3"]
    expected = [compute_reward(n, r, g) for n, r, g in zip(names, responses, golds)]
    assert expected == [1.0, 1.0, 0.0, 0.0, 1.0]
    assert compute_rewards(names, responses, golds, max_workers=3) == expected
    with pytest.raises(ValueError, match="equal lengths"):
        compute_rewards(["math"], [], [])


def test_importing_the_data_package_stays_light():
    """The CLI and analysis import runners.data: no torch, datasets, math-verify or pandas at import."""
    import subprocess
    import sys

    code = (
        "import sys, runners.data, runners.data.rewards, runners.data.datasets, runners.data.prompts, "
        "runners.data.verl_format\n"
        "heavy = [m for m in ('torch', 'datasets', 'math_verify', 'pandas') if m in sys.modules]\n"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
