"""Count the places where a computation makes the device wait for the host, on any device.

On a GPU, reading a tensor's value on the host (``bool(t)``, ``float(t)``, ``t.item()``, ``t.tolist()``),
and operations whose output size depends on the values (``nonzero``, boolean-mask indexing, ``unique``,
``masked_select``) wait for every queued kernel: one synchronisation each. ``HostReads`` counts these
calls through torch's function mode, so a CPU-only suite checks how often a code path would synchronise
on a GPU (``torch.cuda.set_sync_debug_mode`` counts the same events on a real device:
tests/backends/test_cuda.py). It counts calls, so a read outside torch (numpy) is not seen.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

# value reads and value-sized outputs (each one synchronisation on a GPU)
SYNCING = frozenset(
    {
        "__bool__", "__float__", "__int__", "__index__", "item", "tolist", "numpy",
        "nonzero", "argwhere", "masked_select", "unique", "unique_consecutive",
    }
)  # fmt: skip


def _bool_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


class HostReads(TorchFunctionMode):
    """``with HostReads() as reads: ...``; then ``reads.total`` and ``reads.by_name`` (a Counter)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_name: Counter[str] = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in SYNCING or (name in ("__getitem__", "__setitem__") and len(args) > 1 and _bool_index(args[1])):
            self.by_name[name] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.by_name.values())
