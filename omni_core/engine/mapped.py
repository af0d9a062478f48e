"""Which tensors view weights mapped read-only from shared memory (weight sharing).

Why a registry here: code that would copy or convert a weight (the oneDNN
repacking in :mod:`.cpu_linear`) must know when the weight is one copy for
several processes, and keep the shared view instead of making a private copy.
The runtime's weight sharing (:mod:`omni_core.runtime.weight_share`) records
the address range of every mapping it makes; a tensor whose storage lies in
one of them is a mapped weight. Addresses only, so no torch at import.
"""

from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()
_ranges: dict[int, int] = {}  # start address -> end address (exclusive)


def add_range(start: int, size: int) -> None:
    """Record a read-only weight mapping of ``size`` bytes at ``start``."""
    with _lock:
        _ranges[start] = start + size


def remove_range(start: int) -> None:
    with _lock:
        _ranges.pop(start, None)


def is_mapped(tensor: Any) -> bool:
    """Whether ``tensor``'s storage lies in a shared weight mapping of this process."""
    if not _ranges or tensor.device.type != "cpu":
        return False
    address = tensor.untyped_storage().data_ptr()
    with _lock:
        return any(start <= address < end for start, end in _ranges.items())
