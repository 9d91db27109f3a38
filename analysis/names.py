"""Matching logged names (eval data sets, models, algorithms) to the papers' row and column names.

Design: runs name their evaluation data freely (``val-core/<data>/acc/mean_at_<n>``) and tag
models by hub id or short name. Matching goes through a normalised key (lower case, alphanumerics
only) and small alias tables, so ``AIME_2024``, ``aime24`` and ``aime2024`` all find the paper's
"AIME24" column, and ``Qwen/Qwen3-8B`` finds "Qwen3-8B".
"""

from __future__ import annotations

import re

from runners import metric_names

_EVAL = re.compile(r"^val-core/(?P<data>.+)/acc/mean_at_(?P<n>\d+)$")
_ACCEPT_BUCKET = re.compile(
    "^"
    + re.escape(metric_names.trm_accept_rate_bucket(314159, 271828))
    .replace("314159", r"(\d+)")
    .replace("271828", r"(\d+)")
    + "$"
)
_TV_BUCKET = re.compile(
    "^"
    + re.escape(metric_names.trm_tv_position_bucket(314159, 271828))
    .replace("314159", r"(\d+)")
    .replace("271828", r"(\d+)")
    + "$"
)

# canonical benchmark key -> aliases (normalised on use)
EVAL_ALIASES: dict[str, tuple[str, ...]] = {
    "dapo_eval": ("dapo_eval", "dapo-eval", "dapo_math_eval", "dapo_test", "dapo", "dapo_math"),
    "math_eval": ("math_eval", "math-eval", "matheval"),
    "aime24": ("aime24", "aime_24", "aime2024", "aime_2024"),
    "aime25": ("aime25", "aime_25", "aime2025", "aime_2025"),
    "amc": ("amc", "amc23", "amc2023"),
    "math500": ("math500", "math_500", "math"),
    "omni_math": ("omni_math", "omnimath", "omni-math"),
    "olympiad": ("olympiadbench", "olympiad_bench", "olympiad"),
    "minerva": ("minerva", "minerva_math"),
    "gsm8k": ("gsm8k", "gsm8k_test"),
    "test_normal": ("test_normal", "appworld_test_normal"),
    "test_challenge": ("test_challenge", "appworld_test_challenge"),
    "dev": ("dev", "validation", "val", "appworld_dev"),
}

# algorithm tag (conf/algorithm preset) -> paper display names
ALGORITHM_NAMES: dict[str, str] = {
    "grpo": "GRPO",
    "drgrpo": "Dr.GRPO",
    "ppo": "PPO",
    "gspo": "GSPO",
    "rfpp": "RF++",
    "rloo": "RLOO",
    "loop": "LOOP",
    "dapo": "DAPO",
    "gpg": "GPG",
    "bapo": "BAPO",
    "gtpo": "GTPO",
    "tppo": "T-PPO",
    "repo_r": "REPO-R",
    "repo_d": "REPO-D",
    "adapo": "ADAPO",
    "entropy_bonus": "GRPO + H bonus",
    "token_is": "Token-IS",
}


def norm(name: object) -> str:
    """Lower-case alphanumerics of ``name`` (after dropping a ``org/`` hub prefix)."""
    text = str(name).rsplit("/", 1)[-1]
    return re.sub(r"[^a-z0-9]", "", text.lower())


def eval_metrics(metric_names: list[str]) -> dict[str, str]:
    """{data set: metric} of the pass@1 metrics present; the largest ``mean_at_n`` per data set wins."""
    best: dict[str, tuple[int, str]] = {}
    for name in metric_names:
        m = _EVAL.match(name)
        if m:
            n = int(m.group("n"))
            if m.group("data") not in best or n > best[m.group("data")][0]:
                best[m.group("data")] = (n, name)
    return {data: name for data, (_, name) in sorted(best.items())}


def find_eval(metric_names: list[str], canonical: str) -> str | None:
    """The pass@1 metric of the benchmark ``canonical`` (a key of EVAL_ALIASES), if logged."""
    if canonical not in EVAL_ALIASES:
        raise KeyError(f"unknown benchmark {canonical!r}; valid: {', '.join(EVAL_ALIASES)}")
    wanted = {norm(a) for a in EVAL_ALIASES[canonical]}
    for data, metric in eval_metrics(metric_names).items():
        if norm(data) in wanted:
            return metric
    return None


def match_name(name: object, candidates: list[str]) -> str | None:
    """The candidate whose normalised form equals ``name``'s (e.g. a model tag vs the paper's model)."""
    key = norm(name)
    for c in candidates:
        if norm(c) == key:
            return c
    return None


def algorithm_name(tag: object) -> str:
    return ALGORITHM_NAMES.get(str(tag), str(tag))


def paper_method(algorithm: object, method: object) -> str:
    """The paper's name for a run's method: from its ``algorithm`` tag, else its display label."""
    if isinstance(algorithm, str) and algorithm:
        return algorithm_name(algorithm)
    return str(method)


def accept_rate_buckets(metric_names: list[str]) -> list[tuple[int, int, str]]:
    """[(lo, hi, metric)] of the ``trm/accept_rate/len_<lo>_<hi>`` metrics, sorted by lo."""
    out = []
    for name in metric_names:
        m = _ACCEPT_BUCKET.match(name)
        if m:
            out.append((int(m.group(1)), int(m.group(2)), name))
    return sorted(out)


def tv_position_buckets(metric_names: list[str]) -> list[tuple[int, int, str]]:
    """[(lo, hi, metric)] of the ``trm/tv/pos_<lo>_<hi>`` metrics, sorted by lo."""
    out = []
    for name in metric_names:
        m = _TV_BUCKET.match(name)
        if m:
            out.append((int(m.group(1)), int(m.group(2)), name))
    return sorted(out)
