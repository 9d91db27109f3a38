"""More user mistakes, through every command: exit 2, one line naming the key, flag or file, nothing created.

The list of ``tests/test_reliability_messages.py`` grown to every command a user types: ``run`` with
wrong types, out-of-range values, unknown keys and options, options of another group, missing files or
files of the wrong kind, combinations the validator refuses and unusable tracking URIs; ``sweep`` (and
``--dry-run``) with bad sweep files and bad axes; ``report``, ``bounds``, ``ui`` and ``list`` with bad
flags. Each runs the real command in this process (``runners.cli.main``; a mistake is caught before
anything trains, so each case takes about a second). The reference is the command's own stderr and
exit code, and the file system: no traceback, exactly one message line, and nothing written to the
trustbench home (no MLflow store, no run or Hydra directory) nor beside it.

Flags argparse refuses (``--port abc``) print argparse's usage block and its one ``error:`` line,
as every Unix command does; the error line names the flag.

Run:  pytest tests/test_reliability_messages_more.py
"""

from __future__ import annotations

import uuid

import pytest

from runners import cli
from runners.config import SWEEPS_DIR
from tests.reliability import FAST, cli_home, free_port  # noqa: F401 (cli_home: fixture "home")

# reliability scenarios (README, "Reliability tests"): left out of make test-fast, as the first list
pytestmark = pytest.mark.e2e


def _outcome(capsys, *args: str) -> tuple[int, str]:
    """(exit status, stderr) of ``trustbench ARGS`` run in this process (argparse's exit caught)."""
    try:
        code = cli.main(list(args))
    except SystemExit as exit_:
        code = exit_.code
    return code, capsys.readouterr().err


def _assert_one_line(code: int, err: str, words, *, argparse_error: bool = False) -> str:
    """Exit 2, no traceback, and one message line naming every ``words`` (after argparse's usage block)."""
    assert code == 2, (code, err)
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    if argparse_error:
        messages = [ln for ln in lines if ": error: " in ln]
        assert all(ln.startswith(("usage:", " ")) for ln in lines if ln not in messages), err
    else:
        messages = lines
    assert len(messages) == 1 and messages[0].startswith("trustbench"), err
    for word in words:
        assert word in messages[0], (word, messages[0])
    return messages[0]


def _assert_nothing_created(home, tmp_path) -> None:
    assert not home.exists() or not list(home.rglob("*")), sorted(map(str, home.rglob("*")))
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "home") == [], list(tmp_path.iterdir())


def _key(key: str) -> str:
    return f"config key '{key}'"


# -- run: (case, overrides, words its one line must hold; {tmp}: the test's directory) --------------------
RUN_MISTAKES = [
    # wrong types
    ("unknown_key_without_plus", ["trainer.lrr=1"], [_key("trainer.lrr")]),
    ("string_for_int", ["trainer.total_steps=abc"], [_key("trainer.total_steps"), "abc"]),
    ("list_for_float", ["trainer.lr=[0.1]"], [_key("trainer.lr")]),
    ("not_a_bool", ["trainer.post_update_diagnostics=maybe"], [_key("trainer.post_update_diagnostics")]),
    ("null_for_required", ["trainer.n=null"], [_key("trainer.n"), "not Optional"]),
    ("string_for_list", ["dataset.extra_eval=gsm8k"], [_key("dataset.extra_eval")]),
    ("list_for_string", ["label=[1,2]"], [_key("label")]),
    ("strings_for_token_counts", ["trainer.length_buckets=[a,b]"], [_key("trainer.length_buckets"), "whole number"]),
    # NaN, infinity, zero or a negative where a positive value belongs
    ("nan_learning_rate", ["trainer.lr=nan"], [_key("trainer.lr"), "nan"]),
    ("infinite_temperature", ["rollout.temperature=inf"], [_key("rollout.temperature"), "inf"]),
    ("nan_grad_clip", ["trainer.grad_clip=nan"], [_key("trainer.grad_clip")]),
    ("negative_batch", ["trainer.prompts_per_step=-4"], [_key("trainer.prompts_per_step"), ">= 1"]),
    ("zero_group_size", ["trainer.n=0"], [_key("trainer.n")]),
    ("zero_epochs", ["trainer.ppo_epochs=0"], [_key("trainer.ppo_epochs")]),
    ("negative_micro_batch", ["trainer.micro_batch_size=-1"], [_key("trainer.micro_batch_size")]),
    ("zero_response_length", ["rollout.max_response_length=0"], [_key("rollout.max_response_length")]),
    ("negative_staleness", ["rollout.staleness=-1"], [_key("rollout.staleness")]),
    ("negative_threads", ["backend.num_threads=-1"], [_key("backend.num_threads")]),
    ("zero_flush_interval", ["tracking.flush_every_s=0"], [_key("tracking.flush_every_s")]),
    ("negative_failure_step", ["debug.fail_at_step=-1"], [_key("debug.fail_at_step")]),
    ("negative_model_size", ["model.params_b=-1"], [_key("model.params_b")]),
    ("zero_train_limit", ["dataset.train_limit=0"], [_key("dataset.train_limit")]),
    # probabilities and rates out of their range
    ("nucleus_zero", ["rollout.top_p=0"], [_key("rollout.top_p"), "(0, 1]"]),
    ("adam_beta_one", ["trainer.adam_beta1=1"], [_key("trainer.adam_beta1"), "[0, 1)"]),
    ("clip_low_above_one", ["objective.clip_ratio_low=1.5"], [_key("objective.clip_ratio_low"), "< 1"]),
    ("dual_clip_at_one", ["objective.clip_ratio_c=1"], [_key("objective.clip_ratio_c"), "> 1"]),
    ("troll_radius_zero", ["objective=troll", "objective.eps=0"], [_key("objective.eps")]),
    ("troll_tail_mass_zero", ["objective=troll", "objective.tail_mass=0"], [_key("objective.tail_mass")]),
    ("troll_p_default_half", ["objective=troll", "objective.p_default=0.5"], [_key("objective.p_default")]),
    ("troll_dual_range_inverted", ["objective=troll", "objective.eta_max=1e-8"], [_key("objective.eta_max")]),
    ("bapo_rho_one", ["objective=bapo", "objective.rho=1"], [_key("objective.rho")]),
    ("gae_gamma_above_one", ["estimator=gae", "estimator.gamma=1.5"], [_key("estimator.gamma"), "[0, 1]"]),
    ("std_eps_zero", ["estimator.std_eps=0"], [_key("estimator.std_eps")]),
    ("trm_delta_negative", ["mask=trm_max", "mask.delta=-1"], [_key("mask.delta")]),
    (
        "repo_bounds_inverted",
        ["entropy_control=repo_r", "entropy_control.zeta_max=1e-5"],
        [_key("entropy_control.zeta_max")],
    ),
    ("adapo_increase_one", ["entropy_control=adapo", "entropy_control.increase=1"], [_key("entropy_control.increase")]),
    ("bonus_beta_negative", ["entropy_control=bonus", "entropy_control.beta0=-1"], [_key("entropy_control.beta0")]),
    ("tis_cap_one", ["rollout_correction=token_tis", "rollout_correction.cap=1"], [_key("rollout_correction.cap")]),
    (
        "norm_len_negative",
        ["loss_agg=seq-mean-token-sum-norm", "loss_agg.norm_len=-3"],
        [_key("loss_agg.norm_len"), ">= 1"],
    ),
    # unknown options, options of another group, parameters of another component
    ("unknown_algorithm", ["algorithm=nope"], ["config group 'algorithm'", "'nope'", "grpo"]),
    ("option_of_another_group", ["objective=grpo"], ["config group 'objective'", "'grpo'", "troll"]),
    ("unknown_model_preset", ["model=nope"], ["config group 'model'", "embedded"]),
    ("unknown_method", ["+method=nope"], ["config group 'method'", "grpo_troll"]),
    ("unknown_regime", ["+regime=nope"], ["config group 'regime'", "stale2"]),
    ("parameter_of_another_objective", ["objective.eps=0.1"], [_key("objective.eps"), "ClipObjective"]),
    ("unknown_gtpo_combination", ["objective=gtpo", "objective.combine=and"], [_key("objective.combine"), "or"]),
    ("unknown_rollout_mode", ["rollout.mode=partial"], [_key("rollout.mode"), "full"]),
    ("unknown_sampler_dtype", ["rollout.dtype=int8"], [_key("rollout.dtype")]),
    ("unknown_logprob_precision", ["trainer.logprob_precision=fp8"], [_key("trainer.logprob_precision")]),
    ("unknown_model_dtype", ["model.dtype=float64"], [_key("model.dtype"), "bfloat16"]),
    ("unknown_tiny_arch", ["model.kind=tiny", "model.arch=gpt9"], [_key("model.arch"), "qwen2"]),
    ("unknown_backend", ["backend.name=jax"], [_key("backend.name")]),
    ("unknown_device", ["backend.device=tpu"], [_key("backend.device"), "cuda"]),
    ("unknown_tracking_kind", ["tracking.kind=postgres"], [_key("tracking.kind")]),
    ("unknown_launcher", ["launcher.name=k8s"], [_key("launcher.name"), "slurm"]),
    ("unknown_reward", ["dataset.reward=nope"], [_key("dataset.reward")]),
    ("unknown_dataset_name", ["dataset.name=nope"], [_key("dataset.name"), "gsm8k"]),
    ("unknown_eval_dataset", ["dataset.eval_name=nope"], [_key("dataset.eval_name")]),
    ("unknown_extra_eval", ["dataset.extra_eval=[math500,nope]"], [_key("dataset.extra_eval")]),
    ("unknown_train_split", ["dataset.train_split=nope"], [_key("dataset.train_split"), "'nope'", "train"]),
    ("unknown_eval_split", ["dataset.eval_split=nope"], [_key("dataset.eval_split"), "'nope'", "test"]),
    ("unknown_top_level_key", ["+foo=1"], [_key("foo"), "top-level keys"]),
    ("unknown_backend_option", ["backend.options.nope=1"], [_key("backend.options.nope")]),
    ("append_to_existing_key", ["+estimator.std_eps=1"], ["estimator.std_eps", "++"]),
    # the embedded model's recipe (model.options)
    ("recipe_zero_width", ["+model.options.hidden_size=0"], [_key("model.options.hidden_size"), ">= 1"]),
    ("recipe_string_for_int", ["+model.options.num_hidden_layers=abc"], [_key("model.options.num_hidden_layers")]),
    ("recipe_heads_not_dividing", ["+model.options.num_attention_heads=3"], [_key("model.options.hidden_size")]),
    # the embedded dataset's generator (dataset.options)
    ("generator_zero_digits", ["dataset.options.digits=0"], [_key("dataset.options.digits"), "positive integer"]),
    ("generator_unknown_operator", ["dataset.options.ops=x"], [_key("dataset.options.ops"), "'x'"]),
    ("generator_string_for_number", ["dataset.options.digits=abc"], [_key("dataset.options.digits"), "number"]),
    (
        "generator_fraction_above_one",
        ["+dataset.options.test_fraction=2"],
        [_key("dataset.options.test_fraction"), "(0, 1)"],
    ),
    # combinations the validator refuses
    ("groups_of_one", ["trainer.n=1"], [_key("trainer.n"), "n >= 2"]),
    ("mini_batch_not_dividing", ["trainer.mini_batch_prompts=3"], [_key("trainer.mini_batch_prompts"), "divide"]),
    ("truncated_without_critic", ["rollout=truncated"], [_key("rollout.mode"), "gae"]),
    ("window_longer_than_response", ["algorithm=tppo", "rollout.window=1000"], [_key("rollout.window")]),
    ("drop_beyond_window", ["algorithm=tppo", "rollout.drop_last_k=100"], [_key("rollout.drop_last_k")]),
    ("drop_in_full_mode", ["rollout.drop_last_k=2"], [_key("rollout.drop_last_k"), "truncated"]),
    ("adapo_without_clip", ["entropy_control=adapo", "objective=gspo"], [_key("entropy_control.name")]),
    ("buckets_not_increasing", ["trainer.length_buckets=[0,5,3]"], [_key("trainer.length_buckets")]),
    # files: missing, a directory, the wrong kind
    ("hub_model_directory_missing", ["model.kind=hub", "model.path=/nonexistent/model"], [_key("model.path")]),
    ("hub_model_without_path", ["model.kind=hub", "model.path="], [_key("model.path")]),
    ("dataset_file_missing", ["dataset=gsm8k", "dataset.path=/nonexistent/train.jsonl"], [_key("dataset.path")]),
    ("dataset_path_is_a_directory", ["dataset=gsm8k", "dataset.path={tmp}"], [_key("dataset.path"), "not found"]),
    ("eval_file_missing", ["dataset.eval_path=/nonexistent/test.jsonl"], [_key("dataset.eval_path")]),
    # tracking stores MLflow cannot open, a server address that is none
    ("tracking_uri_unknown_scheme", ["tracking.uri=nope://x"], [_key("tracking.uri"), "unsupported scheme 'nope'"]),
    ("tracking_uri_file_store", ["tracking.uri={tmp}/mlruns"], [_key("tracking.uri"), "file store"]),
    ("tracking_uri_sqlite_two_slashes", ["tracking.uri=sqlite://x.db"], [_key("tracking.uri"), "sqlite:///"]),
    ("tracking_port_out_of_range", ["tracking.port=70000"], [_key("tracking.port")]),
    ("tracking_host_empty", ["tracking.kind=server", "tracking.host="], [_key("tracking.host")]),
    # the Slurm request
    ("launcher_parallel_zero", ["launcher.parallel=0"], [_key("launcher.parallel")]),
    ("launcher_time_zero", ["launcher.time_min=0"], [_key("launcher.time_min")]),
    ("launcher_memory_zero", ["launcher=slurm", "launcher.mem_gb=0"], [_key("launcher.mem_gb")]),
    ("launcher_nodes_zero", ["launcher.nodes=0"], [_key("launcher.nodes")]),
    ("launcher_signal_delay_negative", ["launcher.signal_delay_s=-1"], [_key("launcher.signal_delay_s")]),
    ("launcher_setup_not_a_list", ["launcher.setup=module load x"], [_key("launcher.setup")]),
]


@pytest.mark.parametrize(("case", "overrides", "words"), RUN_MISTAKES, ids=[m[0] for m in RUN_MISTAKES])
def test_a_run_mistake_is_one_line_exit_2_and_nothing_created(home, tmp_path, capsys, case, overrides, words):
    overrides = [o.replace("{tmp}", str(tmp_path)) for o in overrides]
    code, err = _outcome(capsys, "run", *FAST, *overrides)  # the case's overrides win over FAST's
    _assert_one_line(code, err, ["configuration error", *words])
    _assert_nothing_created(home, tmp_path)


def test_an_unusable_tracking_uri_in_the_environment_is_named(home, tmp_path, capsys, monkeypatch):
    """``MLFLOW_TRACKING_URI=ftp://...``: the environment variable is named (not a config key)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "ftp://user:secret@example.org/x")
    code, err = _outcome(capsys, "run", *FAST)
    line = _assert_one_line(code, err, ["environment variable MLFLOW_TRACKING_URI", "unsupported scheme 'ftp'"])
    assert "secret" not in line
    _assert_nothing_created(home, tmp_path)


# -- sweep files: (case, content, words) ------------------------------------------------------------------
_HEAD = "# @package _global_\nexperiment: ok\n"
_AXES = _HEAD + "hydra:\n  sweeper:\n    params:\n"
SWEEP_FILES = [
    ("empty_file", "", ["is empty", "{path}"]),
    ("no_package_line", "experiment: ok\ntrainer:\n  total_steps: 2\n", ["@package _global_", "{path}"]),
    ("json_instead_of_yaml", '{"experiment": "ok", "trainer": {"total_steps": 2}}\n', ["@package _global_", "{path}"]),
    ("a_list_not_a_mapping", "# @package _global_\n- seed\n- trainer\n", ["must be a mapping", "{path}"]),
    ("params_a_list", _HEAD + "hydra:\n  sweeper:\n    params: [seed]\n", [_key("hydra.sweeper.params"), "{path}"]),
    ("axis_without_values", _AXES + "      seed:\n", [_key("hydra.sweeper.params.seed"), "no values", "{path}"]),
    ("empty_grid", _AXES + "      seed: range(3,3)\n", [_key("hydra.sweeper.params"), "no cells"]),
    ("unknown_axis_key", _AXES + "      trainer.lrr: 1,2\n", [_key("trainer.lrr")]),
    ("unknown_top_level_key", _HEAD + "trainerr:\n  total_steps: 2\n", ["trainerr", "sweeps/{name}"]),
    ("misspelt_hydra_key", _HEAD + "hydra:\n  sweeperr:\n    params:\n      seed: 0,1\n", ["sweeperr"]),
    ("string_for_int_in_file", _HEAD + "trainer:\n  total_steps: many\n", ["trainer.total_steps", "many"]),
    ("unknown_option_in_axis", _AXES + "      +method: grpo,nope\n", ["config group 'method'", "'nope'"]),
    ("one_bad_cell", _AXES + "      trainer.n: 4,0\n", [_key("trainer.n"), "(in cell: trainer.n=0)"]),
]


@pytest.mark.parametrize(("case", "content", "words"), SWEEP_FILES, ids=[s[0] for s in SWEEP_FILES])
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry_run", "launch"])
def test_a_bad_sweep_file_is_one_line_naming_the_file_or_key(home, tmp_path, capsys, case, content, words, dry_run):
    name = f"zz_sweep_{uuid.uuid4().hex[:8]}"
    path = SWEEPS_DIR / f"{name}.yaml"
    path.write_text(content)
    try:
        code, err = _outcome(capsys, "sweep", name, *(["--dry-run"] if dry_run else []), "trainer.total_steps=1")
    finally:
        path.unlink()
    words = [w.replace("{path}", str(path)).replace("{name}", name) for w in words]
    _assert_one_line(code, err, ["configuration error", *words])
    _assert_nothing_created(home, tmp_path)


# -- the other commands: (case, arguments, words, whether argparse refuses it) ----------------------------
COMMAND_MISTAKES = [
    ("sweep_unknown_name", ["sweep", "nope", "--dry-run"], [_key("sweep"), "unknown sweep 'nope'", "demo"], False),
    ("sweep_name_a_path", ["sweep", "../conf/config", "--dry-run"], [_key("sweep"), "../conf/config"], False),
    ("sweep_unknown_flag", ["sweep", "demo", "--dry-run", "--nope"], ["--nope"], True),
    ("sweep_bad_axis_value", ["sweep", "demo", "--dry-run", "seed=a,b"], [_key("seed"), "'a'"], False),
    ("sweep_empty_axis", ["sweep", "demo", "--dry-run", "seed=range(0,0)"], ["no cells"], False),
    ("sweep_unknown_key", ["sweep", "demo", "--dry-run", "trainer.lrr=1"], [_key("trainer.lrr")], False),
    (
        "sweep_tracking_scheme",
        ["sweep", "demo", "tracking.uri=nope://x"],
        [_key("tracking.uri"), "unsupported scheme 'nope'"],
        False,
    ),
    (
        "sweep_tracking_server_down",
        ["sweep", "demo", "--dry-run", "tracking.uri=http://127.0.0.1:{port}"],
        [_key("tracking.uri"), "no MLflow server answers"],
        False,
    ),
    (
        "report_tracking_scheme",
        ["report", "x", "--no-pdf", "--no-mlflow", "--tracking-uri", "nope://x"],
        ["unsupported scheme 'nope'", "--tracking-uri"],
        False,
    ),
    (
        "report_tracking_file_store",
        ["report", "x", "--no-pdf", "--no-mlflow", "--tracking-uri", "{tmp}/mlruns"],
        ["file store", "--tracking-uri"],
        False,
    ),
    (
        "report_tracking_server_down",
        ["report", "x", "--no-pdf", "--no-mlflow", "--tracking-uri", "http://127.0.0.1:{port}"],
        ["no MLflow server answers at http://127.0.0.1:", "--tracking-uri"],
        False,
    ),
    ("report_unknown_renderer", ["report", "x", "--pdf-renderer", "nope"], ["--pdf-renderer", "'nope'"], True),
    ("report_conflicting_flags", ["report", "x", "--offline", "--full-refresh"], ["--full-refresh", "--offline"], True),
    ("report_without_experiment", ["report", "--no-pdf"], ["experiment"], True),
    ("bounds_zero_length", ["bounds", "--T", "0", "--delta", "1e-4"], ["--T", ">= 1"], False),
    ("bounds_string_length", ["bounds", "--T", "abc", "--delta", "1e-4"], ["--T", "'abc'"], True),
    ("bounds_missing_length", ["bounds", "--delta", "1e-4"], ["--T"], True),
    ("bounds_negative_divergence", ["bounds", "--T", "8", "--delta", "-1"], ["delta", "-1"], False),
    ("bounds_nan_divergence", ["bounds", "--T", "8", "--delta", "nan"], ["delta", "nan"], False),
    ("bounds_negative_sequence_kl", ["bounds", "--T", "8", "--delta", "1e-4", "--d-seq", "-1"], ["d_seq"], False),
    (
        "bounds_plot_in_missing_directory",
        ["bounds", "--T", "8", "--delta", "1e-4", "--out", "{tmp}/nope/bounds.svg"],
        ["--out", "does not exist"],
        False,
    ),
    (
        "bounds_plot_unknown_format",
        ["bounds", "--T", "8", "--delta", "1e-4", "--out", "bounds.txt"],
        ["--out bounds.txt", ".svg"],
        False,
    ),
    (
        "bounds_plot_range_negative",
        ["bounds", "--T", "8", "--delta", "1e-4", "--out", "bounds.svg", "--t-max", "-3"],
        ["--t-max", "-3"],
        False,
    ),
    ("ui_port_out_of_range", ["ui", "--port", "70000"], ["--port", "70000"], False),
    ("ui_port_not_a_number", ["ui", "--port", "abc"], ["--port", "'abc'"], True),
    (
        "ui_tracking_scheme",
        ["ui", "--tracking-uri", "nope://x"],
        ["unsupported scheme 'nope'", "--tracking-uri"],
        False,
    ),
    ("ui_tracking_directory", ["ui", "--tracking-uri", "{tmp}"], ["file store", "--tracking-uri"], False),
    ("list_unknown_group", ["list", "nope"], ["unknown group 'nope'", "algorithm"], False),
    ("list_two_groups", ["list", "algorithm", "model"], ["unrecognized arguments: model"], True),
    ("unknown_command", ["nope"], ["invalid choice: 'nope'", "run"], True),
]


@pytest.mark.parametrize(
    ("case", "args", "words", "argparse_error"), COMMAND_MISTAKES, ids=[m[0] for m in COMMAND_MISTAKES]
)
def test_a_command_mistake_is_one_line_exit_2_and_nothing_created(
    home, tmp_path, capsys, case, args, words, argparse_error
):
    port = str(free_port())
    args = [a.replace("{tmp}", str(tmp_path)).replace("{port}", port) for a in args]
    code, err = _outcome(capsys, *args)
    _assert_one_line(code, err, words, argparse_error=argparse_error)
    _assert_nothing_created(home, tmp_path)
