"""Resident memory of this process for the benchmark scripts (Linux): the kernel's counters in
``/proc/self/status`` and a reset of its peak, so that a phase's peak can be read on its own.

    before = rss.settle()                  # KiB resident, freed memory returned, peak reset to it
    ...                                    # the phase
    peak_above = rss.kib("VmHWM") - before

Only the standard library.
"""

from __future__ import annotations

import ctypes
import gc
from pathlib import Path


def kib(field: str) -> int:
    """A ``/proc/self/status`` counter in KiB (``VmRSS``: resident now, ``VmHWM``: peak resident)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def settle() -> int:
    """Resident KiB once freed memory went back to the system (glibc's ``malloc_trim``; elsewhere the figure
    includes what the allocator keeps), with the peak (``VmHWM``) reset to it through ``clear_refs``."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    Path("/proc/self/clear_refs").write_text("5")
    return kib("VmRSS")
