"""What runs inside verl's processes: the trustbench plugins and the trainer's diagnostics.

``register`` is the module verl imports in every process (``VERL_USE_EXTERNAL_MODULES``): importing it
registers the policy losses (``losses``, ``ppo_loss``), the advantage estimators (``advantages``) and the
trainer (``trainer``, with ``workers``, ``sparse_old``, ``controllers``, ``trainer_diagnostics``,
``monitor``, ``roofline``, ``batch_dump``); ``config`` carries the method's parameters in verl's actor
config. This package's ``__init__`` imports nothing, so the driver side can read the constants of
``monitor`` and ``batch_dump`` without loading verl or torch.
"""
