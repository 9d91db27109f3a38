"""CPU mode's verl entry point (``runners.backends.verl.cpu.driver_entry``): verl's main with its TaskRunner
in the driver process, checked against verl 0.9.1's own ``main_ppo``.

- the launch command picks it in CPU mode only, and an explicit ``backend.options.entrypoint`` wins;
- verl's ``run_ppo``, given the in-driver stand-in, runs the runner class's ``run(config)`` in this
  process (same pid) with verl's composed config and gets a reference ``ray.get`` resolves;
- verl's ``main`` reads ``TaskRunnerV1`` as a module global when called (what the entry point
  replaces): a verl release that imports it locally would silently bring the actor back.

The stage (``tests/verl/test_cpu_stage.py``) runs every cell through it, with real Ray.
"""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.verl

verl = pytest.importorskip("verl")


@pytest.fixture
def cell(tmp_path, monkeypatch):
    from runners.config import compose

    monkeypatch.setenv("TRUSTBENCH_HOME", str(tmp_path))

    def make(*overrides):
        cfg, _ = compose(["backend=verl", *overrides])
        return cfg

    return make


def test_entry_command_by_mode(cell):
    from runners.backends.verl.process import launch_argv
    from runners.backends.verl.translate import CPU_ENTRYPOINT, ENTRYPOINT

    cfg = cell()
    assert launch_argv(cfg, ["a=1"], in_slurm=False, cpu=True, python="/py") == ["/py", "-m", CPU_ENTRYPOINT, "a=1"]
    assert launch_argv(cfg, ["a=1"], in_slurm=False, cpu=False, python="/py") == ["/py", "-m", ENTRYPOINT, "a=1"]
    pinned = cell(f"backend.options.entrypoint={ENTRYPOINT}")
    assert launch_argv(pinned, [], in_slurm=False, cpu=True, python="/py") == ["/py", "-m", ENTRYPOINT]
    script = cell("backend.options.entrypoint=/opt/my_main.py")
    assert launch_argv(script, [], in_slurm=False, cpu=True, python="/py") == ["/py", "/opt/my_main.py"]


def test_run_ppo_runs_the_runner_in_this_process(monkeypatch):
    """verl's own ``run_ppo`` with ``InDriver``: the runner is built and run here, on verl's config."""
    import ray
    from verl.trainer import main_ppo

    from runners.backends.verl.cpu.driver_entry import InDriver
    from tests.verl._verl_config import make_verl_config

    calls = []

    @ray.remote(num_cpus=1)
    class Runner:
        def run(self, config):
            calls.append((os.getpid(), config))
            return "done"

    refs = []
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(ray, "is_initialized", lambda: True)  # run_ppo skips ray.init
    monkeypatch.setattr(ray, "put", lambda value: refs.append(value) or ("ref", value))
    monkeypatch.setattr(ray, "get", lambda ref: ref[1])
    config = make_verl_config()([])
    main_ppo.run_ppo(config, task_runner_class=InDriver(Runner))
    assert calls == [(os.getpid(), config)]
    assert refs == ["done"]


def test_verl_main_reads_the_runner_global():
    from verl.trainer import main_ppo

    names = main_ppo.main.__wrapped__.__code__.co_names
    assert "TaskRunnerV1" in names and "run_ppo" in names
    assert hasattr(main_ppo.TaskRunnerV1, "__ray_metadata__")
