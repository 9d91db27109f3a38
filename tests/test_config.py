"""Configuration: every file in conf/ and sweeps/ composes; bad values fail before training, naming the key.

The reference for "valid" is the algorithm library itself: every component option's parameters must
bind to the keyword arguments of the registered function (so config and code cannot drift).
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from hydra.errors import HydraException
from omegaconf import OmegaConf

from runners.algorithms import REGISTRIES
from runners.algorithms.method import GROUPS as COMPONENTS
from runners.config import CONF_DIR, ConfigError, compose, method_label, run_key


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


@pytest.mark.parametrize("name", options("algorithm"))
def test_every_algorithm_preset_composes_and_validates(name):
    cfg, choices = compose([f"algorithm={name}"])
    assert cfg.algorithm.name == name
    # the preset's declared components are the ones Hydra selected
    for group, chosen in cfg.algorithm.components.items():
        assert choices[group] == chosen, (group, choices[group], chosen)
    assert method_label(cfg, choices) == cfg.algorithm.label


def test_preset_components_are_read_from_the_presets_defaults_list(tmp_path, monkeypatch):
    """``algorithm.components`` is derived from the preset's ``- override /<group>: <option>`` lines (the
    test above holds it against Hydra's choices for every preset); a name without a file selects nothing."""
    import runners.config as config

    assert config.preset_components("gtpo") == {
        "estimator": "grpo", "objective": "gtpo", "mask": "none", "entropy_control": "none",
        "loss_agg": "seq-mean-token-mean", "rollout": "full",
    }  # fmt: skip
    assert config.preset_components("no_such_preset") == {}
    cfg, _ = compose(["algorithm=gtpo", "algorithm.name=no_such_preset"])
    assert dict(cfg.algorithm.components) == {}


@pytest.mark.parametrize("name", options("method"))
def test_every_method_composes_and_validates(name):
    cfg, choices = compose([f"+method={name}"])
    assert method_label(cfg, choices)


GROUP_CASES = [
    (group, name)
    for group in ("estimator", "objective", "mask", "entropy_control", "loss_agg", "rollout", "model", "dataset")
    for name in options(group)
]
# options that only make sense together with another choice
COMPANIONS = {
    ("rollout", "truncated"): ["algorithm=tppo"],
    ("estimator", "gae"): [],
    ("entropy_control", "adapo"): ["algorithm=dapo"],
}


@pytest.mark.parametrize("group,name", GROUP_CASES)
def test_every_group_option_composes_and_validates(group, name):
    extra = COMPANIONS.get((group, name), [])
    cfg, choices = compose([*extra, f"{group}={name}"])
    assert choices[group] == name


@pytest.mark.parametrize("group", list(COMPONENTS))
def test_component_options_bind_to_their_functions(group):
    """Each option's fields are accepted by the registered function/class (config cannot drift from code)."""
    for name in options(group):
        node = OmegaConf.load(CONF_DIR / group / f"{name}.yaml")
        cfg, _ = compose([f"{group}={name}", *COMPANIONS.get((group, name), [])], check=False)
        kwargs = {k: v for k, v in OmegaConf.to_container(cfg[group]).items() if k != "name"}
        for key in REGISTRIES[group].entry(node.name).trainer_keys:  # consumed by the trainer, declared
            kwargs.pop(key, None)
        fn = REGISTRIES[group].get(node.name)
        positional = {
            "estimator": ["inp"],
            "objective": ["inp"],
            "mask": ["inp"],
            "loss_agg": ["mat", "mask"],
            "rollout_correction": ["old", "rollout", "mask"],
        }
        inspect.signature(fn).bind(*positional.get(group, []), **kwargs)


def test_run_key_ignores_launcher_and_tracking_but_not_training():
    base, _ = compose([])
    same, _ = compose(["tracking=server", "progress=false", "launcher.time_min=5"])
    other_seed, _ = compose(["seed=1"])
    other_lr, _ = compose(["trainer.lr=3e-4"])
    assert run_key(base) == run_key(same)
    assert len({run_key(base), run_key(other_seed), run_key(other_lr)}) == 3


def test_labels_name_swapped_components():
    cfg, ch = compose(["algorithm=grpo", "mask=trm_max", "entropy_control=repo_r"])
    assert method_label(cfg, ch) == "GRPO + TRM-Max + REPO-R"
    cfg, ch = compose(["algorithm=gspo", "objective=troll"])
    assert method_label(cfg, ch) == "GSPO + TROLL"


def test_labels_are_declared_on_the_registries_for_every_option():
    """A group that labels any option labels all of its conf options (declared on the registry lines:
    ``label`` / ``preset_labels``), so a new component never shows as ``objective=name`` beside TROLL."""
    from runners.config import component_groups, component_label

    for group in component_groups():
        shown = {name: component_label(group, name) for name in options(group)}
        unlabelled = sorted(name for name, label in shown.items() if label == f"{group}={name}")
        assert unlabelled in ([], sorted(shown)), (group, unlabelled)
    assert component_label("estimator", "rloo") == "estimator=rloo"  # estimators are named by key


def test_labels_of_objectives_presets_and_label_order():
    cfg, ch = compose(["algorithm=grpo", "objective=cispo"])
    assert method_label(cfg, ch) == "GRPO + CISPO"
    cfg, ch = compose(["algorithm=grpo", "objective=dapo_clip"])
    assert method_label(cfg, ch) == "GRPO + Clip-Higher"
    cfg, ch = compose(["algorithm=grpo", "estimator=rloo", "objective=troll_seq"])
    assert method_label(cfg, ch) == "GRPO + TROLL-Seq + estimator=rloo"


@pytest.mark.parametrize("rescale", ["verl", "groups", "none", "bogus"])
def test_gpg_rescale_accepted_by_the_config_iff_by_the_estimator(rescale):
    """The config's check of ``estimator.rescale`` and GPG's estimator accept the same values."""
    import torch

    from runners.algorithms.estimators import compute_gpg_advantages
    from runners.algorithms.types import AdvantageInputs

    inp = AdvantageInputs(
        token_rewards=torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 0.0], [1.0, 0.0]]),
        response_mask=torch.ones(4, 2),
        group_index=torch.tensor([0, 0, 1, 1]),
    )
    try:
        compute_gpg_advantages(inp, rescale=rescale)
        estimator_accepts = True
    except ValueError:
        estimator_accepts = False
    try:
        compose(["estimator=gpg", f"estimator.rescale={rescale}"])
        config_accepts = True
    except ConfigError as err:
        assert err.key == "estimator.rescale"
        config_accepts = False
    assert config_accepts == estimator_accepts
    assert estimator_accepts == (rescale != "bogus")


BAD = [
    (["algorithm=nope"], "algorithm"),
    (["objective=nope"], "objective"),
    (["model=nope"], "model"),
    (["objective=troll", "objective.eps=0"], "objective.eps"),
    (["objective=troll", "objective.eps=-0.1"], "objective.eps"),
    (["objective=troll", "objective.top_k=0"], "objective.top_k"),
    (["launcher.parallel=0"], "launcher.parallel"),
    (["objective=troll", "objective.tail_mass=1.5"], "objective.tail_mass"),
    (["objective.clip_ratio_low=1.2"], "objective.clip_ratio_low"),
    (["objective.clip_ratio_high=0"], "objective.clip_ratio_high"),
    (["objective.clip_ratio_c=0.5"], "objective.clip_ratio_c"),
    (["objective=troll", "+objective.epsilon=0.1"], "objective.epsilon"),
    (["objective.nonsense=1"], "objective.nonsense"),
    (["objective=gtpo", "objective.combine=and"], "objective.combine"),
    (["mask=trm_max", "mask.delta=-1"], "mask.delta"),
    (["algorithm=tppo", "rollout.window=1000"], "rollout.window"),
    (["algorithm=tppo", "rollout.window=0"], "rollout.window"),
    (["rollout=truncated"], "rollout.mode"),
    (["rollout.temperature=0"], "rollout.temperature"),
    (["rollout.top_p=1.5"], "rollout.top_p"),
    (["trainer.n=1"], "trainer.n"),
    (["trainer.mini_batch_prompts=3"], "trainer.mini_batch_prompts"),
    (["trainer.lr=-1"], "trainer.lr"),
    (["trainer.total_steps=0"], "trainer.total_steps"),
    (["trainer.logprob_precision=fp8"], "trainer.logprob_precision"),
    (["trainer.length_buckets=[0,5,3]"], "trainer.length_buckets"),
    (["entropy_control=repo_r", "entropy_control.zeta0=1.0"], "entropy_control.zeta0"),
    (["entropy_control=adapo", "objective=gspo"], "entropy_control.name"),
    (["dataset.path=/nonexistent/train.parquet"], "dataset.path"),
    (["dataset.eval_limit=0"], "dataset.eval_limit"),
    (["dataset.reward=nope"], "dataset.reward"),
    (["dataset.extra_eval=[math500,nope]"], "dataset.extra_eval"),
    (["model.kind=tiny", "model.arch=gpt9"], "model.arch"),
    (["model.kind=hub", "model.path=./no/such/dir"], "model.path"),
    (["model.dtype=int4"], "model.dtype"),
    (["backend.name=jax"], "backend.name"),
    (["tracking.port=0"], "tracking.port"),
    (["launcher.name=k8s"], "launcher.name"),
    (["trainer.lr=abc"], "trainer.lr"),
]


@pytest.mark.parametrize("overrides,key", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_configurations_fail_naming_the_key(overrides, key):
    with pytest.raises((ConfigError, HydraException)) as err:
        compose(overrides)
    message = str(err.value)
    assert key.split(".")[-1] in message or key in message, message
    assert not isinstance(err.value, (AssertionError, NameError, AttributeError))


def test_config_error_names_the_full_key():
    with pytest.raises(ConfigError) as err:
        compose(["objective=troll", "objective.eps=-0.1"])
    assert err.value.key == "objective.eps"
    assert "must be > 0" in str(err.value)


def test_conf_tree_has_one_folder_per_axis():
    groups = {p.name for p in Path(CONF_DIR).iterdir() if p.is_dir()}
    assert {
        "algorithm",
        "estimator",
        "objective",
        "mask",
        "entropy_control",
        "loss_agg",
        "rollout",
        "model",
        "dataset",
        "backend",
        "launcher",
        "tracking",
    } <= groups


def test_list_prints_every_option_with_its_summary_and_survives_a_closed_pipe(tmp_path):
    """`trustbench list` shows each group's options with the first comment line of their file (not
    Hydra's @package line); when its reader has gone (`| head`) it exits 0 without a traceback."""
    import subprocess
    import sys

    from runners.cli import _summary_line

    sample = tmp_path / "x.yaml"
    sample.write_text("# @package _global_\n#no space: not a comment line\n# The summary\n# more\nkey: 1\n")
    assert _summary_line(sample) == "The summary"
    cmd = [sys.executable, "-m", "runners.cli", "list"]
    lines = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()
    for path in sorted((Path(CONF_DIR) / "mask").glob("*.yaml")):
        assert f"  {path.stem:<26} {_summary_line(path)}" in lines
    assert len("\n".join(lines)) > 8192, "the output must overflow the pipe's write buffer for the check below"
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        proc.stdout.close()  # the reader is gone before anything is written
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=60) == 0 and "Traceback" not in err, err
