"""Device handling checkable without a GPU: generators follow the device of what they sample from.

A CPU ``torch.Generator`` passed to ``torch.multinomial`` on CUDA probabilities raises at the first
rollout on a GPU; on a CPU machine the mismatch cannot occur, so two guards run here instead:

- every ``torch.Generator(...)`` in the source names its device (``make_generator(device, seed)`` for
  sampling, an explicit ``device="cpu"`` for draws made on the CPU such as ``randperm``);
- the sampler checks a generator's device against the probabilities' before drawing, with a message
  that says how to make the right one (exercised here with a generator that claims to be on CUDA).

Two more guards follow the trainer's device without one: the trainer built for a device that is
not the CPU (``meta``: shapes only, no data) puts every module and the sampling generator there; and
the rollout manager is fed a sampler whose outputs stand for tensors on an accelerator
(``OnAccelerator``: CPU data, but any operation mixing them with a plain CPU tensor that is not a
scalar raises, as CUDA does).

The gpu-marked tests in ``test_cuda.py`` run the real thing where a GPU exists.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.utils._pytree import tree_flatten

from runners.backends.local.rollout import RolloutManager
from runners.data.types import Example
from runners.models.sampler import GenerationOutput, check_generator_device, make_generator, sample_next

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


def test_trainer_modules_and_generators_follow_its_device(tmp_path, monkeypatch):
    """Built for a device that is not the CPU (``meta``), the trainer puts the policy, the reference
    model, the critic and the sampling generator there; only the shuffle generator stays on the CPU."""
    from runners.backends.local import trainer as trainer_module
    from runners.config import compose

    made = []

    def recording_generator(device, seed):  # torch makes no generator on meta; record what was asked
        made.append(torch.device(device))
        return SimpleNamespace(device=torch.device(device))

    monkeypatch.setattr(trainer_module, "resolve_device", lambda setting: torch.device("meta"))
    monkeypatch.setattr(trainer_module, "make_generator", recording_generator)
    overrides = ["model=tiny_llama", "algorithm=ppo", "trainer.kl_coef=0.1", "trainer.eval_every=0"]
    cfg, _ = compose([*overrides, "trainer.total_steps=1"])
    trainer = trainer_module.LocalTrainer(cfg, tracker=None, run_dir=tmp_path)
    assert trainer.device == torch.device("meta")
    assert made == [torch.device("meta")]
    assert trainer.sample_generator.device == trainer.device
    assert trainer.shuffle_generator.device == torch.device("cpu")
    for name in ("model", "ref_model", "critic"):
        module = getattr(trainer, name)
        assert module is not None, name
        assert {p.device for p in module.parameters()} == {trainer.device}, name


class OnAccelerator(torch.Tensor):
    """A CPU tensor standing for one on an accelerator: an operation that mixes it with a plain tensor
    of one or more dimensions raises, as CUDA does; scalars and index tensors may stay on the CPU
    (CUDA allows both); ``.cpu()`` / ``.to("cpu")`` give a plain tensor."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        to_cpu = func is torch.Tensor.to and any(str(a) == "cpu" for a in (*args[1:], kwargs.get("device")))
        if func is torch.Tensor.cpu or to_cpu:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs).as_subclass(torch.Tensor)
        indexing = func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__)
        operands = [x for x in tree_flatten(((args[:1] + args[2:]) if indexing else args, kwargs))[0]]
        tensors = [x for x in operands if isinstance(x, torch.Tensor)]
        if any(isinstance(x, cls) for x in tensors) and any(not isinstance(x, cls) and x.dim() for x in tensors):
            raise RuntimeError(f"{getattr(func, '__name__', func)}: expected all tensors on the same device")
        return super().__torch_function__(func, types, args, kwargs)


def test_on_accelerator_raises_where_cuda_would():
    x = torch.ones(2, 3).as_subclass(OnAccelerator)
    with pytest.raises(RuntimeError, match="same device"):
        torch.cat([x, torch.zeros(2, 1)], dim=1)
    with pytest.raises(RuntimeError, match="same device"):
        x * torch.ones(2, 3)
    assert type(x * torch.tensor(2.0)) is OnAccelerator  # a CPU scalar is fine
    assert type(x.cpu()) is torch.Tensor and type(x.to("cpu")) is torch.Tensor


def _rollout_manager(mode: str) -> RolloutManager:
    examples = [Example(prompt=f"q{i}", answer="1", data_source="t", reward_fn="exact") for i in range(4)]
    return RolloutManager(
        examples=examples,
        encode_prompt=lambda e: [5, 6, 7][: 1 + int(e.prompt[1:]) % 3],
        decode=lambda ids: " ".join(map(str, ids)),
        reward=lambda example, text: float(len(text)),
        prompts_per_step=2,
        n=2,
        max_response_length=5,
        mode=mode,
        window=3,
        pad_token_id=0,
        eos_token_id=1,
    )


def _accelerator_sampler(calls: list):
    """A sampler whose outputs live 'on the accelerator' (responses of 4 tokens, the first row ends with EOS)."""

    def generate(input_ids, attention_mask, max_new_tokens):
        calls.append(max_new_tokens)
        B, R = input_ids.shape[0], max_new_tokens
        responses = torch.full((B, R), 9, dtype=torch.long)
        mask = torch.ones(B, R, dtype=torch.long)
        responses[0, R - 1], mask[0, R - 1 :] = 1, 1
        finished = torch.zeros(B, dtype=torch.bool)
        finished[0] = True
        logp = -torch.rand(B, R)
        out = (responses, mask, logp * mask, finished)
        return GenerationOutput(*(t.as_subclass(OnAccelerator) for t in out))

    return generate


@pytest.mark.parametrize("mode", ["full", "truncated"])
def test_rollout_step_takes_a_sampler_on_another_device(mode):
    """The sampler's outputs sit on the model's device; the step builds its batch on the CPU (the
    ``RolloutBatch`` contract) instead of mixing them with CPU tensors, which raises on CUDA."""
    calls, cut = [], 0
    manager = _rollout_manager(mode)
    for _ in range(3):
        batch = manager.step(_accelerator_sampler(calls))
        tensors = {k: v for k, v in vars(batch).items() if isinstance(v, torch.Tensor)}
        assert {k: type(v) for k, v in tensors.items()} == {k: torch.Tensor for k in tensors}
        assert bool(batch.finished[0]) and int(batch.full_lengths.max()) <= 5
        assert batch.input_ids.shape[1] == batch.context_length + batch.responses.shape[1]
        # rows continued from an earlier window stop at the response budget (2 of the 3 new tokens)
        cut += int(((batch.response_mask.sum(-1) == 2) & batch.finished).sum())
    assert calls == ([5, 5, 5] if mode == "full" else [3, 3, 3])
    assert cut == (0 if mode == "full" else 4)
