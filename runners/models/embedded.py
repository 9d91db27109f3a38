"""The embedded default model: a tiny Llama warm-started on the embedded arithmetic task, cached.

Design: the install ships no weights. The default policy is a ~0.25M-parameter Llama (the real
architecture, shrunk) with a character-level tokenizer, trained from a fixed seed by supervised
next-token prediction on the reference column-step solutions of ``runners.data.embedded`` (loss on
the response and its EOS only). The supervised loss uses label smoothing (0.05): the warm-started
policy's token distributions stay soft, so greedy decoding solves ~71% of the test problems while
sampling at temperature 1 solves ~15%. That gap is what RL on this task closes within a couple of
minutes, by sharpening a habit shared by every problem. Without smoothing the policy is confident
(greedy 52%, sampled 35%), the gap is problem-specific, and GRPO on 2 CPU cores barely moves the
held-out success (measured: +0.02 after 150 steps at lr 1e-4; collapse at lr >= 3e-4), so a demo
could not show the methods apart. The result is saved in the Hugging Face layout under
``model_cache_dir()/embedded/<recipe hash>/`` (weights, tokenizer, ``recipe.json``, ``build.json``
with the loss curve and timings); any change of the recipe changes the hash, so variants coexist. A
file lock serialises parallel sweep jobs: the first builds (temporary directory renamed into place),
the others wait and load. Llama rather than Qwen2: transformers 5 maps the ``qwen2`` model type to
``Qwen2Tokenizer``, which rebuilds a byte-level BPE and drops the newlines of a char tokenizer when
the folder is opened with a plain ``AutoTokenizer`` (as verl does); ``llama`` keeps tokenizer.json.

    from runners.models.embedded import load_embedded_model
    model, tokenizer = load_embedded_model()                  # builds once (~1 min on 2 cores)
    model, tokenizer = load_embedded_model(steps=50, seed=1)  # a cheaper variant (tests)

    python -m runners.models.embedded          # build or load the default, print its accuracy
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from runners.paths import model_cache_dir

# bump when the training procedure changes in a way the recipe fields do not capture
RECIPE_VERSION = 1


@dataclass(frozen=True)
class EmbeddedRecipe:
    """Everything that determines the embedded model's weights (its hash names the cache folder)."""

    # task: runners.data.embedded.generate_embedded knobs of the training problems
    digits: int = 3
    ops: str = "+-*"
    n_train: int = 30_000
    # long-tailed lengths (a T-PPO task): this share of the problems with digits+1..long_digits digits
    long_fraction: float = 0.0
    long_digits: int = 0
    # architecture: a transformers config of this family, shrunk (runners.models.tiny)
    arch: str = "llama"
    hidden_size: int = 64
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 256
    # optimisation: AdamW, linear warm-up then cosine decay to min_lr_ratio * lr
    steps: int = 600
    batch_size: int = 64
    lr: float = 3e-3
    warmup_ratio: float = 0.05
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    # label smoothing of the supervised loss: keeps the warm-started policy's token distributions soft
    label_smoothing: float = 0.05
    # weights init, problem sampling and batch order
    seed: int = 0
    version: int = RECIPE_VERSION

    def key(self) -> str:
        """16 hex digits of a hash of every field (the cache folder name); the fields added later
        (``ADDED_FIELDS``) enter only when they differ from their default, so recipes that existed
        before keep their key (and their cached model)."""
        data = {k: v for k, v in asdict(self).items() if k not in ADDED_FIELDS or v != ADDED_FIELDS[k]}
        blob = json.dumps(data, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


# fields added after the first recipes were cached, with their defaults (left out of the key at the default)
ADDED_FIELDS = {"long_fraction": 0.0, "long_digits": 0}


def make_recipe(**overrides: Any) -> EmbeddedRecipe:
    """The default recipe with ``overrides`` applied; unknown fields raise naming the valid ones."""
    valid = {f.name for f in fields(EmbeddedRecipe)} - {"version"}
    unknown = sorted(set(overrides) - valid)
    if unknown:
        raise TypeError(f"unknown embedded recipe field(s) {unknown}; valid: {', '.join(sorted(valid))}")
    recipe = replace(EmbeddedRecipe(), **overrides)
    if recipe.steps < 1 or recipe.batch_size < 1 or recipe.n_train < 1:
        raise ValueError(f"embedded recipe needs steps, batch_size and n_train >= 1, got {recipe}")
    return recipe


def recipe_key(**overrides: Any) -> str:
    """The key of the recipe ``overrides`` select (the ``export_key`` hook of model kind ``embedded``:
    it covers the recipe's defaults, which the model config does not name)."""
    return make_recipe(**overrides).key()


def embedded_model_dir(recipe: EmbeddedRecipe, cache_dir: str | Path | None = None) -> Path:
    root = Path(cache_dir) if cache_dir is not None else model_cache_dir()
    return root / "embedded" / recipe.key()


def encode_sft_batch(examples, tokenizer, *, check_rows: int = 64):
    """Tokenise ``<bos> prompt solution <eos>`` rows for a character tokenizer, right-padded.

    Returns (input_ids [N,L] long, attention_mask [N,L] long, labels [N,L] long with -100 on the
    prompt and padding): the target of next-token prediction on the response only. Characters are
    mapped through a lookup table (one token per character, ~20x faster than calling the tokenizer
    on 30k texts); the first ``check_rows`` rows are checked against the tokenizer itself.
    """
    import numpy as np
    import torch

    vocab = tokenizer.get_vocab()
    table = np.full(128, tokenizer.unk_token_id, dtype=np.int64)
    for token, token_id in vocab.items():
        if len(token) == 1 and ord(token) < 128:
            table[ord(token)] = token_id
    texts = [e.prompt + e.solution for e in examples]
    prompt_lens = np.array([1 + len(e.prompt) for e in examples])  # <bos> + one token per character
    lengths = np.array([len(t) + 2 for t in texts])  # <bos> text <eos>
    width = int(lengths.max())
    ids = np.full((len(texts), width), tokenizer.pad_token_id, dtype=np.int64)
    ids[:, 0] = tokenizer.bos_token_id
    for row, text in enumerate(texts):
        codes = np.frombuffer(text.encode("ascii"), dtype=np.uint8)
        ids[row, 1 : 1 + len(codes)] = table[codes]
        ids[row, 1 + len(codes)] = tokenizer.eos_token_id
    for row in range(min(check_rows, len(texts))):
        expected = tokenizer(texts[row])["input_ids"] + [tokenizer.eos_token_id]
        if ids[row, : lengths[row]].tolist() != expected:
            raise ValueError(f"encode_sft_batch needs a one-token-per-character tokenizer; {texts[row]!r} differs")
    positions = np.arange(width)[None, :]
    mask = positions < lengths[:, None]
    labels = np.where(mask & (positions >= prompt_lens[:, None]), ids, -100)
    return torch.from_numpy(ids), torch.from_numpy(mask.astype(np.int64)), torch.from_numpy(labels)


def _lr_factor(step: int, recipe: EmbeddedRecipe) -> float:
    warmup = max(1, round(recipe.warmup_ratio * recipe.steps))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, recipe.steps - warmup)
    return recipe.min_lr_ratio + (1 - recipe.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def train_embedded_model(recipe: EmbeddedRecipe, *, progress: bool = True):
    """Build the tokenizer and model and run the supervised warm start.

    Returns (model in eval mode, tokenizer, build info dict with the loss curve and timings).
    Deterministic given the recipe (and the torch build / thread count).
    """
    import torch
    from tqdm.auto import tqdm

    from runners.data.embedded import EMBEDDED_ALPHABET, generate_embedded
    from runners.models.tiny import build_tiny_model
    from runners.models.tokenizer import build_char_tokenizer

    started, started_cpu = time.perf_counter(), time.process_time()
    tokenizer = build_char_tokenizer(EMBEDDED_ALPHABET)
    examples = generate_embedded(
        recipe.n_train,
        split="train",
        seed=recipe.seed,
        digits=recipe.digits,
        ops=recipe.ops,
        long_fraction=recipe.long_fraction,
        long_digits=recipe.long_digits,
    )
    input_ids, attention_mask, labels = encode_sft_batch(examples, tokenizer)
    lengths = attention_mask.sum(dim=1)
    data_s = time.perf_counter() - started

    model = build_tiny_model(
        recipe.arch,
        vocab_size=len(tokenizer),
        seed=recipe.seed,
        hidden_size=recipe.hidden_size,
        num_hidden_layers=recipe.num_hidden_layers,
        num_attention_heads=recipe.num_attention_heads,
        num_key_value_heads=recipe.num_key_value_heads,
        head_dim=recipe.hidden_size // recipe.num_attention_heads,
        intermediate_size=recipe.intermediate_size,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.98), weight_decay=recipe.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _lr_factor(step, recipe))
    order = torch.Generator(device="cpu").manual_seed(recipe.seed)  # batch indices, drawn on the CPU
    losses: list[float] = []
    bar = tqdm(range(recipe.steps), desc="building embedded model", disable=not progress, file=sys.stderr)
    for _step in bar:
        index = torch.randint(0, len(examples), (recipe.batch_size,), generator=order)
        width = int(lengths[index].max())
        out = model(input_ids=input_ids[index, :width], attention_mask=attention_mask[index, :width])
        loss = torch.nn.functional.cross_entropy(
            out.logits[:, :-1].flatten(0, 1).float(),
            labels[index, 1:width].flatten(),
            ignore_index=-100,
            label_smoothing=recipe.label_smoothing,
        )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    bar.close()
    model.eval()
    info = {
        "recipe_key": recipe.key(),
        "n_parameters": sum(p.numel() for p in model.parameters()),
        "data_s": round(data_s, 3),
        "train_s": round(time.perf_counter() - started - data_s, 3),
        # CPU seconds of all threads (wall time on a busy shared machine says little)
        "cpu_s": round(time.process_time() - started_cpu, 3),
        "torch_threads": torch.get_num_threads(),
        "final_loss": sum(losses[-20:]) / len(losses[-20:]),
        "loss_curve": [round(x, 5) for x in losses],
    }
    return model, tokenizer, info


def _is_built(folder: Path) -> bool:
    return (folder / "build.json").is_file() and (folder / "config.json").is_file()


def build_embedded_model(recipe: EmbeddedRecipe, *, cache_dir: str | Path | None = None, progress: bool = True) -> Path:
    """Train and save the recipe's model unless already cached; returns its folder.

    Safe under concurrency: a file lock next to the folder makes one process build while the others
    wait; the folder appears atomically (rename of a finished temporary directory).
    """
    from filelock import FileLock

    target = embedded_model_dir(recipe, cache_dir)
    if _is_built(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if _is_built(target):  # built by another process while we waited for the lock
            return target
        model, tokenizer, info = train_embedded_model(recipe, progress=progress)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            (tmp / "recipe.json").write_text(json.dumps(asdict(recipe), indent=2) + "\n")
            (tmp / "build.json").write_text(json.dumps(info, indent=2) + "\n")
            if target.exists():  # a partial folder left by an interrupted older build
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_embedded_model(
    *, dtype: str = "float32", cache_dir: str | Path | None = None, progress: bool = True, **overrides: Any
):
    """``(LlamaForCausalLM in eval mode, char tokenizer)`` of the embedded default, built if missing.

    ``overrides`` are :class:`EmbeddedRecipe` fields (``steps=50``, ``seed=1``, ...).
    """
    from runners.models.loader import load_pretrained_dir

    folder = build_embedded_model(make_recipe(**overrides), cache_dir=cache_dir, progress=progress)
    return load_pretrained_dir(folder, dtype=dtype)


def main(argv: list[str] | None = None) -> int:
    """Build (or load) the default embedded model and print its accuracy on the test split."""
    import argparse

    from runners.models.evaluate import evaluate_embedded

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=512, help="test problems to evaluate")
    parser.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="recipe overrides")
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {}
    defaults = asdict(EmbeddedRecipe())
    for item in args.set:
        name, _, value = item.partition("=")
        overrides[name] = type(defaults.get(name, ""))(value)
    recipe = make_recipe(**overrides)
    started = time.perf_counter()
    folder = build_embedded_model(recipe)
    model, tokenizer = load_embedded_model(**overrides)
    print(f"model folder: {folder} (ready in {time.perf_counter() - started:.1f} s)")
    build = json.loads((folder / "build.json").read_text())
    print(
        f"build: data {build['data_s']} s, train {build['train_s']} s ({build['cpu_s']} CPU s, "
        f"{build['torch_threads']} threads), final loss {build['final_loss']:.4f}"
    )
    for temperature in (0.0, 1.0):
        result = evaluate_embedded(
            model,
            tokenizer,
            n=args.n,
            temperature=temperature,
            digits=recipe.digits,
            ops=recipe.ops,
            long_fraction=recipe.long_fraction,
            long_digits=recipe.long_digits,
            max_new_tokens=96 if not recipe.long_fraction else 16 * recipe.long_digits,
        )
        print(
            f"temperature {temperature}: accuracy {result['accuracy']:.3f}, mean response length "
            f"{result['response_length']:.1f} tokens, finished {result['finished']:.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
