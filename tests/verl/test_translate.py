"""Config translation against verl 0.9.1's own config: every preset, method and model size.

What is checked against what:
- verl's config: the overrides are applied to verl's ``ppo_trainer.yaml`` (composed once with Hydra's
  compose API; the overrides then go through Hydra's own override parser and applier, exactly what
  compose does after the defaults list -- ``test_fast_path_is_hydra_compose`` checks the two agree),
  then ``verl.utils.config.validate_config`` and ``omega_conf_to_dataclass`` of the algorithm and
  actor nodes run as ``main_ppo`` runs them, and the loss / estimator names resolve in verl's registries;
- the trustbench config: the values verl ends up with are read back and compared with the cell's
  (batch sizes, sampling, optimiser, clip ranges or plugin parameters, GPUs);
- the algorithm library: verl's built-in policy losses, with the parameters the translation chose,
  give the trustbench objective's loss and gradient (``test_builtin_loss_equals_trustbench_objective``);
  the warm-up schedule equals the built-in trainer's.

Model presets from the hub are only named, never downloaded (``HF_HUB_OFFLINE=1``).
Run: ``pytest tests/verl/test_translate.py`` (about 45 s of CPU on 2 cores; 10 s of it importing verl).
"""

from __future__ import annotations

import contextlib
import io
import math
import warnings
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from runners.config.resources import cell_resources, verl_gpus
from runners.config.validate import ConfigError

from ._verl_config import SMOLLM2_DIR, _compose, _hydra_compose_verl, _paths, _translate, make_verl_config, verl_accepts

pytestmark = pytest.mark.verl

CONF = Path(__file__).resolve().parents[2] / "conf"
PRESETS = sorted(p.stem for p in (CONF / "algorithm").glob("*.yaml"))
METHODS = sorted(p.stem for p in (CONF / "method").glob("*.yaml"))
MODELS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
NON_HF_MODELS = {m for m in MODELS if OmegaConf.load(CONF / "model" / f"{m}.yaml").kind in ("embedded", "tiny")}
HF_MODELS = [m for m in MODELS if m not in NON_HF_MODELS]
# settings verl 0.9.1 cannot express -> (the key the error names, the one change that makes the cell expressible)
INEXPRESSIBLE = {
    "tppo": ("rollout.mode", None),
}
# trustbench estimator -> verl's estimator (the library's estimators against verl's core_algos)
VERL_ESTIMATOR = {
    "grpo": "grpo",
    "drgrpo": "grpo",
    "rloo": "rloo",
    "loop": "rloo",
    "rfpp": "reinforce_plus_plus",
    "rfpp_baseline": "reinforce_plus_plus_baseline",
    "gpg": "gpg",
    "gae": "gae",
}
BUILTIN_LOSS = {"clip": "vanilla", "token_is": "vanilla", "gspo": "gspo", "gpg": "gpg"}


@pytest.fixture(scope="module")
def verl_config():
    """``make(overrides) -> verl DictConfig``: verl's ppo_trainer.yaml with the overrides applied."""
    make = make_verl_config()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        yield make


def assert_same_cell(cfg, vc, algo, actor):
    """The verl config trains what the trustbench cell describes."""
    from runners.backends.verl import TRAINER_MODE, loss_mode_for
    from runners.backends.verl.translate.method import NEVER_CLIP

    t, r, rollout = cfg.trainer, cfg.rollout, vc.actor_rollout_ref.rollout
    res = cell_resources(cfg)
    assert vc.trainer.nnodes * vc.trainer.n_gpus_per_node == res["nodes"] * res["gpus_per_node"]
    assert vc.trainer.n_gpus_per_node % rollout.tensor_model_parallel_size == 0
    assert (vc.data.train_batch_size, actor.ppo_mini_batch_size, actor.ppo_epochs) == (
        t.prompts_per_step,
        t.mini_batch_prompts,
        t.ppo_epochs,
    )
    assert (rollout.n, rollout.temperature, rollout.top_p) == (t.n, r.temperature, r.top_p)
    assert (rollout.val_kwargs.n, rollout.val_kwargs.temperature) == (t.eval_n, t.eval_temperature)
    assert (vc.data.max_prompt_length, vc.data.max_response_length) == (r.max_prompt_length, r.max_response_length)
    assert (actor.optim.lr, actor.optim.weight_decay, tuple(actor.optim.betas)) == (
        t.lr,
        t.weight_decay,
        (t.adam_beta1, t.adam_beta2),
    )
    assert actor.optim.clip_grad == (t.grad_clip or 1e12)
    assert (vc.trainer.total_training_steps, vc.trainer.save_freq) == (
        t.total_steps,
        t.checkpoint_every or t.total_steps,
    )
    assert vc.trainer.test_freq == (t.eval_every or -1)
    assert vc.trainer.v1.trainer_mode == TRAINER_MODE
    assert actor.loss_agg_mode == cfg.loss_agg.name
    if cfg.loss_agg.name == "seq-mean-token-sum-norm":
        assert actor.loss_scale_factor == (cfg.loss_agg.norm_len or r.max_response_length)
    assert algo.adv_estimator == VERL_ESTIMATOR[cfg.estimator.name]
    if algo.adv_estimator == "grpo":
        assert algo.norm_adv_by_std_in_grpo == (cfg.estimator.name == "grpo")
    obj = cfg.objective
    uses_plugin = (
        obj.name not in BUILTIN_LOSS
        or cfg.mask.name != "none"
        or (
            cfg.entropy_control.name != "none"
            and not (cfg.entropy_control.name == "bonus" and not cfg.entropy_control.adaptive)
        )
    )
    if not uses_plugin:
        assert actor.policy_loss.loss_mode == BUILTIN_LOSS[obj.name]
        if obj.name in ("clip", "gspo"):
            assert (actor.clip_ratio_low, actor.clip_ratio_high) == (obj.clip_ratio_low, obj.clip_ratio_high)
        if obj.name == "clip":
            assert actor.clip_ratio_c == (obj.clip_ratio_c or NEVER_CLIP)
        return
    pl = actor.policy_loss
    params = {k: v for k, v in OmegaConf.to_container(obj).items() if k != "name"}
    assert pl.loss_mode == loss_mode_for(obj.name, sequence=bool(params.get("sequence", False)))
    if obj.name == "troll":
        params.pop("sequence")  # selects the loss mode instead
    assert dict(pl.objective_params) == params
    assert pl.mask == cfg.mask.name and pl.entropy_control == cfg.entropy_control.name
    mask_node = {k: v for k, v in OmegaConf.to_container(cfg.mask).items() if k != "name"}
    assert {k: pl.mask_params[k] for k in mask_node} == mask_node
    assert list(pl.mask_params["length_edges"]) == list(t.length_buckets)
    ec_node = {k: v for k, v in OmegaConf.to_container(cfg.entropy_control).items() if k != "name"}
    assert dict(pl.entropy_control_params) == ec_node
    assert actor.entropy_coeff == 0.0


def _cell(kind: str, name: str, index: int) -> tuple[str, ...]:
    """A preset (``algorithm=``) or method (``+method=``), on a hub model chosen round-robin."""
    model = HF_MODELS[index % len(HF_MODELS)]
    return (f"algorithm={name}" if kind == "algorithm" else f"+method={name}", f"model={model}")


CELLS = [("algorithm", n) for n in PRESETS] + [("method", n) for n in METHODS]


@pytest.mark.parametrize(("kind", "name"), CELLS, ids=[f"{k}={n}" for k, n in CELLS])
def test_every_preset_and_method_translates_into_a_config_verl_accepts(verl_config, kind, name):
    """Each algorithm preset and method composes, translates, and verl validates and instantiates it;
    the few settings verl cannot express raise ConfigError naming the key, and the cell becomes
    expressible with that one key changed (T-PPO's truncated rollouts cannot be)."""
    overrides = _cell(kind, name, CELLS.index((kind, name)))
    cfg = _compose(overrides)
    if name in INEXPRESSIBLE:
        key, fix = INEXPRESSIBLE[name]
        with pytest.raises(ConfigError) as err:
            _translate(cfg)
        assert err.value.key == key
        if fix is None:
            return
        cfg = _compose((*overrides, fix))
    vc = verl_config(_translate(cfg))
    algo, actor = verl_accepts(vc)
    assert_same_cell(cfg, vc, algo, actor)


@pytest.mark.parametrize("model", MODELS)
def test_every_model_size_translates_into_a_config_verl_accepts(verl_config, model):
    """Every model preset with GRPO: the GPUs of its size class, nodes of 8 GPUs, vLLM tensor
    parallelism and FSDP offload from the size profile of conf/backend/verl.yaml; models without a
    Hugging Face directory (embedded, tiny) are refused naming model.kind."""
    from runners.backends.verl.translate import backend_options, size_profile

    cfg = _compose(("algorithm=grpo", f"model={model}"))
    if model in NON_HF_MODELS:
        with pytest.raises(ConfigError) as err:
            _translate(cfg)
        assert err.value.key == "model.kind"
        return
    vc = verl_config(_translate(cfg))
    algo, actor = verl_accepts(vc)
    assert_same_cell(cfg, vc, algo, actor)
    gpus = verl_gpus(float(cfg.model.params_b))
    assert vc.trainer.nnodes == max(1, math.ceil(gpus / 8)) and vc.trainer.n_gpus_per_node == min(gpus, 8)
    profile = size_profile(cfg, backend_options(cfg))
    assert vc.actor_rollout_ref.rollout.tensor_model_parallel_size == profile["tensor_model_parallel_size"]
    assert actor.fsdp_config.param_offload == profile["param_offload"]
    assert vc.actor_rollout_ref.model.path == (SMOLLM2_DIR if cfg.model.kind == "smollm2" else cfg.model.path)
    if not cfg.model.chat_template:  # base models: the plain prompt of runners.data.prompts
        assert "m['content']" in vc.actor_rollout_ref.model.custom_chat_template


def _with_model(cfg, model: str):
    """``cfg`` with another model preset, as composing with ``model=<model>`` gives it."""
    import dataclasses

    from runners.config.schema import ModelConfig

    node = {
        **dataclasses.asdict(ModelConfig()),
        **OmegaConf.to_container(OmegaConf.load(CONF / "model" / f"{model}.yaml")),
    }
    return OmegaConf.merge(cfg, {"model": node})


@pytest.mark.slow
def test_cross_product_is_covered_by_the_two_axes():
    """For every preset x model, the overrides are the preset's (on a reference model) with the
    model-dependent ones replaced by the model's: the two verl-checked axes above thus cover the
    whole product. (The model axis is taken with PPO, whose critic also depends on the model.)"""
    from runners.backends.verl.hydra import override_key

    ref = HF_MODELS[0]

    def table(cfg):
        return {override_key(o): o for o in _translate(cfg) if override_key(o) != "trainer.experiment_name"}

    grpo = _compose(("algorithm=grpo", f"model={ref}"))
    assert table(_with_model(grpo, "qwen3_8b")) == table(_compose(("algorithm=grpo", "model=qwen3_8b")))
    axis = _compose(("algorithm=ppo", f"model={ref}"))
    base = table(axis)
    rows = {model: table(_with_model(axis, model)) for model in HF_MODELS}
    assert {k for row in rows.values() for k, v in row.items() if base.get(k) != v} >= {
        "trainer.n_gpus_per_node",
        "actor_rollout_ref.model.path",
        "critic.model.path",
    }
    for name in PRESETS:
        key, fix = INEXPRESSIBLE.get(name, (None, None))
        if key is not None and fix is None:
            continue
        preset = _compose((f"algorithm={name}", f"model={ref}", *((fix,) if fix else ())))
        expected = table(preset)
        for model, row in rows.items():
            keys = (set(expected) - (set(base) - set(row))) | (set(row) - set(base))
            want = {k: (row[k] if k in row and row[k] != base.get(k) else expected[k]) for k in keys}
            assert table(_with_model(preset, model)) == want, (name, model)


def test_asymmetric_value_clip_is_refused_naming_the_key():
    """verl 0.9.1's value clip is symmetric: T-PPO's 0.5 / 0.6 cannot be expressed."""
    cfg = _compose(("algorithm=ppo", f"model={HF_MODELS[0]}", "trainer.value_clip_high=0.6"))
    with pytest.raises(ConfigError) as err:
        _translate(cfg)
    assert err.value.key == "trainer.value_clip_high"


@pytest.mark.parametrize(
    ("cell", "verl_estimator"),
    [
        (("algorithm=ppo",), "gae"),
        (("algorithm=grpo", "estimator=egae", "trainer.value_clip_high=0.5"), "trustbench_egae"),
    ],
)
def test_critic_config_with_local_model(verl_config, tmp_path, cell, verl_estimator):
    """Every estimator with a critic (GAE, and EGAE with full rollouts): verl builds its CriticConfig (with
    the model's files: a tiny local model here) and validates it; the critic starts from the policy's model,
    with the value clip, learning rate and the estimator's gamma/lambda carried over (not verl's placeholders)."""
    from transformers import AutoTokenizer  # noqa: F401  (transformers present)
    from verl.trainer.ppo.utils import need_critic
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    from runners.backends.verl.translate import build_overrides
    from runners.models.tiny import build_tiny_config
    from runners.models.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer("0123456789+-*=?\n")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    tokenizer.save_pretrained(tmp_path)
    config = build_tiny_config("qwen2", vocab_size=len(tokenizer))
    config.architectures = ["Qwen2ForCausalLM"]
    config.save_pretrained(tmp_path)
    cfg = _compose((*cell, "model=qwen3_1.7b", "trainer.value_clip_high=0.5", "estimator.lam=0.95"))
    vc = verl_config(build_overrides(cfg, _paths(), model_path=str(tmp_path)))
    assert need_critic(vc)
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        validate_config(vc, use_reference_policy=False, use_critic=True)
    critic = omega_conf_to_dataclass(vc.critic)
    algo = vc.algorithm  # read undataclassed, as verl's trainer does (plugin estimators carry an extra key)
    assert critic.cliprange_value == cfg.trainer.value_clip_low
    assert critic.optim.lr == cfg.trainer.critic_lr and critic.model.path == str(tmp_path)
    assert (algo.adv_estimator, algo.gamma, algo.lam) == (verl_estimator, cfg.estimator.gamma, 0.95)


@pytest.mark.parametrize(
    ("objective", "extra"),
    [
        ("clip", ()),
        ("dual_clip", ()),
        ("dapo_clip", ()),
        ("token_is", ()),
        ("gspo", ()),
        ("gpg", ()),
        ("clip", ("loss_agg=seq-mean-token-sum-norm",)),
        ("gspo", ("loss_agg=seq-mean-token-mean",)),
    ],
)
def test_builtin_loss_equals_trustbench_objective(verl_config, objective, extra):
    """verl's own policy loss, called as verl calls it with the actor config built from the
    translated overrides, gives the trustbench objective + aggregation's loss and gradient, also
    for log-ratios far outside every clip range (where an unwanted dual clip or bound would show)."""
    import torch
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    from runners.algorithms import LOSS_AGGS, OBJECTIVES
    from runners.algorithms.types import PolicyInputs

    cfg = _compose(("algorithm=grpo", f"objective={objective}", "model=qwen3_1.7b", *extra))
    vc = verl_config(_translate(cfg))
    _, actor = verl_accepts(vc)
    gen = torch.Generator().manual_seed(0)
    B, T = 6, 9
    old_logp = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 3
    shift = torch.randn(B, T, generator=gen, dtype=torch.float64) * 4  # ratios from e^-12 to e^12
    mask = (torch.arange(T) < torch.tensor([9, 7, 5, 9, 3, 8]).unsqueeze(1)).double()
    adv = torch.randn(B, 1, generator=gen, dtype=torch.float64).expand(B, T).contiguous()
    params = {k: v for k, v in OmegaConf.to_container(cfg.objective).items() if k != "name"}
    norm_len = cfg.loss_agg.norm_len or cfg.rollout.max_response_length

    logp_v = (old_logp + shift).requires_grad_(True)
    loss_v, _ = get_policy_loss_fn(actor.policy_loss.loss_mode)(
        old_log_prob=old_logp,
        log_prob=logp_v,
        advantages=adv,
        response_mask=mask,
        loss_agg_mode=actor.loss_agg_mode,
        config=_with_batch_info(actor),
    )
    loss_v.backward()
    logp_t = (old_logp + shift).requires_grad_(True)
    inp = PolicyInputs(logp=logp_t, old_logp=old_logp, advantages=adv, response_mask=mask)
    out = OBJECTIVES.get(cfg.objective.name)(inp, **params)
    loss_t = LOSS_AGGS.get(cfg.loss_agg.name)(out.loss_mat.double(), mask, norm_len=norm_len)
    loss_t.backward()
    torch.testing.assert_close(loss_v.double(), loss_t, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(logp_v.grad, logp_t.grad, rtol=1e-6, atol=1e-9)


def _with_batch_info(actor):
    """One process: verl's ppo_loss sets global_batch_info from the batch; dp_size 1, local counts."""
    actor.global_batch_info.clear()
    actor.global_batch_info["loss_scale_factor"] = actor.loss_scale_factor
    return actor


def test_warmup_schedule_matches_the_builtin_trainer(verl_config):
    """trainer.warmup_steps=w: verl's scheduler, built from the translated optimiser config as its
    FSDP engine builds it, gives min(1, (s+1)/w) per step -- the built-in trainer's LambdaLR."""
    import torch
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.torch_functional import get_cosine_schedule_with_warmup

    warm, total = 4, 12
    cfg = _compose(
        ("algorithm=grpo", "model=qwen3_1.7b", f"trainer.warmup_steps={warm}", f"trainer.total_steps={total}")
    )
    optim = omega_conf_to_dataclass(verl_config(_translate(cfg)).actor_rollout_ref.actor.optim)
    assert optim.lr_scheduler_type == "cosine"
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched = get_cosine_schedule_with_warmup(
        opt,
        num_warmup_steps=optim.lr_warmup_steps,
        num_training_steps=total,
        min_lr_ratio=optim.min_lr_ratio,
        num_cycles=optim.num_cycles,
        zero_indexed_step=optim.zero_indexed_step,
    )
    verl_lrs = []
    for _ in range(total):
        verl_lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert verl_lrs == pytest.approx([min(1.0, (s + 1) / warm) for s in range(total)])


def test_worker_environment_reaches_every_ray_worker(verl_config):
    """The plugins module (and the backend's files) are named in Ray's runtime env, merged by
    main_ppo with verl's own defaults (the same merge main_ppo performs before ray.init)."""
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    from runners.backends.verl import EXTERNAL_MODULES_ENV, PLUGIN_MODULE

    cfg = _compose(("algorithm=grpo", "model=qwen3_1.7b"))
    vc = verl_config(_translate(cfg, worker_env={"VERL_FILE_LOGGER_PATH": "/runs/m.jsonl"}))
    merged = OmegaConf.merge(get_ppo_ray_runtime_env(vc), vc.ray_kwargs.ray_init.runtime_env)
    assert merged.env_vars[EXTERNAL_MODULES_ENV] == PLUGIN_MODULE
    assert merged.env_vars.VERL_FILE_LOGGER_PATH == "/runs/m.jsonl"
    assert merged.env_vars.TOKENIZERS_PARALLELISM == "true"  # verl's defaults survive


def test_fast_path_is_hydra_compose(verl_config):
    """Applying the overrides to the composed base equals Hydra's compose with the overrides."""
    for overrides in (("algorithm=gspo", "model=qwen3_8b"), ("+method=grpo_troll", "model=qwen3_1.7b", "mask=trm_max")):
        lines = _translate(_compose(overrides))
        full = _hydra_compose_verl(verl_config.config_dir, lines)
        assert OmegaConf.to_container(verl_config(lines)) == OmegaConf.to_container(full)


def test_resume_and_user_overrides():
    """A resumed attempt does not repeat the evaluation before training; backend.options.overrides
    replace the generated override of the same key and add new ones, in order, at the end."""
    from runners.backends.verl.hydra import format_value, override_key

    fresh = _translate(_compose(("algorithm=grpo", "model=qwen3_1.7b")))
    resumed = _translate(_compose(("algorithm=grpo", "model=qwen3_1.7b")), resuming=True)
    assert "trainer.val_before_train=true" in fresh and "trainer.val_before_train=false" in resumed
    extra = ["actor_rollout_ref.rollout.gpu_memory_utilization=0.8", "+actor_rollout_ref.model.override_config.x=1"]
    cfg = _compose(("algorithm=grpo", "model=qwen3_1.7b", f"backend.options.overrides={format_value(extra)}"))
    lines = _translate(cfg)
    assert lines[-2:] == extra
    keys = [override_key(o) for o in lines]
    assert keys.count("actor_rollout_ref.rollout.gpu_memory_utilization") == 1


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (("model=qwen3_1.7b", "trainer.logprob_precision=bf16"), "trainer.logprob_precision"),
        (("model=tiny_qwen2",), "model.kind"),
        (("model=qwen3_1.7b", "+backend.options.unknown=1"), "backend.options.unknown"),
        (("model=qwen3_1.7b", "backend.options.metrics_via=wandb"), "backend.options.metrics_via"),
        (
            ("model=qwen3_8b", "trainer.prompts_per_step=3", "trainer.mini_batch_prompts=3", "trainer.n=3"),
            "trainer.prompts_per_step",
        ),
        (("model=qwen3_8b", "trainer.mini_batch_prompts=1", "trainer.n=4"), "trainer.mini_batch_prompts"),
        (("model=qwen3_8b", "trainer.micro_batch_size=3"), "trainer.micro_batch_size"),
        (
            (
                "model=qwen3_1.7b",
                "launcher.gpus_per_node=3",
                "trainer.n=6",
                "backend.options.profiles=[{max_params_b:100,tensor_model_parallel_size:2}]",
            ),
            "backend.options.profiles",
        ),
        (
            ("model=qwen3_1.7b", "backend.options.profiles=[{tensor_model_parallel_size:2}]"),
            "backend.options.profiles.0.max_params_b",
        ),
    ],
)
def test_inexpressible_settings_name_the_key(overrides, key):
    """verl cannot run these: the error names the key to change (nothing is launched)."""
    with pytest.raises(ConfigError) as err:
        _translate(_compose(("algorithm=grpo", *overrides)))
    assert err.value.key == key


# keys Hydra would convert are refused by the writer (test_keys_hydra_would_convert_are_refused)
_IDENT = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True).filter(
    lambda k: k.lower() not in ("true", "false", "null", "inf", "nan")
)
_SCALAR = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.booleans(),
    st.none(),
)
_VALUE = st.recursive(
    _SCALAR, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_IDENT, inner, max_size=3), max_leaves=6
)


@settings(max_examples=300, deadline=None)
@given(_VALUE)
@example("TRUE")
@example("Null")
@example("nan")
def test_format_value_round_trips_through_hydras_parser(value):
    """Any value the translation writes (paths, templates with quotes and backslashes, nested
    lists and dicts, floats like 1e10) parses back to itself with Hydra's own override parser."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from runners.backends.verl.hydra import format_override

    parsed = OverridesParser.create().parse_override(format_override("a.b", value)).value()
    assert parsed == value or (isinstance(value, float) and math.isclose(parsed, value, rel_tol=0, abs_tol=0))


@pytest.mark.parametrize("key", ["true", "FALSE", "Null", "inf", "NaN", "1a", "a-b"])
def test_keys_hydra_would_convert_are_refused(key):
    """Hydra parses the dict key ``true`` as True and ``inf`` as a float (checked here with its own
    parser): such keys cannot round-trip, so the writer refuses them instead of changing them."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from runners.backends.verl.hydra import format_value

    if key.lower() in ("true", "false", "null", "inf", "nan"):
        parsed = OverridesParser.create().parse_override(f"a={{{key}:1}}").value()
        assert not isinstance(next(iter(parsed)), str)
    with pytest.raises(ValueError, match="cannot be written as a Hydra override"):
        format_value({key: 1})


ESTIMATOR_PLUGIN_CELLS = [
    ("estimator.std_eps=1e-4",),  # verl's GRPO eps is fixed at 1e-6
    ("estimator=rfpp", "estimator.center=false"),  # verl's REINFORCE++ always centres
    ("estimator=gpg", "estimator.rescale=none"),  # verl's GPG always rescales
]


@pytest.mark.parametrize("overrides", ESTIMATOR_PLUGIN_CELLS, ids=lambda o: o[-1])
def test_estimator_parameters_verl_fixes_go_to_the_trustbench_estimator(verl_config, overrides):
    """An estimator setting verl's built-in cannot take selects ``trustbench_<estimator>`` with the
    estimator node as its parameters; verl validates the config and resolves the plugin by name."""
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn
    from verl.trainer.ppo.utils import need_reference_policy
    from verl.utils.config import validate_config

    from runners.backends.verl import ESTIMATOR_PARAMS_KEY

    cfg = _compose(("algorithm=grpo", "model=qwen3_1.7b", *overrides))
    vc = verl_config(_translate(cfg))
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        validate_config(vc, use_reference_policy=need_reference_policy(vc), use_critic=False)
    assert vc.algorithm.adv_estimator == f"trustbench_{cfg.estimator.name}"
    get_adv_estimator_fn(vc.algorithm.adv_estimator)
    node = {k: v for k, v in OmegaConf.to_container(cfg.estimator).items() if k != "name"}
    assert OmegaConf.to_container(vc.algorithm[ESTIMATOR_PARAMS_KEY]) == node


@pytest.mark.xfail(
    strict=True,
    raises=Exception,
    reason="the plugins' contract puts the estimator parameters in algorithm."
    "trustbench_estimator, an extra key verl's AlgoConfig dataclass rejects (verl 0.9.1's trainer "
    "reads the DictConfig and never builds AlgoConfig, so training is unaffected)",
)
def test_estimator_plugin_config_builds_verls_algo_dataclass(verl_config):
    from verl.utils.config import omega_conf_to_dataclass

    vc = verl_config(_translate(_compose(("algorithm=grpo", "model=qwen3_1.7b", "estimator.std_eps=1e-4"))))
    omega_conf_to_dataclass(vc.algorithm)


def test_metrics_via_mlflow_keeps_verls_logged_config_constant_across_attempts():
    """With verl's own MLflow logger (which logs verl's whole config as run parameters, refused by
    MLflow if any value changes on a resumed attempt) the overrides of a fresh and a resumed
    attempt are identical, and no per-attempt file reaches the workers' environment."""
    from runners.backends.verl.process import worker_env

    cfg = _compose(("algorithm=grpo", "model=qwen3_1.7b", "backend.options.metrics_via=mlflow"))
    env = {
        "VERL_FILE_LOGGER_PATH": "/runs/metrics.2.jsonl",
        "MLFLOW_RUN_ID": "abc",
        "MLFLOW_TRACKING_URI": "http://h:5000",
    }
    fresh = _translate(cfg, worker_env=worker_env(env, "mlflow"))
    resumed = _translate(cfg, resuming=True, worker_env=worker_env(env, "mlflow"))
    assert fresh == resumed and "trainer.logger=[console,mlflow]" in fresh
    assert not any("VERL_FILE_LOGGER_PATH" in line for line in fresh)
    assert any(line.endswith("MLFLOW_RUN_ID=abc") for line in fresh)


def test_the_stop_timeout_default_is_the_configs():
    """``backend.options.stop_timeout_s``: conf/backend/verl.yaml's value is the code's fallback
    (``STOP_TIMEOUT_S``), and ``backend_options`` supplies it when a user removes the key."""
    from runners.backends.verl.translate import STOP_TIMEOUT_S, backend_options
    from runners.config import compose

    cfg, _ = compose(["backend=verl"])
    assert cfg.backend.options.stop_timeout_s == STOP_TIMEOUT_S
    assert backend_options(compose(["backend=verl", "backend.options.stop_timeout_s=30"])[0])["stop_timeout_s"] == 30
    assert backend_options(compose(["backend=verl", "~backend.options.stop_timeout_s"])[0])["stop_timeout_s"] == 900
