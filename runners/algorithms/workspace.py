"""Work buffers reused from one call to the next: ``Workspace.get(name, shape, like)``.

Design: on CPU every fresh tensor of more than a few MB is a fresh memory mapping whose pages fault
on first write (1-2 ns per float32 value: about as long as an exponential of it), and glibc maps
anything above 32 MiB anew on every allocation. A [64, 151,936] float32 row block (a decode step's
logits at Qwen's vocabulary) is 39 MB. Loops that make such a tensor at every iteration (the
sampler's decode steps, ``chunked_head``'s chunks) ask a ``Workspace`` instead: the first request
of a name allocates, later ones get the same memory, sliced to their rows (a leading-dimension slice
of a contiguous buffer stays contiguous). A request for more rows, another trailing shape, dtype or
device allocates anew. What ``get`` returns is overwritten by the next ``get`` of that name.
"""

from __future__ import annotations

import torch
from torch import Tensor


class Workspace:
    """Named buffers, one per name, reused while the request fits (see the module doc)."""

    def __init__(self) -> None:
        self._buffers: dict[str, Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], like: Tensor) -> Tensor:
        """An uninitialised ``like``-typed tensor of ``shape``: the buffer ``name``'s first
        ``shape[0]`` rows."""
        buf = self._buffers.get(name)
        if (
            buf is None
            or buf.shape[0] < shape[0]
            or buf.shape[1:] != torch.Size(shape[1:])
            or buf.dtype != like.dtype
            or buf.device != like.device
        ):
            buf = like.new_empty(shape)
            self._buffers[name] = buf
        return buf[: shape[0]]

    def like(self, name: str, tensor: Tensor) -> Tensor:
        """The buffer ``name`` shaped and typed as ``tensor``."""
        return self.get(name, tuple(tensor.shape), tensor)


__all__ = ["Workspace"]
