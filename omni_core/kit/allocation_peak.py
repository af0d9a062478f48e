"""The peak of the memory a piece of torch code allocates, counted tensor by tensor.

Why: a stage's memory estimate (what ``omni plan`` reserves on a GPU) must
hold what its code really allocates, and no GPU is at hand to read
``torch.cuda.max_memory_allocated`` from. Counting every storage an operator
creates, from its creation until its last tensor is gone, gives the same
figure on any device, and on the ``meta`` device at no cost in time or
memory: a release-size codec chunk is counted in a second. ``meta`` also
takes the code paths a GPU takes (the CPU-only kernels choose themselves by
``x.is_cpu``), so it counts what a GPU would allocate, before the caching
allocator's rounding and any kernel's workspace (which estimates add as
slack).

Views count nothing (their storage is an input's), and storages that existed
before the block (weights, a stream's state going in) count nothing either;
what the block keeps when it ends (its outputs, a stream's next state) is
in the peak, as it is on a GPU.

    with AllocationPeak() as peak:
        decoder.stream(codes, state)
    peak.bytes
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def _storage_key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata


class AllocationPeak(TorchDispatchMode):
    """Counts the bytes of the storages that operators create while it is active.

    ``bytes``: the most that were alive at once; ``live``: those alive now.
    """

    def __init__(self) -> None:
        super().__init__()
        self._alive: dict[int, int] = {}
        self.live = 0
        self.bytes = 0

    def _released(self, key: int) -> None:
        size = self._alive.pop(key, None)
        if size is not None:
            self.live -= size

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {
            _storage_key(a) for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)
        }
        for tensor in tree_flatten(out)[0]:
            if not isinstance(tensor, torch.Tensor):
                continue
            key = _storage_key(tensor)
            if key in inputs or key in self._alive:  # a view, or an output already counted
                continue
            size = tensor.untyped_storage().nbytes()
            self._alive[key] = size
            self.live += size
            self.bytes = max(self.bytes, self.live)
            # the storage goes with its tensors; a view made later keeps the base tensor
            # alive through ``_base``, so the first tensor's lifetime is the storage's
            weakref.finalize(tensor, self._released, key)
        return out
