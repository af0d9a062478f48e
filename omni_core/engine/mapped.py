"""Which tensors view weights mapped read-only from shared memory (weight sharing).

Why a registry here: code that would copy or convert a weight (the oneDNN
repacking in :mod:`.cpu_linear`) must know when the weight is one copy for
several processes, and keep the shared view instead of making a private copy.
The runtime's weight sharing (:mod:`omni_core.runtime.weight_share`) records
the address range of every mapping it makes; a tensor whose storage lies in
one of them is a mapped weight. Addresses only, so no torch at import.
CUDA storages opened from a leader's IPC handles are recorded too, under
their device type: a host address and a device address never compare.
"""

from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()
#: (device type, start address) -> end address (exclusive)
_ranges: dict[tuple[str, int], int] = {}


def add_range(start: int, size: int, device: str = "cpu") -> None:
    """Record a read-only weight mapping of ``size`` bytes at ``start`` on ``device``."""
    with _lock:
        _ranges[(device, start)] = start + size


def remove_range(start: int, device: str = "cpu") -> None:
    with _lock:
        _ranges.pop((device, start), None)


def is_mapped(tensor: Any) -> bool:
    """Whether ``tensor``'s storage lies in a shared weight mapping of this process."""
    if not _ranges:
        return False
    kind, address = tensor.device.type, tensor.untyped_storage().data_ptr()
    with _lock:
        return any(
            device == kind and start <= address < end for (device, start), end in _ranges.items()
        )
