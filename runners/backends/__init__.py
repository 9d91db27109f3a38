"""Backends: what trains one cell. ``BACKENDS[name]`` is a class ``(cfg, tracker, run_dir, label)``
with ``train() -> final metrics`` and ``discard_checkpoints(run_dir)``.

- ``local``: the built-in PyTorch trainer (``runners.backends.local``), CPU or one GPU;
- ``verl``: verl 0.9.1 on Ray (``runners.backends.verl``), GPU clusters (and its CPU mode).

Both call the same policy-update path (``runners.algorithms.policy_loss.PolicyLoss``); what they
share beyond it (stop requests, the pause of a debug step) is in ``runners.backends.base``. The two
backends never import each other (``tests/test_layering.py``). Importing this package imports
neither torch nor verl.
"""

from runners.algorithms.registry import Registry

BACKENDS = Registry("backend")
BACKENDS.register("local", "runners.backends.local.trainer:LocalTrainer")
BACKENDS.register("verl", "runners.backends.verl.backend:VerlBackend")

__all__ = ["BACKENDS"]
