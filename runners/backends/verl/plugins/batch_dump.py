"""Save every actor micro-batch verl trains on, with what verl computed from it (``TRUSTBENCH_VERL_DUMP_DIR``).

Design: the cross-backend check (``tests/verl/test_cpu_cross_backend.py``) recomputes the loss and
gradient norm of a verl update with the built-in backend's loss path, on the very tensors verl
used. verl's rollout-data dump (``trainer.rollout_data_dir``) writes decoded text, not the training
tensors, so the actor's loss function (``plugins_ppo_loss.trustbench_ppo_loss``, installed for every
loss mode) hands each micro-batch to ``dump_micro_batch`` when the environment variable is set in
the worker (the backend forwards it to Ray's workers). One file per micro-batch,
``<dir>/update_<pid>_<n>.pt``, holds:

- ``fields``: every tensor of verl's micro-batch (nested tensors as lists of per-sequence tensors):
  ``prompts``, ``responses``, ``response_mask``, ``old_log_probs``, ``advantages``, ``uid``,
  ``rollout_log_probs``, ``old_topk_index`` / ``old_topk_logp`` when the loss needs them, ...;
- ``meta``: the micro-batch's non-tensor entries verl's loss reads (``temperature``, ``dp_size``,
  ``batch_num_tokens``, ``global_batch_size``, ``global_steps`` when present) and ``uid`` (prompt groups);
- ``log_probs``: verl's current log-probs of the response tokens (per sequence) and ``loss``: the
  loss value the function returned, ``metrics``: its metrics (lists of floats).

Off (no file, no cost) unless ``TRUSTBENCH_VERL_DUMP_DIR`` is set. Not for production runs: a file
holds the whole micro-batch.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

DUMP_ENV = "TRUSTBENCH_VERL_DUMP_DIR"
META_KEYS = ("temperature", "dp_size", "batch_num_tokens", "global_batch_size", "global_steps", "max_response_len")
_COUNTER = itertools.count()


def _plain(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return list(value.unbind()) if value.is_nested else value
    if hasattr(value, "data") and not isinstance(value, torch.Tensor):  # tensordict NonTensorData / Stack
        return value.data
    return value


def _metric_values(metric: Any) -> list[float]:
    """A verl ``Metric`` (or a plain number) as the list of floats it holds."""
    values = getattr(metric, "values", metric)
    values = values if isinstance(values, list | tuple) else [values]
    return [float(v.detach()) if hasattr(v, "detach") else float(v) for v in values]


def dump_micro_batch(data, model_output: dict, loss: Any, metrics: Any) -> str | None:
    """Write one micro-batch (module docstring) if ``TRUSTBENCH_VERL_DUMP_DIR`` is set; returns the path."""
    folder = os.environ.get(DUMP_ENV)
    if not folder:
        return None
    import torch
    from verl.utils import tensordict_utils as tu

    fields, meta = {}, {}
    for key in data.keys():
        value = data.get(key)
        if isinstance(value, torch.Tensor):
            fields[key] = _plain(value)
    for key in META_KEYS:
        value = tu.get_non_tensor_data(data=data, key=key, default=None)
        if value is not None:
            meta[key] = _plain(value)
    if "uid" in data.keys():  # the prompt group of each response (a non-tensor column)
        uid = tu.get(data, "uid")
        meta["uid"] = uid.tolist() if hasattr(uid, "tolist") else list(uid)
    log_probs = model_output.get("log_probs")
    record = {
        "fields": fields,
        "meta": meta,
        "log_probs": _plain(log_probs) if log_probs is not None else None,
        "loss": float(loss.detach()) if isinstance(loss, torch.Tensor) else loss,
        "metrics": {k: _metric_values(v) for k, v in dict(metrics or {}).items()},
    }
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"update_{os.getpid()}_{next(_COUNTER):04d}.pt")
    torch.save(record, path)
    return path


__all__ = ["DUMP_ENV", "dump_micro_batch"]
