"""Whether a process id names a live process: for runtimes and stage processes that
must notice their parent or a previous owner is gone."""

from __future__ import annotations

import os


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process.

    A zombie (dead, not yet reaped by its parent) is not: a stage process whose
    ``omni serve`` was killed must not wait for whoever reaps it, and a runtime
    directory whose owner is a zombie is no longer served.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True  # no /proc (not Linux): os.kill said it exists
