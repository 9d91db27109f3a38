"""verl's CPU mode without launching verl: placement, translation, exported models, the HF rollout, the platform.

What is checked against what:
- where a cell runs (``cpu_mode.runs_on_cpu``) and what cannot run there (``check_placement``): the
  rule of the module docstring, case by case; ``trustbench run`` itself exits with status 2 and
  names the key, before anything is written;
- the CPU-mode overrides: applied to verl 0.9.1's own config and validated as ``main_ppo`` does
  (the critic built from the exported model's files for every estimator that needs one), read back
  against what CPU mode promises (fp32 FSDP2 engines, the HF rollout, one process, logical GPUs
  unless a Ray address is given, the plugin modules in order);
- exported models: the prompt verl builds (its tokenizer loader, the translation's chat template, a
  row of the exported parquet) has the tokens the built-in backend feeds the model, for the
  character tokenizer under a ``qwen2`` config (which ``AutoTokenizer`` would replace), the embedded
  model and a real BPE vocabulary; the weights are the built-in backend's (same logits);
- the HF rollout server: its log-probs are the model's own log-softmax at the sampled tokens, it stops
  at EOS and within max_tokens, and a weight sync replaces every parameter (refusing partial ones);
- the CPU platform in a fresh process: verl's device helpers, engine registry, process group and
  critic loader answer for the CPU; with CUDA present it stays inactive.

Run: ``pytest tests/verl/test_cpu_mode.py`` (about a minute: two subprocesses import verl).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runners.config.validate import ConfigError

from ._verl_config import make_verl_config, verl_accepts

pytestmark = pytest.mark.verl
REPO = Path(__file__).resolve().parents[2]


def _cfg(*overrides: str):
    from runners.config import compose

    cfg, _ = compose(["backend=verl", *overrides])
    return cfg


# -- where a cell runs ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("device", "launcher", "cuda", "slurm_gpus", "cpu"),
    [
        ("auto", "local", False, None, True),
        ("auto", "local", True, None, False),
        ("auto", "slurm", False, None, False),  # a cluster cell runs on the cluster's GPU nodes
        ("auto", "local", False, 4, False),  # inside a Slurm allocation with GPUs
        ("auto", "local", False, 0, True),  # inside one without
        ("cpu", "local", True, None, True),
        ("cpu", "slurm", True, None, True),
        ("cuda", "local", False, None, False),
    ],
)
def test_runs_on_cpu(device, launcher, cuda, slurm_gpus, cpu):
    from runners.backends.verl.cpu.mode import runs_on_cpu

    cfg = _cfg(f"backend.device={device}", f"launcher={launcher}")
    env = (
        {}
        if slurm_gpus is None
        else {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n1", "SLURM_GPUS_ON_NODE": str(slurm_gpus)}
    )
    assert runs_on_cpu(cfg, cuda=cuda, env=env) is cpu


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (("model=qwen3_8b",), "model.params_b"),
        (("model=qwen2.5_0.5b_instruct",), "model.params_b"),
        (("backend.options.rollout_engine=vllm",), "backend.options.rollout_engine"),
        (("backend.options.rollout_engine=sglang",), "backend.options.rollout_engine"),
        (("backend.device=cuda",), "backend.device"),
    ],
)
def test_placement_refuses_what_this_machine_cannot_run(overrides, key):
    """On a machine without CUDA: a ConfigError naming the key; the same cells pass on a GPU machine."""
    from runners.backends.verl.cpu.mode import check_placement

    cfg = _cfg(*overrides)
    with pytest.raises(ConfigError) as err:
        check_placement(cfg, cuda=False, env={})
    assert err.value.key == key
    check_placement(cfg, cuda=True, env={})
    check_placement(_cfg(*overrides, "launcher=slurm"), cuda=False, env={})  # sent to the cluster: fine here


def test_small_cells_pass_placement_on_cpu():
    from runners.backends.verl.cpu.mode import check_placement

    for model in ("embedded", "tiny_qwen2", "smollm2_135m"):
        check_placement(_cfg(f"model={model}"), cuda=False, env={})


def test_trustbench_run_exits_2_naming_the_key(tmp_path, monkeypatch, capsys):
    """``trustbench run backend=verl model=qwen3_8b`` on a CUDA-less machine: status 2, the key named,
    no run directory or MLflow store written."""
    from runners.cli import main

    monkeypatch.setattr("runners.backends.verl.cpu.mode.cuda_available", lambda: False)
    monkeypatch.setenv("TRUSTBENCH_HOME", str(tmp_path))
    for var in [v for v in os.environ if v.startswith("SLURM_")]:
        monkeypatch.delenv(var)
    assert main(["run", "backend=verl", "model=qwen3_8b"]) == 2
    assert "model.params_b" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


# -- the translation --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def verl_config():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        yield make_verl_config()


def _cpu_overrides(cfg, *, ray_address=None):
    from runners.backends.verl.cpu.mode import CPUPlacement
    from runners.backends.verl.layout import VerlPaths
    from runners.backends.verl.process import cpu_placement, model_path
    from runners.backends.verl.translate import build_overrides

    path = model_path(cfg)
    placement = cpu_placement(cfg, path)
    if placement is None:  # this test machine has CUDA: build the CPU placement anyway
        from runners.backends.verl.cpu.mode import exported_tokenizer_path
        from runners.backends.verl.cpu.model_export import prompt_template

        placement = CPUPlacement(None, exported_tokenizer_path(path), prompt_template(cfg, path))
    placement = CPUPlacement(ray_address, placement.tokenizer_path, placement.chat_template)
    return path, placement, build_overrides(cfg, VerlPaths.under("/runs/cell/verl"), model_path=path, cpu=placement)


def ar_actor(vc):
    return vc.actor_rollout_ref.actor


@pytest.mark.parametrize(
    "cell",
    [
        ("algorithm=grpo",),
        ("algorithm=grpo", "objective=troll"),
        ("algorithm=grpo", "mask=trm_max", "model=tiny_qwen2"),
        ("algorithm=ppo",),
        ("algorithm=ppo", "estimator=egae"),
    ],
)
def test_cpu_overrides_are_accepted_by_verl(verl_config, cell):
    """verl validates the CPU-mode config (with the critic for GAE / EGAE, built from the exported
    model's files) and holds the CPU-mode settings; the critic gets the policy's model, optimiser and
    value clip whatever critic estimator the cell uses."""
    import io
    from contextlib import redirect_stdout

    from verl.trainer.ppo.utils import need_critic
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    from runners.algorithms.method import Method
    from runners.backends.verl import PLUGIN_MODULE
    from runners.backends.verl.cpu.mode import external_modules

    cfg = _cfg(*cell)
    path, placement, overrides = _cpu_overrides(cfg)
    vc = verl_config(overrides)
    if str(vc.algorithm.adv_estimator).startswith("trustbench_"):
        # verl's AlgoConfig dataclass refuses the plugin estimator's parameters, and verl's trainer never
        # builds it (test_translate's xfail): validate and build the actor as main_ppo does
        with redirect_stdout(io.StringIO()):
            validate_config(vc, use_reference_policy=False, use_critic=False)
        actor = omega_conf_to_dataclass(ar_actor(vc))
    else:
        _, actor = verl_accepts(vc)
    ar = vc.actor_rollout_ref
    assert (vc.trainer.device, vc.trainer.nnodes, vc.trainer.n_gpus_per_node) == ("cpu", 1, 1)
    assert ar.rollout.name == "trustbench_hf" and ar.rollout.dtype == "float32"
    assert actor.strategy == "fsdp2" and actor.fsdp_config.strategy == "fsdp2"
    assert dict(ar.actor.fsdp_config.mixed_precision)["param_dtype"] == "fp32"
    assert ar.model.override_config.attn_implementation == "sdpa" and not ar.model.use_remove_padding
    assert ar.model.path == path and ar.model.tokenizer_path == placement.tokenizer_path
    assert ar.model.custom_chat_template == placement.chat_template
    assert (vc.ray_kwargs.ray_init.num_gpus, vc.ray_kwargs.ray_init.num_cpus) == (1, 8)
    env = vc.ray_kwargs.ray_init.runtime_env.env_vars
    assert env.VERL_USE_EXTERNAL_MODULES == external_modules(PLUGIN_MODULE)
    assert env.VERL_USE_EXTERNAL_MODULES.split(",")[0] == "runners.backends.verl.cpu.platform"
    assert env.VERL_PLATFORM == "cpu"
    critic = Method.from_config(cfg).requires("critic")
    assert need_critic(vc) is critic
    if critic:
        with redirect_stdout(io.StringIO()):
            validate_config(vc, use_reference_policy=False, use_critic=True)
        built = omega_conf_to_dataclass(vc.critic)
        t = cfg.trainer
        assert built.model.path == path and built.strategy == "fsdp2"
        assert (built.optim.lr, built.cliprange_value) == (t.critic_lr, t.value_clip_low)
        assert vc.critic.model.override_config.attn_implementation == "sdpa"
    _, _, shared = _cpu_overrides(cfg, ray_address="127.0.0.1:6379")
    joined = verl_config(shared).ray_kwargs.ray_init
    assert "num_gpus" not in joined and joined.num_cpus is None  # joining a cluster: Ray refuses both


# -- exported models -------------------------------------------------------------------------------
def _example(dataset: str):
    from runners.data.embedded import generate_embedded
    from runners.data.types import Example

    if dataset == "embedded":
        return generate_embedded(1, split="train", seed=3)[0]
    return Example(prompt="What is 2+3?\nThink.", answer="5", data_source=dataset, reward_fn="math")


@pytest.mark.parametrize(
    ("model", "dataset"),
    [("tiny_qwen2", "embedded"), ("embedded", "embedded"), ("tiny_llama_v49k", "embedded"), ("tiny_qwen2", "gsm8k")],
)
def test_exported_prompts_are_the_builtin_backends(model, dataset):
    """Tokens of the prompt as verl builds it (its tokenizer loader on the exported tokenizer folder,
    the translation's template, the exported parquet row) = the built-in backend's prompt tokens."""
    from verl.utils import hf_tokenizer

    from runners.backends.verl.cpu.model_export import TOKENIZER_SUBDIR, export_model, prompt_template
    from runners.data.prompts import encode_prompt
    from runners.data.verl_format import to_verl_record
    from runners.models.loader import load_model

    cfg = _cfg(f"model={model}", f"dataset={dataset}")
    folder = export_model(cfg.model)
    tokenizer = hf_tokenizer(str(folder / TOKENIZER_SUBDIR))
    example = _example(dataset)
    messages = to_verl_record(example, 0)["prompt"]
    verl_ids = tokenizer.apply_chat_template(
        messages, chat_template=prompt_template(cfg, folder), tokenize=True, add_generation_prompt=True
    )
    verl_ids = list(verl_ids["input_ids"] if hasattr(verl_ids, "keys") else verl_ids)
    _, builtin_tokenizer = load_model(cfg.model.kind, arch=cfg.model.arch, **dict(cfg.model.options))
    assert verl_ids == encode_prompt(example, builtin_tokenizer, chat=bool(cfg.model.chat_template))
    if dataset == "embedded":
        assert "\n" in tokenizer.decode(verl_ids)  # the newline of "...=?\n" survived (Qwen2Tokenizer drops it)


def test_export_spec_holds_the_recipe_key_of_kinds_that_declare_one():
    """The embedded model's folder is keyed by its recipe's hash (the ``export_key`` hook of its model
    kind), so a changed recipe default is a new folder; kinds without the hook are keyed by config only."""
    from runners.backends.verl.cpu.model_export import export_spec
    from runners.models.embedded import make_recipe

    spec = export_spec({"kind": "embedded", "name": "embedded", "options": {"steps": 50}})
    assert spec["recipe"] == make_recipe(steps=50).key() != make_recipe().key()
    assert "recipe" not in export_spec({"kind": "tiny", "name": "tiny_qwen2", "arch": "qwen2", "options": {}})


def test_exported_weights_are_the_builtin_backends():
    import torch

    from runners.backends.verl.cpu.model_export import export_model
    from runners.models.loader import load_model, load_pretrained_dir

    cfg = _cfg("model=tiny_qwen3")
    exported, _ = load_pretrained_dir(export_model(cfg.model))
    builtin, _ = load_model("tiny", arch="qwen3")
    ids = torch.tensor([[1, 5, 9, 12, 4]])
    assert torch.equal(exported(ids).logits, builtin(ids).logits)


# -- the HF rollout server --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server():
    from runners.backends.verl.cpu.hf_server import HFGenerationServer
    from runners.backends.verl.cpu.model_export import export_model

    folder = export_model(_cfg("model=tiny_llama").model)
    config = {"prompt_length": 16, "response_length": 12, "dtype": "float32", "seed": 0}
    return HFGenerationServer(config, {"path": str(folder)})


def _generate_many(server, prompts, params):
    async def run():
        return await asyncio.gather(
            *[server.generate(prompt, dict(params), request_id=str(i)) for i, prompt in enumerate(prompts)]
        )

    return asyncio.run(run())


def test_hf_server_log_probs_are_the_models(server):
    """Concurrent requests are sampled as one batch; each response's log-probs are log-softmax of the
    model's logits (temperature 0.7) at the sampled tokens; generation stops at EOS or max_tokens."""
    import torch

    prompts = [[1, 9, 10, 6, 11], [1, 12, 4], [1, 7, 7, 7, 7, 7, 8]]
    before = server.stats["batches"]
    outs = _generate_many(server, prompts, {"temperature": 0.7, "top_p": 1.0, "logprobs": True, "max_tokens": 9})
    assert server.stats["batches"] == before + 1
    for prompt, out in zip(prompts, outs):
        assert 1 <= len(out.token_ids) <= 9 and len(out.log_probs) == len(out.token_ids)
        assert all(t not in server.eos_ids for t in out.token_ids[:-1])
        assert out.token_ids[-1] in server.eos_ids or len(out.token_ids) == 9
        ids = torch.tensor([prompt + out.token_ids])
        with torch.no_grad():
            logits = server.model(ids).logits[0, len(prompt) - 1 : -1] / 0.7
        expected = torch.log_softmax(logits.double(), -1).gather(-1, torch.tensor(out.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(out.log_probs, dtype=torch.float64), expected, atol=1e-4)


def test_hf_server_refuses_unsupported_sampling(server):
    for params in ({"top_k": 5}, {"repetition_penalty": 1.1}, {"n": 2}):
        with pytest.raises(ValueError, match=next(iter(params))):
            _generate_many(server, [[1, 5]], params)


def test_hf_server_weight_sync_replaces_every_parameter(server):
    import torch

    state = {name: value + 0.01 for name, value in server.state_dict().items()}
    info = server.update_weights(dict(state))
    assert info["changed"] == len(state)
    assert all(torch.equal(server.state_dict()[name], value) for name, value in state.items())
    partial = dict(list(state.items())[1:])
    with pytest.raises(KeyError, match="did not send"):
        server.update_weights(partial)
    with pytest.raises(KeyError, match="not in the model"):
        server.update_weights({**state, "extra.weight": torch.zeros(1)})


# -- the CPU platform, in fresh processes -----------------------------------------------------------
PLATFORM_PROBE = r"""
import json, os, torch
os.environ["VERL_USE_EXTERNAL_MODULES"] = "runners.backends.verl.cpu.platform"
if os.environ.get("PRETEND_CUDA"):
    torch.cuda.is_available = lambda: True
import verl
from verl.utils.device import get_device_id, get_device_name, get_nccl_backend, get_torch_device
from runners.backends.verl.cpu import platform as cpu_platform
out = {"active": cpu_platform.ACTIVE}
if cpu_platform.ACTIVE:
    import torch.distributed as dist
    import verl.utils.distributed as distributed
    import verl.utils.model as model_utils
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PROBE_PORT"], RANK="0", WORLD_SIZE="1")
    distributed.initialize_global_process_group_ray(timeout_second=None)
    t = torch.ones(3)
    dist.all_reduce(t)
    critic = model_utils.load_valuehead_model(os.environ["PROBE_MODEL"], torch.float32, None, False)
    out.update(
        device=get_device_name(), device_id=str(get_device_id()), backend=get_nccl_backend(),
        device_name=get_torch_device().get_device_name(), rss=get_torch_device().memory_allocated() > 0,
        lm=EngineRegistry.get_engine_cls("language_model", "fsdp2") is FSDPEngineWithLMHead,
        value=EngineRegistry.get_engine_cls("value_model", "fsdp2") is FSDPEngineWithValueHead,
        pg_backend=str(dist.get_backend()), reduced=t.tolist(),
        critic=type(critic).__name__, attn=critic.config._attn_implementation,
    )
print("PROBE " + json.dumps(out))
"""


def _probe(**env):
    from runners.backends.verl.cpu.model_export import export_model
    from tests.slurm.cluster import free_ports

    full = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PROBE_PORT": str(free_ports(1)[0]),
        "PROBE_MODEL": str(export_model(_cfg("model=tiny_llama").model)),
        "CUDA_VISIBLE_DEVICES": "",
        **env,
    }
    full.pop("VERL_PLATFORM", None)
    proc = subprocess.run(
        [sys.executable, "-c", PLATFORM_PROBE], env=full, capture_output=True, text=True, timeout=300, cwd=REPO
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("PROBE ")), None)
    assert line is not None, proc.stderr[-3000:]
    import json

    return json.loads(line[6:])


def test_cpu_platform_answers_verls_device_questions():
    out = _probe()
    assert out["active"] is True
    assert (out["device"], out["device_id"], out["backend"], out["device_name"]) == ("cpu", "cpu", "gloo", "CPU")
    assert out["rss"] and out["lm"] and out["value"]
    assert out["pg_backend"] == "cpu:gloo" and out["reduced"] == [1.0, 1.0, 1.0]  # a gloo group torch accepts
    assert out["critic"] == "LlamaForTokenClassification" and out["attn"] == "sdpa"


def test_cpu_platform_stays_inactive_where_cuda_exists():
    assert _probe(PRETEND_CUDA="1") == {"active": False}
