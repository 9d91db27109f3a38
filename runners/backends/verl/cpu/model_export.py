"""The project's own models as Hugging Face directories verl can load (``model=embedded``, ``model=tiny_*``).

Design: verl loads a policy from a directory (``AutoModelForCausalLM``, ``AutoTokenizer``, the
tokenizer's chat template). The embedded default and the tiny test models are built in code
(``runners.models.loader.load_model``), so ``export_model`` writes the very model and tokenizer the
built-in backend trains into ``<model cache>/verl/<kind>-<name>-<hash>/``, keyed by what determines
the weights (kind, arch, dtype, the model's options, ``EXPORT_VERSION``), built once under a file
lock and renamed into place. The folder holds:

- the weights and config (``save_pretrained``) and the tokenizer files;
- a chat template (``plain_template``) whose tokens are the built-in backend's plain prompt: the
  special tokens the tokenizer adds (``<bos>`` for the character tokenizer, none for SmolLM2's) and
  the user content verbatim, so the prompt verl builds from a chat message is the one the built-in
  backend feeds the model (``runners.data.prompts.encode_prompt``); the tokenizer's own template
  when the model config asks for chat templates. ``prompt_template`` gives the template a cell
  needs (verbatim for the embedded task, contents plus a newline for the other datasets);
- ``tokenizer/``: the tokenizer alone, without ``config.json``. verl opens tokenizers with
  ``AutoTokenizer``, which for a ``qwen2`` config swaps the saved character tokenizer for
  ``Qwen2Tokenizer`` and loses newlines (``runners.models.loader.load_tokenizer``); without the
  model config next to it the saved class is used, so CPU mode points
  ``actor_rollout_ref.model.tokenizer_path`` here;
- ``export.json``: what was exported and from which recipe.

Which kinds can be exported is declared on the model registry (``provides=("hf_export",)``).

    python -m runners.backends.verl.cpu.model_export model=tiny_qwen2     # prints the folder
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runners.paths import model_cache_dir

EXPORT_VERSION = 2
EXPORT_CAPABILITY = "hf_export"
TOKENIZER_SUBDIR = "tokenizer"
# the messages' contents joined as runners.data.prompts.format_prompt joins them without a chat template
_CONTENTS = "{% for message in messages %}{% if not loop.first %}\n\n{% endif %}{{ message['content'] }}{% endfor %}"


def special_affixes(tokenizer) -> tuple[str, str]:
    """The special tokens ``tokenizer(text)`` puts before and after a text, as text (e.g. ``("<bos>", "")``)."""
    probe = "0"
    plain = tokenizer(probe, add_special_tokens=False)["input_ids"]
    full = tokenizer(probe, add_special_tokens=True)["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            before, after = full[:start], full[start + len(plain) :]
            return "".join(tokenizer.convert_ids_to_tokens(before)), "".join(tokenizer.convert_ids_to_tokens(after))
    raise ValueError(f"tokenizer {tokenizer.name_or_path!r}: the encoding of {probe!r} does not contain the plain one")


def plain_template(tokenizer, *, newline: bool) -> str:
    """A chat template whose tokens are the built-in backend's prompt without a chat template
    (``runners.data.prompts.encode_prompt``): the tokenizer's own special tokens around the messages'
    contents, verbatim (plain prompts: the embedded task) or joined and ended with a newline (others)."""
    before, after = special_affixes(tokenizer)
    literal = lambda text: "{{ " + repr(text) + " }}" if text else ""  # noqa: E731
    return literal(before) + _CONTENTS + ("{{ '\\n' }}" if newline else "") + literal(after)


def exportable(kind: str) -> bool:
    """Whether the model kind can be written as a Hugging Face directory here (registry declaration)."""
    from runners.models.loader import MODEL_KINDS

    return kind in MODEL_KINDS and EXPORT_CAPABILITY in MODEL_KINDS.entry(kind).provides


def _plain(node: Any) -> dict[str, Any]:
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(node, DictConfig):
            return dict(OmegaConf.to_container(node, resolve=True))
    except ImportError:  # pragma: no cover
        pass
    return dict(node or {})


def export_spec(model_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """What determines an exported folder (its hash names the folder)."""
    model = _plain(model_cfg)
    spec = {
        "version": EXPORT_VERSION,
        "kind": model["kind"],
        "arch": model.get("arch"),
        "dtype": model.get("dtype", "float32"),
        "options": _plain(model.get("options")),
        "chat_template": bool(model.get("chat_template", False)),
    }
    from runners.models.loader import MODEL_KINDS

    export_key = MODEL_KINDS.hook(model["kind"], "export_key")
    if export_key is not None:  # e.g. the embedded recipe's hash: it covers defaults that may change
        spec["recipe"] = export_key(**spec["options"])
    return spec


def export_dir(model_cfg: Mapping[str, Any], cache_dir: str | Path | None = None) -> Path:
    spec = export_spec(model_cfg)
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    root = Path(cache_dir) if cache_dir is not None else model_cache_dir()
    return root / "verl" / f"{spec['kind']}-{_plain(model_cfg)['name']}-{key}"


def _is_exported(folder: Path) -> bool:
    return (folder / "export.json").is_file() and (folder / TOKENIZER_SUBDIR / "tokenizer_config.json").is_file()


def _write(folder: Path, model_cfg: Mapping[str, Any]) -> None:
    from runners.models.loader import load_model

    model = _plain(model_cfg)
    net, tokenizer = load_model(
        model["kind"], arch=model.get("arch"), dtype=model.get("dtype", "float32"), **_plain(model.get("options"))
    )
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(net.config, key, None) is None and getattr(tokenizer, key, None) is not None:
            setattr(net.config, key, getattr(tokenizer, key))
    if not model.get("chat_template") or not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = plain_template(tokenizer, newline=False)
    net.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    tokenizer.save_pretrained(folder / TOKENIZER_SUBDIR)
    spec = export_spec(model_cfg)
    info = {"spec": spec, "name": model["name"], "parameters": sum(p.numel() for p in net.parameters())}
    (folder / "export.json").write_text(json.dumps(info, indent=2) + "\n")


def export_model(model_cfg: Mapping[str, Any], *, cache_dir: str | Path | None = None) -> Path:
    """The Hugging Face directory of the model node ``model_cfg`` (kind embedded or tiny), written if missing."""
    kind = _plain(model_cfg)["kind"]
    if not exportable(kind):
        raise ValueError(f"model kind {kind!r} cannot be exported (it is not declared {EXPORT_CAPABILITY!r})")
    from filelock import FileLock

    target = export_dir(model_cfg, cache_dir)
    if _is_exported(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if _is_exported(target):
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            _write(tmp, model_cfg)
            if target.exists():  # an interrupted older export
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def prompt_template(cfg: Any, model_dir: str | Path) -> str | None:
    """The chat template verl must use for the cell's prompts to be the built-in backend's (None: the
    tokenizer's own), made from the tokenizer of the local model directory (an export's ``tokenizer/``)."""
    from runners.data.datasets import PRESETS
    from runners.models.loader import load_tokenizer

    preset = PRESETS.get(str(cfg.dataset.name))
    plain = preset is not None and preset.prompt_style is None  # format_prompt uses the prompt verbatim
    if not plain and cfg.model.chat_template:
        return None
    folder = Path(model_dir) / TOKENIZER_SUBDIR
    tokenizer = load_tokenizer(folder if folder.is_dir() else Path(model_dir))
    return plain_template(tokenizer, newline=not plain)


def main(argv: list[str] | None = None) -> int:
    import sys

    from runners.config import compose

    cfg, _ = compose(list(sys.argv[1:] if argv is None else argv))
    print(export_model(cfg.model))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
