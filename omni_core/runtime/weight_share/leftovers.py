"""What torch may leave in ``/dev/shm`` for a process that is gone, removed by the parent.

Our host weight sharing uses nameless ``memfd`` files and leaves nothing. On
a GPU, torch's CUDA IPC keeps a reference-counter file per exporting process
(``/dev/shm/torch_<pid>_<n>``), named and unlinked by torch only when the
process ends cleanly; a killed leader leaves it behind. The runtime calls
:func:`remove_leftovers` after it stops each process of a deployment that
shares weights. (When the parent itself is SIGKILLed nothing runs: the
children die with it, and such a file can remain on a GPU host.)
"""

from __future__ import annotations

import contextlib
import os
import stat

SHM_DIR = "/dev/shm"


def leftovers(pid: int, directory: str = SHM_DIR) -> list[str]:
    """Paths of torch's shared-memory files of process ``pid`` that belong to this user."""
    prefix = f"torch_{pid}_"
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory):
            if not entry.name.startswith(prefix):
                continue
            with contextlib.suppress(OSError):
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid():
                    found.append(entry.path)
    return found


def remove_leftovers(pid: int, directory: str = SHM_DIR) -> int:
    """Unlink :func:`leftovers` of ``pid`` (a process that has exited); how many."""
    removed = 0
    for path in leftovers(pid, directory):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            removed += 1
    return removed
