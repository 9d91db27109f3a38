"""MFU and Roofline inputs of the built-in trainer.

References: torch's own ``FlopCounterMode`` on tiny models (eager attention, so that attention runs
as counted matmuls) for every FLOP formula (forward with the LM head on the response positions,
forward + backward, one KV-cache decode step, a whole generation through the sampler); T-PPO's decode
arithmetic intensity (``analysis.roofline``, checked there against hand counts) for the bytes model;
the accelerator table as pandas reads it for the GPU lookup; a real step of the trainer for the
logged metrics.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from runners import metric_names as names
from runners.backends.local.perf import batch_work
from runners.backends.local.policy import segment_logits
from runners.models.tiny import build_tiny_model
from runners.perf import hardware
from runners.perf.flops import TransformerShape
from runners.perf.roofline import phase_flops, roofline_metrics


def _model(arch="llama", **overrides):
    model = build_tiny_model(arch, vocab_size=37, seed=0, **overrides)
    model.config._attn_implementation = "eager"
    return model


def _counted(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def _rope(shape: TransformerShape, positions: int) -> int:
    """FLOPs torch also counts: the rotary table, an outer product of positions and frequencies (a bmm)
    per forward, outside the model FLOPs."""
    return 2 * positions * shape.head_dim // 2


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_forward_and_backward_flops_equal_torchs_count(arch):
    model = _model(arch)
    shape = TransformerShape.from_model(model)
    batch, length, context = 3, 20, 7
    ids = torch.randint(3, 37, (batch, length))
    mask = torch.ones_like(ids)
    expected = shape.forward_flops([length] * batch, [length - context] * batch)
    with torch.no_grad():
        assert _counted(lambda: segment_logits(model, ids, mask, context)) == expected + _rope(shape, batch * length)
    counted = _counted(lambda: segment_logits(model, ids, mask, context).sum().backward())
    assert counted == 3 * expected + _rope(shape, batch * length)
    assert shape.train_flops([length] * batch, [length - context] * batch) == 3 * expected


def test_decode_step_flops_equal_torchs_count():
    from transformers import DynamicCache

    model = _model()
    shape = TransformerShape.from_model(model)
    batch, prompt = 2, 9
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=torch.randint(3, 37, (batch, prompt)), past_key_values=cache, use_cache=True)
        step = torch.randint(3, 37, (batch, 1))
        positions = torch.full((batch, 1), prompt)
        flops = _counted(lambda: model(input_ids=step, position_ids=positions, past_key_values=cache, use_cache=True))
    assert flops == batch * shape.decode_step_flops(prompt + 1) + _rope(shape, batch)


@pytest.mark.parametrize(("prompt", "response"), [(5, 1), (6, 12)])
def test_generation_flops_equal_torchs_count_through_the_sampler(prompt, response):
    from runners.models.sampler import generate

    model = _model()
    shape = TransformerShape.from_model(model)
    ids = torch.randint(3, 37, (1, prompt))

    def run():
        out = generate(
            model, ids, torch.ones_like(ids), max_new_tokens=response, eos_token_id=None, pad_token_id=0, fast=False
        )
        assert out.responses.shape[1] == response

    rope = _rope(shape, prompt) + (response - 1) * _rope(shape, 1)
    assert _counted(run) == shape.generation_flops([prompt], [response]) + rope


def test_decode_intensity_is_t_ppos_formula():
    from analysis.roofline import decode_arithmetic_intensity

    shape = TransformerShape.from_model(_model())
    shape = TransformerShape(**{**vars(shape), "bytes_per_param": 2})  # T-PPO's formula is for bf16
    P = shape.body_params + shape.head_params
    for batch, context in [(1, 0), (64, 100), (512, 4096)]:
        ai = batch * shape.decode_step_flops(context) / shape.decode_step_bytes(batch, context)
        expected = decode_arithmetic_intensity(
            batch, context, P, shape.layers, shape.q_heads, shape.kv_heads, shape.head_dim
        )
        assert ai == pytest.approx(float(expected), rel=1e-12)


def test_training_bytes_count_weights_activations_gradients_and_adam():
    shape = TransformerShape.from_model(_model())
    one, two = shape.forward_bytes([10], [4]), shape.forward_bytes([10, 10], [4, 4])
    weights = shape.bytes_per_param * (shape.body_params + shape.head_params)
    assert two - one == pytest.approx(one - weights)  # a second sequence adds only its activations
    assert shape.train_bytes([10], [4]) == 3 * one + shape.bytes_per_param * shape.params
    assert shape.optimizer_bytes(2) == 2 * 7 * shape.bytes_per_param * shape.params


# -- ceilings ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("device", "row"),
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H800", "H800"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA GeForce RTX 4090", None),
        ("NVIDIA H1000", None),
    ],
)
def test_gpu_ceiling_comes_from_the_hardware_table(device, row):
    from analysis.roofline import hardware_table

    ceiling = hardware.gpu_ceiling(device)
    if row is None:
        assert ceiling is None
        return
    table = hardware_table().set_index("name")
    assert ceiling.tflops == table.at[row, "bf16_dense_tflops"]
    assert ceiling.mem_bw_tbs == table.at[row, "mem_bw_tbs"]
    assert row in ceiling.source


def test_cpu_ceiling_is_measured_once_per_cpu_and_thread_count(tmp_path, monkeypatch):
    monkeypatch.setenv("TRUSTBENCH_CACHE", str(tmp_path))
    measured = []

    def measure(threads):
        measured.append(threads)
        return hardware.Ceiling(0.05 * threads, 0.02, f"fake {threads}")

    first = hardware.cpu_ceiling(1, measure=measure)
    again = hardware.cpu_ceiling(1, measure=measure)
    other = hardware.cpu_ceiling(2, measure=measure)
    assert measured == [1, 2]
    assert first == again == hardware.Ceiling(0.05, 0.02, "fake 1") and other.tflops == 0.1
    path = hardware.cpu_cache_file(1)
    assert path.parent == tmp_path / "hardware" and path.name.endswith("-1t.json")
    assert json.loads(path.read_text())["tflops"] == 0.05


def test_an_unwritable_cache_measures_again(tmp_path, monkeypatch):
    blocker = tmp_path / "not_a_directory"
    blocker.write_text("")
    monkeypatch.setenv("TRUSTBENCH_CACHE", str(blocker))
    measured = []

    def measure(threads):
        measured.append(threads)
        return hardware.Ceiling(0.05, 0.02, "fake")

    assert hardware.cpu_ceiling(1, measure=measure) == hardware.cpu_ceiling(1, measure=measure)
    assert measured == [1, 1]


def test_cpu_measurement_gives_rates():
    ceiling = hardware.measure_cpu(1)
    assert 0 < ceiling.tflops < math.inf and 0 < ceiling.mem_bw_tbs < math.inf
    assert "1 thread" in ceiling.source


# -- per-step metrics -------------------------------------------------------------------------------
def _batch(prompts, responses, context, shared=()):
    """Rows with their own random contexts, except rows (i, j) in ``shared``: row j repeats row i's context."""
    width = max(responses)
    ids = torch.randint(3, 37, (len(prompts), context + width), generator=torch.Generator().manual_seed(0))
    attention = torch.zeros(len(prompts), context + width, dtype=torch.long)
    response_mask = torch.zeros(len(prompts), width)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        attention[i, context - p : context + r] = 1
        response_mask[i, :r] = 1
    for i, j in shared:
        ids[j, :context], attention[j, :context] = ids[i, :context], attention[i, :context]
    return SimpleNamespace(
        input_ids=ids,
        attention_mask=attention,
        context_length=context,
        response_mask=response_mask,
        group_index=torch.tensor([0, 0, 1, 1]),
    )


@pytest.mark.parametrize("old_pass", [True, False])
def test_roofline_metrics_of_a_step(old_pass):
    shape = TransformerShape.from_model(_model())
    prompts, responses = [3, 5, 4, 5], [2, 7, 1, 4]
    batch = _batch(prompts, responses, context=5)
    work = batch_work(shape, batch, old_pass=old_pass, epochs=2, mini_batch_share=0.5)
    lengths = [p + r for p, r in zip(prompts, responses)]
    assert work["rollout"][0] == shape.generation_flops(prompts, responses)
    assert ("old_log_prob" in work) == old_pass
    flops, moved = work["update_actor"]
    assert flops == 2 * 3 * shape.forward_flops(lengths, responses)
    assert moved == 2 * shape.train_bytes(lengths, responses) + shape.optimizer_bytes(4)  # 2 epochs x 2 mini-batches
    timing = {names.TIMING_GEN: 0.5, names.TIMING_OLD_LOG_PROB: 0.0, names.TIMING_UPDATE_ACTOR: 0.25}
    ceiling = hardware.Ceiling(0.01, 0.02, "fake")
    out = roofline_metrics(work, timing, ceiling)
    assert out[names.achieved_tflops("update_actor")] == pytest.approx(flops / 0.25 / 1e12)
    assert out[names.arithmetic_intensity("update_actor")] == pytest.approx(flops / moved)
    assert out[names.MFU_ACTOR] == pytest.approx(flops / 0.25 / 1e12 / 0.01)
    assert out[names.ROLLOUT_TFLOPS] == pytest.approx(work["rollout"][0] / 0.5 / 1e12)
    assert names.achieved_tflops("old_log_prob") not in out  # no time spent: no point
    assert out[names.PEAK_TFLOPS] == 0.01 and out[names.PEAK_MEM_BW_TBS] == 0.02
    assert names.MFU_ACTOR not in roofline_metrics(work, timing, None)
    # the step's model FLOPs back from what a run logs (the points and the phase times): every phase that
    # took time (bench_vs_trl's ceiling); the old pass had none here
    assert phase_flops({**out, **timing}) == pytest.approx(work["rollout"][0] + flops)
    assert phase_flops(timing) == 0.0


@pytest.mark.parametrize("packed", [True, False])
def test_rows_sharing_a_context_count_its_work_once(packed):
    """Rows 1 and 3 repeat the contexts of rows 0 and 2: their prompts are prefilled once, and with the
    packed forward their contexts run once through the matmuls (attention still spans every sequence)."""
    shape = TransformerShape.from_model(_model())
    prompts, responses = [3, 3, 5, 5], [2, 7, 1, 4]
    batch = _batch(prompts, responses, context=5, shared=[(0, 1), (2, 3)])
    work = batch_work(shape, batch, old_pass=True, epochs=1, mini_batch_share=1.0, packed=packed)
    lengths = [p + r for p, r in zip(prompts, responses)]
    assert work["rollout"][0] == shape.generation_flops(prompts, responses) - shape.forward_flops([3, 5], [1, 1])
    computed = [5, 7, 6, 4] if packed else lengths
    body = 2 * shape.body_params * (sum(lengths) - sum(computed))  # the contexts not run again
    assert work["old_log_prob"][0] == shape.forward_flops(lengths, responses) - body
    assert work["update_actor"][0] == 3 * (shape.forward_flops(lengths, responses) - body)


def test_the_packed_forwards_matmuls_run_a_shared_context_once():
    """torch's count of the matmul FLOPs (the layers' and the head's; attention runs in SDPA) of the packed
    forward over two pairs of rows sharing a context: ``forward_flops`` with each pair's context once."""
    model = build_tiny_model("llama", vocab_size=37, seed=0)
    shape = TransformerShape.from_model(model)
    context, width = 5, 6
    ids = torch.randint(3, 37, (4, context + width))
    ids[1, :context], ids[3, :context] = ids[0, :context], ids[2, :context]
    mask = torch.ones_like(ids)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        segment_logits(model, ids, mask, context)
    counts = counter.get_flop_counts()["Global"]
    matmuls = sum(v for op, v in counts.items() if str(op).split(".")[1] in ("mm", "addmm"))
    lengths, heads = [context + width] * 4, [width] * 4
    attention = sum(shape.attention_flops(n, n) for n in lengths)
    assert matmuls == shape.forward_flops(lengths, heads, [11, 6, 11, 6]) - attention


def test_generation_prefills_a_repeated_prompt_once():
    from runners.models.sampler import generate

    model = _model()
    shape = TransformerShape.from_model(model)
    prompt, response = 6, 5
    ids = torch.randint(3, 37, (1, prompt)).repeat(3, 1)

    def run():
        out = generate(
            model, ids, torch.ones_like(ids), max_new_tokens=response, eos_token_id=None, pad_token_id=0, fast=False
        )
        assert out.responses.shape == (3, response)

    rope = _rope(shape, prompt) + (response - 1) * _rope(shape, 3)
    expected = shape.generation_flops([prompt] * 3, [response] * 3, [True, False, False])
    assert _counted(run) == expected + rope
    assert expected < shape.generation_flops([prompt] * 3, [response] * 3)


def test_a_trainer_step_logs_mfu_and_roofline_points(tb_home, monkeypatch):
    from runners.backends.local.trainer import LocalTrainer
    from runners.config import compose

    from ._tiny import TINY

    monkeypatch.setenv("TRUSTBENCH_CACHE", str(tb_home / "cache"))
    monkeypatch.setattr(hardware, "measure_cpu", lambda threads: hardware.Ceiling(1e-3, 1e-2, "fake"))
    cfg, _ = compose([*TINY, "trainer.mini_batch_prompts=2", "backend.num_threads=1"])
    tracker = SimpleNamespace(log_metrics=lambda *a, **k: None, flush=lambda wait=True: None)
    metrics = LocalTrainer(cfg, tracker, tb_home / "run").step(0)
    for phase in ("rollout", "update_actor"):
        assert metrics[names.achieved_tflops(phase)] > 0 and metrics[names.arithmetic_intensity(phase)] > 0
    tflops = metrics[names.achieved_tflops("update_actor")]
    assert metrics[names.MFU_ACTOR] == pytest.approx(tflops / 1e-3)
    assert names.achieved_tflops("old_log_prob") not in metrics  # the update took pi_old from its own forward
