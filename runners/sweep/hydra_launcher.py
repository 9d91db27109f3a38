"""The configured Hydra launcher of a sweep, bound to the trainer's task (``runners.main.task``).

Shared by the serial and submitit paths (``runners.sweep.launching``) and by each child process of
``launcher.parallel=N`` (``runners.sweep.local_pool``), so every cell is launched the same way.
"""

from __future__ import annotations

from omegaconf import DictConfig


def instantiate_launcher(hydra, master: DictConfig):
    """Hydra's launcher plugin for ``master`` (``hydra.launcher``), with ``hydra``'s config loader."""
    from hydra._internal.callbacks import Callbacks
    from hydra.core.plugins import Plugins
    from hydra.types import HydraContext

    from runners.main import task

    return Plugins.instance().instantiate_launcher(
        hydra_context=HydraContext(config_loader=hydra.config_loader, callbacks=Callbacks(master)),
        task_function=task,
        config=master,
    )
