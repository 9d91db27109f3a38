"""Datasets, the embedded task, prompt formatting and verifiable rewards.

- ``types.Example``: the one record every loader returns.
- ``embedded``: the arithmetic task the tool generates itself (``generate_embedded``,
  ``EMBEDDED_ALPHABET`` for the character tokenizer).
- ``datasets``: presets (``DATASET_PRESETS``) and ``load_examples(preset, split=...)`` from a local
  file or the hub.
- ``rewards``: ``REWARDS`` registry of ``fn(response, gold, **kw) -> float``; ``answers``: strict
  final-answer extraction and equivalence; ``code_tests`` + ``sandbox``: test-case code rewards
  with untrusted programs run in a limited subprocess.
- ``prompts``: plain and chat-template prompts; ``verl_format``: verl's parquet records.

Importing this package imports neither torch, ``datasets`` nor math-verify.
"""

from runners.data.embedded import EMBEDDED_ALPHABET, generate_embedded
from runners.data.types import Example

__all__ = ["EMBEDDED_ALPHABET", "Example", "generate_embedded"]
