"""Strict final-answer extraction and answer equivalence (torch-free, math-verify imported lazily).

Design (a pitfall measured on the shipped SmolLM2 model): math-verify's default ``parse`` takes the last
mathematical expression anywhere in a response, so a response echoing the question
(``\\boxed{66 + 24} = 110`` for gold 90) gets credited. Here the final answer is first *extracted*
strictly, by the dataset's own convention only:

- ``extract_last_boxed``: the content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (balanced braces,
  escaped ``\\{`` honoured); an unterminated last box (truncated response) gives None;
- ``extract_gsm8k_answer``: the text after the last ``####`` on its line (GSM8K's convention);
- ``extract_answer_line``: the last ``Answer: ...`` line (DAPO-Math-17k's original convention);

then *compared* with ``answers_match``: when the gold is a plain number (integer, decimal, fraction,
with units, ``$``, ``%``, thousands separators) the answer must itself be a number literal and equal
exactly (so an unevaluated expression such as ``66 + 24`` is never credited); otherwise both are
parsed by math-verify and compared symbolically under a timeout that is safe in any thread
(``verify_worker.py``).
"""

from __future__ import annotations

import re
from fractions import Fraction

from runners.data.verify_worker import math_verify_equal

# answers longer than this are rejected before any symbolic work (sympy can hang on huge inputs)
MAX_ANSWER_CHARS = 512

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def extract_last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\boxed 5``, ``\\fbox{...}``); None if none or unterminated."""
    if not text:
        return None
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    cmd = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    i = start + len(cmd)
    if i < len(text) and text[i].isalpha():  # e.g. \boxedx: not the command
        return None
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text):
        return None
    if text[i] != "{":  # "\boxed 5" form: up to the next whitespace or '$'
        match = re.match(r"[^\s$]+", text[i:])
        return match.group(0) if match else None
    depth, j = 0, i
    while j < len(text):
        ch = text[j]
        if ch == "\\":
            j += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
        j += 1
    return None


def extract_gsm8k_answer(text: str) -> str | None:
    """The answer after the last ``####`` (GSM8K), up to the end of its line; None if absent or empty."""
    if not text or "####" not in text:
        return None
    tail = text[text.rfind("####") + 4 :].split("\n", 1)[0].strip()
    return tail or None


_ANSWER_LINE = re.compile(r"^\s*(?:\*\*)?\s*(?:final\s+)?answer\s*(?:\*\*)?\s*[:：]\s*(?:\*\*)?(.+?)\s*$", re.I | re.M)


def extract_answer_line(text: str) -> str | None:
    """The answer on the last ``Answer: ...`` line (also ``Final answer:``, ``**Answer:**``)."""
    matches = _ANSWER_LINE.findall(text or "")
    if not matches:
        return None
    answer = matches[-1].strip().strip("*").strip()
    if answer.startswith("$") and answer.endswith("$") and len(answer) > 1:
        answer = answer.strip("$").strip()
    return answer or None


# -- numbers ------------------------------------------------------------------------------------
_TEXT_CMD = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox|operatorname)\s*\{[^{}]*\}")
_INT_OR_DEC = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")
_LATEX_FRAC = re.compile(r"([-+]?)\\frac\{\s*([-+]?\d+)\s*\}\{\s*([-+]?\d+)\s*\}")
_SHORT_FRAC = re.compile(r"([-+]?)\\frac(\d)(\d)")
_SLASH_FRAC = re.compile(r"([-+]?\d+)\s*/\s*([-+]?\d+)")
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_SPACED_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?: \d{3})+(?:\.\d+)?")


def _normalise_number_text(s: str) -> str:
    """Strip the decorations ``to_number`` accepts: $..$, \\(..\\), spacing commands, units, "x =", braces."""
    s = s.strip("$").strip()
    if s.startswith("\\(") and s.endswith("\\)"):
        s = s[2:-2].strip()
    s = s.replace("\u2212", "-").replace("{,}", ",")
    for token in ("\\!", "\\,", "\\;", "\\:", "\\ ", "~", "\\left", "\\right", "\\$", "\\%", "%", "$", "°"):
        s = s.replace(token, "")
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?", "", s)
    s = _TEXT_CMD.sub("", s).strip()
    s = re.sub(r"^[a-zA-Z]\s*=\s*", "", s)  # "x = 5"
    s = re.sub(r"(?<=\d)\s+[a-zA-Z][a-zA-Z .]*$", "", s)  # "12 apples", "5 cm."
    s = s.rstrip(".").strip()
    if s.startswith("{") and s.endswith("}"):
        s = s[1:-1].strip()
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    elif _SPACED_THOUSANDS.fullmatch(s):
        s = s.replace(" ", "")
    return s


def _fraction_value(s: str) -> Fraction | None:
    """``\\frac{a}{b}``, ``\\frac ab`` or ``a/b`` as a Fraction (None for anything else or a zero denominator)."""
    for pattern in (_LATEX_FRAC, _SHORT_FRAC):
        m = pattern.fullmatch(s)
        if m:
            sign, num, den = m.groups()
            if int(den) == 0:
                return None
            value = Fraction(int(num), int(den))
            return -value if sign == "-" else value
    m = _SLASH_FRAC.fullmatch(s)
    if m and int(m.group(2)) != 0:
        return Fraction(int(m.group(1)), int(m.group(2)))
    return None


def to_number(text: str) -> Fraction | None:
    """The exact rational value of a number literal, else None.

    Accepts ``72``, ``-3.50``, ``1,000``, ``\\frac{3}{4}``, ``\\dfrac12``, ``-7/2``, ``\\$18``, ``25\\%``,
    ``30^\\circ``, ``5\\text{ cm}``, ``12 apples``, ``x = 5``. Rejects anything with an operator
    between numbers (``66 + 24``, ``2^{10}``, ``\\sqrt{4}``) and mixed numbers (``2\\frac{1}{2}``).
    """
    if text is None:
        return None
    s = text.strip()
    if not s or len(s) > MAX_ANSWER_CHARS:
        return None
    s = _normalise_number_text(s)
    if _INT_OR_DEC.fullmatch(s):
        return Fraction(s)
    return _fraction_value(s)


def is_echo(answer: str, prompt: str, gold: str) -> bool:
    """True when ``answer`` is an expression copied from the question (and not the gold itself)."""

    def squash(x: str) -> str:
        return re.sub(r"\s+", "", x or "")

    a = squash(answer)
    return (
        len(a) >= 3 and re.search(r"[-+*/^=<>]|\\[a-zA-Z]", a) is not None and a in squash(prompt) and a != squash(gold)
    )


def answers_match(answer: str | None, gold: str, *, timeout_s: float = 5.0, prompt: str | None = None) -> bool:
    """Is the extracted ``answer`` equivalent to ``gold``? (See the module docstring for the rules.)"""
    if answer is None:
        return False
    answer = answer.strip()
    if not answer or len(answer) > MAX_ANSWER_CHARS:
        return False
    gold_value = to_number(gold)
    if gold_value is not None:
        return to_number(answer) == gold_value
    if prompt is not None and is_echo(answer, prompt, gold):
        return False
    return math_verify_equal(gold, answer, timeout_s=timeout_s)
