"""The size of this CPU's largest cache, which decides what a timing or a packed step reads.

Its own module because both :mod:`.prepack` (whether a step's weights fit the
cache) and :mod:`.cpu_kernel_choice` (how many layers a timed pass needs to
stream from memory) ask it, and :mod:`.prepack` depends on :mod:`.cpu_linear`,
which depends on :mod:`.cpu_kernel_choice`.
"""

from __future__ import annotations

import functools
from pathlib import Path

_CACHE_ROOT = Path("/sys/devices/system/cpu/cpu0/cache")


@functools.cache
def last_level_cache_bytes() -> int | None:
    """The largest CPU cache's size in bytes (sysfs); None where the system does not say."""
    best: tuple[int, int] | None = None
    for entry in _CACHE_ROOT.glob("index*"):
        try:
            level = int((entry / "level").read_text())
            size = _size_bytes((entry / "size").read_text().strip())
        except (OSError, ValueError):
            continue
        if best is None or (level, size) > best:
            best = (level, size)
    return None if best is None else best[1]


def _size_bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1].upper() in units:
        return int(text[:-1]) * units[text[-1].upper()]
    return int(text)
