"""verl's entry point in CPU mode: ``verl.trainer.main_ppo`` with its TaskRunner run in the driver process.

Design: ``main_ppo.main`` composes verl's config, validates it and calls ``run_ppo``, which joins (or
starts) Ray and runs ``TaskRunnerV1.run(config)`` in a Ray actor of its own while the driver waits
in ``ray.get``. On a GPU cluster that actor puts the controller on a node of Ray's choosing; on one
CPU machine it is only one more process, and every verl process starts by importing torch,
transformers, tensordict and verl: about 15 s of CPU each on the 2 cores of this project's machines,
on the critical path of every launch (the driver imports, then the TaskRunner imports, then the
workers start). Here ``run_ppo`` gets an in-driver stand-in for the actor class: ``.remote()``
builds the runner in this process and ``run.remote(config)`` runs it here, returning a finished
object reference for ``run_ppo``'s ``ray.get``. Everything else is verl's own ``main``: the same
config, validation, Ray start, runner code, trainer and workers.

The backend uses it where the cell runs in verl's CPU mode and ``backend.options.entrypoint`` is
``auto`` (the default); ``backend.options.entrypoint=verl.trainer.main_ppo`` keeps verl's actor.

    VERL_USE_EXTERNAL_MODULES=... python -m runners.backends.verl.cpu.driver_entry <verl overrides>

Tests: ``pytest tests/verl/test_driver_entry.py``; the ``verl_cpu`` stage launches every cell with it.
"""

from __future__ import annotations

from typing import Any


class InDriver:
    """Stands in for a Ray actor class in ``run_ppo``: the instance lives in this process."""

    def __init__(self, actor_class: Any) -> None:
        meta = getattr(actor_class, "__ray_metadata__", None)
        # the plain class behind ``@ray.remote`` (a plain class is taken as it is)
        self.cls = meta.modified_class if meta is not None else actor_class

    def options(self, **_: Any) -> InDriver:
        return self

    def remote(self, *args: Any, **kwargs: Any) -> InDriverHandle:
        return InDriverHandle(self.cls(*args, **kwargs))


class InDriverHandle:
    """``handle.method.remote(...)`` calls ``method`` here and returns a finished object reference."""

    def __init__(self, instance: Any) -> None:
        self._instance = instance

    def __getattr__(self, name: str) -> InDriverMethod:
        return InDriverMethod(getattr(self._instance, name))


class InDriverMethod:
    def __init__(self, method: Any) -> None:
        self.method = method

    def remote(self, *args: Any, **kwargs: Any):
        import ray

        return ray.put(self.method(*args, **kwargs))


def main() -> None:
    from verl.trainer import main_ppo

    # main() reads the module global at call time (the v1 runner: the trustbench trainer is a v1 trainer)
    main_ppo.TaskRunnerV1 = InDriver(main_ppo.TaskRunnerV1)
    main_ppo.main()


if __name__ == "__main__":
    main()
