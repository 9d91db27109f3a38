"""Per-iteration controllers on the driver and the trainer/worker hooks that carry them (no Ray, no GPU).

- ``IterationControl`` gives the same coefficient trajectory as the built-in trainer's controller fed
  the token-mean entropy of each batch (REPO-R, REPO-D, ADAPO, adaptive bonus), survives a JSON
  checkpoint mid-run, and sets GTPO's H_ini once from the first batch's first prompt groups;
- the state it attaches to a batch rebuilds, in a worker's loss, a controller that transforms
  advantages, overrides clip ranges and adds the entropy term exactly as the driver's;
- ``TrustbenchPPOTrainer``'s overrides (verl's methods replaced by recording fakes) flag only the
  calls that need it, remove the flags afterwards, feed the controllers, move method metrics out
  of verl's ``actor/`` prefix, select the trustbench worker and checkpoint the controller state;
- ``TrustbenchActorRolloutRefWorker.init_model`` swaps verl's ``ppo_loss`` for ``trustbench_ppo_loss``
  with the same ``ActorConfig``.

Run: ``pytest tests/verl/test_plugins_controllers.py``.
"""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from runners.algorithms import ENTROPY_CONTROLLERS
from runners.algorithms.gtpo import compute_initial_entropy

pytestmark = pytest.mark.verl
pytest.importorskip("verl")

CONTROLS = {
    "repo_r": {"zeta0": 0.001},
    "repo_d": {"zeta0": 0.01},
    "adapo": {},
    "bonus": {"beta0": 0.01},
}


def _settings(objective="clip", control="none", params=None, **policy):
    from runners.backends.verl import loss_mode_for
    from runners.backends.verl.plugins.config import loss_settings

    return loss_settings(
        {
            "loss_mode": loss_mode_for(objective),
            "entropy_control": control,
            "entropy_control_params": params or {},
            **policy,
        }
    )


def _batches(n: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    for step in range(n):
        entropy = torch.rand(6, 5, generator=gen) * (1.5 + 0.3 * torch.sin(torch.tensor(step)))
        lengths = torch.randint(1, 6, (6,), generator=gen)
        mask = (torch.arange(5)[None] < lengths[:, None]).float()
        yield entropy, mask


@pytest.mark.parametrize("control", sorted(CONTROLS))
def test_trajectory_equals_built_in_controller_and_survives_checkpoint(control, tmp_path):
    from runners.backends.verl.plugins.controllers import IterationControl

    params = CONTROLS[control]
    ref = ENTROPY_CONTROLLERS.get(control)(**params)
    ours = IterationControl(_settings(control=control, params=params))
    values = []
    for step, (entropy, mask) in enumerate(_batches(12)):
        expected = ref.update(float((entropy * mask).sum() / mask.sum()))  # LocalTrainer: masked token mean
        got = ours.observe(entropy, mask)
        assert got == pytest.approx(expected), step
        values.append(ref.state_dict())
        if step == 5:  # checkpoint, restart from the file
            ours.save(str(tmp_path))
            ours = IterationControl(_settings(control=control, params=params))
            assert ours.load(str(tmp_path))
    assert len({str(v) for v in values}) > 2  # the coefficient moved in both directions at least once
    assert not IterationControl(_settings(control=control, params=params)).load(str(tmp_path / "missing"))


@pytest.mark.parametrize("control", sorted(CONTROLS))
def test_runtime_rebuilds_the_same_controller_in_the_loss(control):
    from runners.backends.verl.plugins.controllers import IterationControl
    from runners.backends.verl.plugins.losses import build_controller

    settings = _settings(control=control, params=CONTROLS[control])
    driver = IterationControl(settings)
    for entropy, mask in _batches(4, seed=1):
        driver.observe(entropy, mask)
    worker = build_controller(settings, driver.runtime())
    gen = torch.Generator().manual_seed(2)
    adv, logp = torch.randn(4, 5, generator=gen), -torch.rand(4, 5, generator=gen)
    mask = torch.ones(4, 5)
    entropy = torch.rand(4, 5, generator=gen)
    assert torch.equal(
        worker.transform_advantages(adv, logp, mask), driver.controller.transform_advantages(adv, logp, mask)
    )
    assert worker.objective_overrides() == driver.controller.objective_overrides()
    term, ref_term = worker.loss_term(entropy), driver.controller.loss_term(entropy)
    assert (term is None and ref_term is None) or torch.equal(term, ref_term)
    assert (
        worker.state_dict()
        == driver.controller.state_dict()
        != ENTROPY_CONTROLLERS.get(control)(**CONTROLS[control]).state_dict()
    )


def test_gtpo_h_ini_from_first_prompt_groups_only():
    from runners.backends.verl.plugins.controllers import IterationControl

    control = IterationControl(_settings("gtpo", objective_params={"h_ini_prompts": 2}))
    assert control.active and control.h_ini is None
    gen = torch.Generator().manual_seed(3)
    entropy, mask = torch.rand(8, 4, generator=gen), torch.ones(8, 4)
    uids = ["p2", "p2", "p0", "p0", "p1", "p1", "p2", "p0"]  # first two groups in batch order: p2, p0
    control.observe(entropy, mask, uids)
    rows = [0, 1, 2, 3, 6, 7]
    assert control.h_ini == pytest.approx(compute_initial_entropy(entropy[rows], mask[rows]))
    first = control.h_ini
    control.observe(entropy * 3, mask, uids)
    assert control.h_ini == first and control.runtime()["h_ini"] == first
    assert not IterationControl(_settings("clip")).active


# -- trainer hooks -----------------------------------------------------------------------------------
class _Meta(SimpleNamespace):
    """What the hooks use of verl's KVBatchMeta."""

    def __len__(self) -> int:
        return len(self.keys)


def _meta(n=4):
    return _Meta(keys=[f"k{i}" for i in range(n)], partition_id="train", tags=[{} for _ in range(n)], extra_info={})


def _trainer(monkeypatch, policy_loss: dict, **cfg):
    trainer_mod = pytest.importorskip("runners.backends.verl.plugins.trainer")
    from runners.backends.verl.plugins.config import is_trustbench_loss, loss_settings
    from runners.backends.verl.plugins.controllers import IterationControl

    trainer = object.__new__(trainer_mod.TrustbenchPPOTrainer)
    trainer.config = OmegaConf.create(
        {
            "actor_rollout_ref": {"actor": {"policy_loss": policy_loss, "calculate_entropy": True}},
            "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False, "rollout_correction": {}},
            # verl's config always carries trainer.v1 (its trainer mode and the trustbench settings under it)
            "trainer": {
                "default_local_dir": "ckpt",
                "resume_mode": "auto",
                "resume_from_path": None,
                "critic_warmup": 0,
                "v1": {"trainer_mode": "trustbench_sync"},
            },
            **cfg,
        }
    )
    trainer.trustbench = loss_settings(policy_loss) if is_trustbench_loss(policy_loss) else None
    trainer.control = IterationControl(trainer.trustbench) if trainer.trustbench else None
    trainer.global_steps = 0
    return trainer_mod, trainer


def test_trainer_hooks_flag_feed_and_clean_up(monkeypatch):
    from tensordict import TensorDict

    from runners.backends.verl.plugins.losses import RUNTIME_KEY
    from runners.backends.verl.plugins.sparse_old import KEEP_LOGITS_KEY, SPARSIFY_KEY

    policy_loss = {
        "loss_mode": "trustbench_troll",
        "objective_params": {"top_k": 16, "chunk_size": 128},
        "entropy_control": "repo_r",
        "entropy_control_params": {},
    }
    trainer_mod, trainer = _trainer(monkeypatch, policy_loss)
    seen = {}

    def old_pass(self, batch, metrics):
        seen["old"] = dict(batch.extra_info)
        metrics["actor/entropy"] = 0.0
        return batch

    def update(self, batch, metrics):
        seen["update"] = dict(batch.extra_info)
        metrics.update({"actor/troll/projected_frac": 0.2, "actor/pg_loss": 1.0, "actor/trm/accept_rate": 0.5})
        return batch

    entropy = torch.nested.as_nested_tensor([torch.full((3,), 1.0), torch.full((2,), 2.0)], layout=torch.jagged)
    mask = torch.nested.as_nested_tensor([torch.ones(3), torch.ones(2)], layout=torch.jagged)
    data = TensorDict({"entropy": entropy, "response_mask": mask}, batch_size=[2])
    data["uid"] = ["a", "b"]  # stored as a NonTensorStack, as the TransferQueue returns it
    fake_tq = SimpleNamespace(kv_batch_get=lambda keys, partition_id, select_fields: data)
    monkeypatch.setattr(trainer_mod, "tq", fake_tq)
    monkeypatch.setattr(trainer_mod.PPOTrainerSync, "_compute_old_log_prob", old_pass)
    monkeypatch.setattr(trainer_mod.PPOTrainerSync, "_update_actor", update)

    batch, metrics = _meta(2), {}
    trainer._compute_old_log_prob(batch, metrics)
    assert seen["old"][SPARSIFY_KEY] == {"k": 16, "delta": 1e-5, "p_default": 1e-12, "chunk_size": 128}
    assert SPARSIFY_KEY not in batch.extra_info
    assert metrics["entropy/target"] == pytest.approx(7.0 / 5.0)  # token mean of the stored entropy
    assert "entropy/zeta" in metrics
    trainer._update_actor(batch, metrics)
    assert seen["update"][KEEP_LOGITS_KEY] is True
    assert seen["update"][RUNTIME_KEY] == trainer.control.runtime()
    assert KEEP_LOGITS_KEY not in batch.extra_info and RUNTIME_KEY not in batch.extra_info
    assert metrics["troll/projected_frac"] == 0.2 and metrics["trm/accept_rate"] == 0.5
    assert metrics["actor/pg_loss"] == 1.0 and "actor/troll/projected_frac" not in metrics

    # a verl loss: no flags, no controller
    trainer_mod, plain = _trainer(monkeypatch, {"loss_mode": "vanilla"})
    seen.clear()
    plain._compute_old_log_prob(_meta(2), {})
    plain._update_actor(_meta(2), {})
    assert SPARSIFY_KEY not in seen["old"] and seen["update"] == {}


def test_trainer_selects_worker_and_checkpoints_controller_state(monkeypatch, tmp_path):
    from verl.trainer.ppo.utils import Role

    from runners.backends.verl.plugins.controllers import STATE_FILE

    policy_loss = {"loss_mode": "trustbench_clip", "entropy_control": "adapo"}
    trainer_mod, trainer = _trainer(monkeypatch, policy_loss)
    assert trainer.trainer_mode == "sync"
    trainer.trainer_mode = "trustbench_sync"  # what verl's __init__ does: still "sync"
    assert trainer.trainer_mode == "sync"

    def mapping(self):
        self.role_worker_mapping = {Role.ActorRollout: "verl-worker", Role.Critic: "critic-worker"}

    monkeypatch.setattr(trainer_mod.PPOTrainerSync, "_init_resource_pool_mgr", mapping)
    trainer._init_resource_pool_mgr()
    actor = trainer.role_worker_mapping[Role.ActorRollout]
    assert actor.__ray_actor_class__ is trainer_mod.TrustbenchActorRolloutRefWorker
    assert trainer.role_worker_mapping[Role.Critic] == "critic-worker"

    trainer.config.trainer.default_local_dir = str(tmp_path)
    trainer.global_steps = 7
    trainer.control.observe(torch.ones(2, 3), torch.ones(2, 3))
    trainer.control.observe(torch.full((2, 3), 0.5), torch.ones(2, 3))
    saved = trainer.control.state_dict()
    monkeypatch.setattr(trainer_mod.PPOTrainerSync, "_save_checkpoint", lambda self: None)
    monkeypatch.setattr(trainer_mod.PPOTrainerSync, "_load_checkpoint", lambda self: None)
    trainer._save_checkpoint()
    assert (tmp_path / "global_step_7" / STATE_FILE).exists()
    _, fresh = _trainer(monkeypatch, policy_loss)
    fresh.config.trainer.default_local_dir = str(tmp_path)
    fresh.global_steps = 7
    fresh._load_checkpoint()
    assert fresh.control.state_dict() == saved and saved["entropy_control"]["eps_high"] > 0.28


def test_step_end_honours_the_backend_stop_file(monkeypatch, tmp_path):
    """After verl's step end, a stop file (the trustbench backend's protocol) checkpoints the step,
    controller state included, and makes it the last; without the file nothing happens."""
    backend = pytest.importorskip("runners.backends.verl.checkpoints")
    from runners.backends.verl.plugins.controllers import STATE_FILE

    trainer_mod, trainer = _trainer(monkeypatch, {"loss_mode": "trustbench_clip", "entropy_control": "repo_r"})
    trainer.config.trainer.default_local_dir = str(tmp_path)
    trainer.config.trainer.save_freq = 0
    trainer.global_steps, trainer.total_training_steps = 3, 10
    calls = []
    monkeypatch.setattr(trainer_mod.PPOTrainerSync, "on_step_end", lambda self: calls.append("sync"))
    monkeypatch.setattr(trainer_mod.PPOTrainerSync, "_save_checkpoint", lambda self: calls.append("save"))
    stop = tmp_path / "STOP"
    monkeypatch.setenv(backend.STOP_FILE_ENV, str(stop))
    trainer.on_step_end()
    assert calls == ["sync"] and trainer.total_training_steps == 10
    stop.write_text("")
    trainer.on_step_end()
    assert calls == ["sync", "sync", "save"] and trainer.total_training_steps == 3
    assert (tmp_path / "global_step_3" / STATE_FILE).exists()
    assert (tmp_path / ("STOP" + backend.STOPPED_SUFFIX)).read_text() == "3"


def test_no_checkpoint_once_a_metric_is_not_finite(monkeypatch, tmp_path):
    """verl's loop checkpoints a step before it logs its metrics, so the trustbench backend (which fails
    the run on a logged NaN) would find the NaN step's checkpoint written and resume from it. The hook
    refuses the checkpoint of a step whose iteration metrics hold a NaN or infinity, and every later one
    (their weights descend from it); verl's diagnostics that read NaN when unused do not count."""
    import inspect
    import math

    trainer_mod, trainer = _trainer(monkeypatch, {"loss_mode": "trustbench_clip", "entropy_control": "repo_r"})
    fit = inspect.getsource(trainer_mod.trainer_base.PPOTrainer.fit)
    assert fit.index("self._save_checkpoint()") < fit.index("self.logger.log(data=metrics")  # why the hook exists
    trainer.config.trainer.default_local_dir = str(tmp_path)
    trainer.config.trainer.critic_warmup = 0
    steps = {
        1: {"actor/pg_loss": 0.5, "variance_proxy/proxy1_signal_strength": math.nan},
        2: {"actor/pg_loss": 0.4, "actor/grad_norm": math.inf},
        3: {"actor/pg_loss": 0.3},
    }
    saved = []

    def step_once(self, metrics, timing_raw, sample_batch_size):
        metrics.update(steps[self.global_steps])
        return _meta(2)

    monkeypatch.setattr(trainer_mod.PPOTrainerSync, "_step_once", step_once)
    monkeypatch.setattr(trainer_mod.PPOTrainerSync, "_save_checkpoint", lambda self: saved.append(self.global_steps))
    for step in steps:  # verl's order: the step, then its checkpoint, then its metrics are logged
        trainer.global_steps = step
        trainer._step_once({}, {}, 2)
        trainer._save_checkpoint()
    assert saved == [1]
    assert trainer_mod.non_finite(steps[2], 2) == "metric 'actor/grad_norm' is inf at step 2"
    assert trainer_mod.non_finite(steps[1], 1) is None


def test_trainer_rejects_configs_it_cannot_serve(monkeypatch):
    trainer_mod, trainer = _trainer(
        monkeypatch,
        {"loss_mode": "trustbench_troll"},
        algorithm={"adv_estimator": "grpo", "use_kl_in_reward": False, "rollout_correction": {"bypass_mode": True}},
    )
    trainer.use_critic = False
    with pytest.raises(ValueError, match="bypass_mode=true"):
        trainer._check_trustbench_config()
    _, trainer = _trainer(monkeypatch, {"loss_mode": "trustbench_gtpo"})
    trainer.config.actor_rollout_ref.actor.calculate_entropy = False
    trainer.use_critic = False
    with pytest.raises(ValueError, match="calculate_entropy=true"):
        trainer._check_trustbench_config()
    _, trainer = _trainer(monkeypatch, {"loss_mode": "vanilla"})
    trainer.config.algorithm.adv_estimator = "trustbench_egae"
    trainer.use_critic = False
    with pytest.raises(ValueError, match="critic.enable=true"):
        trainer._check_trustbench_config()


def test_worker_init_model_installs_trustbench_loss(monkeypatch):
    workers = pytest.importorskip("runners.backends.verl.plugins.workers")
    from verl.workers.config.actor import ActorConfig
    from verl.workers.utils.losses import ppo_loss

    from runners.backends.verl.plugins.ppo_loss import trustbench_ppo_loss

    config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1)
    installed = []

    def base_init(self):
        self.actor = SimpleNamespace(set_loss_fn=installed.append)
        self.loss_fn = partial(ppo_loss, config=config)

    monkeypatch.setattr(workers.ActorRolloutRefWorker, "init_model", base_init)
    worker = object.__new__(workers.TrustbenchActorRolloutRefWorker)
    worker.init_model()
    assert worker.loss_fn.func is trustbench_ppo_loss and worker.loss_fn.keywords["config"] is config
    assert installed == [worker.loss_fn]
    assert workers.TrustbenchActorRolloutRefWorker.actor_worker_cls is workers.TrustbenchTrainingWorker


def test_value_estimators_apply_verls_rollout_correction(monkeypatch):
    """trustbench_gae / trustbench_egae replace verl's advantage step, so they must keep its rollout
    correction: token TIS weights min(exp(old - rollout), cap) on valid tokens (computed here densely),
    verl's ``rollout_corr/*`` metrics, and the same advantages as without the correction."""
    from tensordict import TensorDict

    algorithm = {
        "adv_estimator": "trustbench_gae",
        "use_kl_in_reward": False,
        "gamma": 1.0,
        "lam": 0.95,
        "trustbench_estimator": {"gamma": 1.0, "lam": 0.95, "whiten": False},
        "rollout_correction": {"rollout_is": "token", "rollout_is_threshold": 1.5, "bypass_mode": False},
    }
    trainer_mod, trainer = _trainer(monkeypatch, {"loss_mode": "vanilla"}, algorithm=algorithm)
    lengths = [3, 2, 4]
    gen = torch.Generator().manual_seed(0)

    def jagged(values):
        return torch.nested.as_nested_tensor(values, layout=torch.jagged)

    old = [torch.randn(n, generator=gen) * 0.5 - 1 for n in lengths]
    rollout = [o + torch.randn(n, generator=gen) * 0.5 for o, n in zip(old, lengths)]
    data = TensorDict(
        {
            "response_mask": jagged([torch.ones(n, dtype=torch.int64) for n in lengths]),
            "rm_scores": jagged([torch.eye(n)[-1] * (i + 1) for i, n in enumerate(lengths)]),
            "values": jagged([torch.randn(n, generator=gen) for n in lengths]),
            "old_log_probs": jagged(old),
            "rollout_log_probs": jagged(rollout),
        },
        batch_size=[3],
    )
    data["uid"] = ["a", "b", "c"]
    put = {}

    def kv_batch_get(keys, partition_id, select_fields):
        put["selected"] = list(select_fields)
        return data.select(*[f for f in select_fields if f != "uid"]).update({"uid": data["uid"]})

    def kv_batch_put(keys, partition_id, fields):
        put.update(fields=fields)
        return "meta"

    monkeypatch.setattr(trainer_mod, "tq", SimpleNamespace(kv_batch_get=kv_batch_get, kv_batch_put=kv_batch_put))
    meta = _meta(3)
    meta.fields = ["uid", "response_mask", "rm_scores", "values", "old_log_probs", "rollout_log_probs"]
    metrics = {}
    assert trainer._compute_value_advantage(meta, metrics) == "meta"
    assert "rollout_log_probs" in put["selected"]
    weights = put["fields"]["rollout_is_weights"]
    for row, (o, r) in enumerate(zip(old, rollout)):
        expected = torch.exp(o - r).clamp(max=1.5)
        torch.testing.assert_close(weights[row].float(), expected, rtol=1e-5, atol=1e-6)
    assert put["fields"]["response_mask"].dtype == torch.int64
    assert {"rollout_corr/kl", "rollout_corr/rollout_is_mean"} <= set(metrics)
    with_correction = [a.clone() for a in put["fields"]["advantages"].unbind()]

    # without a rollout_log_probs field: no correction, no metrics, the same advantages
    meta.fields = ["uid", "response_mask", "rm_scores", "values"]
    metrics.clear()
    trainer._compute_value_advantage(meta, metrics)
    assert "rollout_is_weights" not in put["fields"].keys() and not metrics
    for a, b in zip(with_correction, put["fields"]["advantages"].unbind()):
        torch.testing.assert_close(a, b)
