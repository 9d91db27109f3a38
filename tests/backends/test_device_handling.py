"""Device handling checkable without a GPU: generators follow the device of what they sample from.

A CPU ``torch.Generator`` passed to ``torch.multinomial`` on CUDA probabilities raises at the first
rollout on a GPU; on a CPU machine the mismatch cannot occur, so two guards run here instead:

- every ``torch.Generator(...)`` in the source names its device (``make_generator(device, seed)`` for
  sampling, an explicit ``device="cpu"`` for draws made on the CPU such as ``randperm``);
- the sampler checks a generator's device against the probabilities' before drawing, with a message
  that says how to make the right one (exercised here with a generator that claims to be on CUDA).

The gpu-marked tests in ``test_cuda.py`` run the real thing where a GPU exists.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from runners.models.sampler import check_generator_device, make_generator, sample_next

ROOT = Path(__file__).resolve().parents[2]


def _generator_calls_without_device(root: Path) -> list[str]:
    found = []
    for path in sorted((root / "runners").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("torch.Generator", "Generator"):
                if not any(k.arg == "device" for k in node.keywords) and not node.args:
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_every_generator_in_the_source_names_its_device():
    assert _generator_calls_without_device(ROOT) == []


def test_the_source_check_finds_a_generator_without_device(tmp_path):
    (tmp_path / "runners").mkdir()
    (tmp_path / "runners" / "bad.py").write_text("import torch\ng = torch.Generator().manual_seed(0)\n")
    assert _generator_calls_without_device(tmp_path) == ["runners/bad.py:2"]


def test_sampler_refuses_a_generator_on_another_device():
    logits = torch.randn(3, 11)
    on_cuda = SimpleNamespace(device=torch.device("cuda", 0))  # what a CUDA generator reports
    with pytest.raises(ValueError, match=r"make_generator\('cpu', seed\)"):
        sample_next(logits, temperature=1.0, top_p=1.0, generator=on_cuda)
    check_generator_device(make_generator("cpu", 0), logits)  # the right one passes
    token, logp = sample_next(logits, temperature=1.0, top_p=1.0, generator=make_generator("cpu", 0))
    assert token.shape == (3,) and torch.all(logp <= 0)


def test_trainer_generators_follow_its_device(tmp_path):
    """The trainer's sampling generator is made on ``self.device`` (cpu here), the shuffle one on the CPU."""
    from runners.backends.local.trainer import LocalTrainer
    from runners.config import compose

    cfg, _ = compose(["model=tiny_llama", "trainer.total_steps=1", "trainer.eval_every=0", "backend.device=cpu"])
    trainer = LocalTrainer(cfg, tracker=None, run_dir=tmp_path)
    assert trainer.sample_generator.device == trainer.device
    assert trainer.shuffle_generator.device == torch.device("cpu")
