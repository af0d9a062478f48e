"""CPU weights in 2 MB pages: torch's allocator asks the kernel for them when told to.

Why: a decode step on the CPU streams every weight once, and with 4 KB pages
each 4 KB of it costs a page-table walk the prefetchers cannot hide (on a
virtual machine a nested one). torch's CPU allocator (c10) aligns every
allocation of 2 MB or more to 2 MB and advises the kernel to back it with
transparent huge pages when ``THP_MEM_ALLOC_ENABLE=1``; the kernel grants
them where its mode is ``always`` or ``madvise`` (most distributions'
default), never where it is ``never``. Measured on a 2-core AMD EPYC cloud
machine (``madvise``): a Qwen3-TTS 0.6B bf16 frame 201-204 -> 188-190 ms
(``bench_qwen3_tts.py``, alternated), 320 -> 277 ms through ``generate``; a
512 MB ``sum`` 19 -> 35 GB/s. The resident memory did not grow (2.79 GB
either way): the weights are large tensors, whose alignment wastes no page.

torch reads the variable at the process's first CPU allocation, so it must
be in the environment before that: the plan puts it in every CPU stage
process's ``env`` (:func:`omni_core.plan.pages.plan_huge_pages`), which the
child sets before it builds anything, and a benchmark sets it at its start
(:func:`ask_for_huge_pages`). A value the user set, ``0`` included, wins.
"""

from __future__ import annotations

import os
import re
from collections.abc import MutableMapping
from pathlib import Path

#: torch's own switch (c10/core/alloc_cpu.cpp), read once per process.
VAR = "THP_MEM_ALLOC_ENABLE"
#: The kernel's transparent huge page mode: ``always [madvise] never``, the chosen one bracketed.
MODE_FILE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


#: Whether :func:`ask_for_huge_pages` put the variable in this process's environment.
_set_here = False


def ask_for_huge_pages(environ: MutableMapping[str, str] | None = None) -> bool:
    """Set :data:`VAR` to ``1`` in ``environ`` (``os.environ``) unless it is set; whether
    this call set it. Only takes effect before the process's first CPU tensor."""
    global _set_here
    target = os.environ if environ is None else environ
    if VAR in target:
        return False
    target[VAR] = "1"
    _set_here = _set_here or target is os.environ
    return True


def user_environ() -> dict[str, str]:
    """``os.environ`` as the user left it: without :data:`VAR` where
    :func:`ask_for_huge_pages` put it there. For the reference implementations
    a benchmark starts, measured as their users run them."""
    return {k: v for k, v in os.environ.items() if not (_set_here and k == VAR)}


def host_mode(path: Path | None = None) -> str | None:
    """The kernel's transparent huge page mode (``always``, ``madvise``, ``never``), or None
    where it does not say (no such file: another OS, a kernel without them)."""
    try:
        found = re.search(r"\[(\w+)\]", (path or MODE_FILE).read_text())
    except OSError:
        return None
    return found.group(1) if found else None


def granted_bytes(pid: int | str = "self") -> int | None:
    """Bytes of ``pid``'s anonymous memory in huge pages now (None: no ``/proc`` to say)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    found = re.search(r"^AnonHugePages:\s+(\d+) kB", text, re.MULTILINE)
    return int(found.group(1)) * 1024 if found else None
