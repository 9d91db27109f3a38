"""Backends: what trains one cell. ``BACKENDS[name]`` is a class ``(cfg, tracker, run_dir, label)``
with ``train() -> final metrics`` and ``discard_checkpoints(run_dir)``.

- ``local``: the built-in PyTorch trainer (``runners.backends.local``), CPU or one GPU;
- ``verl``: verl 0.9.1 on Ray (``runners.backends.verl``), GPU clusters (and its CPU mode); the
  commands ``trustbench verl ...`` (a cell's verl overrides, its Slurm batch script:
  ``runners.cluster.verl_batch``) reach it through the entry's ``overrides`` and ``options`` hooks.

Both call the same policy-update path (``runners.algorithms.policy_loss.PolicyLoss``); what they
share beyond it (stop requests, the pause of a debug step) is in ``runners.backends.base``. The two
backends never import each other (``tests/test_layering.py``). Importing this package imports
neither torch nor verl.
"""

from runners.registry import Registry

BACKENDS = Registry("backend")
BACKENDS.register("local", "runners.backends.local.trainer:LocalTrainer")
# hooks of ``trustbench verl ...`` (runners/cluster/verl_batch.py): "overrides", what verl's trainer gets for a
# cell; "options", the cell's ``backend.options`` checked (the batch script's stop grace reads stop_timeout_s)
BACKENDS.register(
    "verl",
    "runners.backends.verl.backend:VerlBackend",
    hooks={
        "overrides": "runners.backends.verl.backend:cell_overrides",
        "options": "runners.backends.verl.translate:backend_options",
    },
)

# per backend, a torch-free check that a cell can run where it is launched (``check_placement``)
PLACEMENT_CHECKS = Registry("backend placement check")
PLACEMENT_CHECKS.register("verl", "runners.backends.verl.cpu.mode:check_placement")


def check_placement(cfg) -> None:
    """Raise ``ConfigError`` naming the key if this machine cannot run the cell (e.g. a 7B verl cell
    without CUDA). Called where a cell is launched here: ``trustbench run``, the launch of a sweep's
    cells, and ``runners.run.run`` itself; not by ``compose`` (a config composed on a
    login node may be meant for the cluster)."""
    name = str(cfg.backend.name)
    if name in PLACEMENT_CHECKS:
        PLACEMENT_CHECKS.get(name)(cfg)


__all__ = ["BACKENDS", "PLACEMENT_CHECKS", "check_placement"]
