"""Which processes ask torch for huge pages (see :mod:`omni_core.engine.huge_pages`).

Every process placed on the CPU, whose decoders stream their weights from
host memory at every step, unless the environment ``omni serve`` runs in
sets the variable (the user's value, ``0`` included, is the one the child
keeps). A GPU process is left as it is: its weights are in device memory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from ..engine.huge_pages import VAR, host_mode
from .model import ProcessPlan


def plan_huge_pages(
    processes: Sequence[ProcessPlan], environ: Mapping[str, str] | None = None
) -> None:
    """Put ``THP_MEM_ALLOC_ENABLE=1`` in the env of each CPU process (a stage's own wins)."""
    environ = os.environ if environ is None else environ
    if VAR in environ:
        return
    for process in processes:
        if process.gpu is None:
            process.env.setdefault(VAR, "1")


def describe(processes: Sequence[ProcessPlan], mode: str | None = None) -> str | None:
    """The plan's line on huge pages, or None where no process asks for them."""
    asking = [p.name for p in processes if p.env.get(VAR) == "1"]
    if not asking:
        return None
    mode = host_mode() if mode is None else mode
    if mode == "never":
        effect = "this host's transparent huge pages are 'never': no effect until enabled"
    elif mode is None:
        effect = "this host does not say whether it grants them"
    else:
        effect = f"this host grants them ({mode})"
    return f"2 MB pages for CPU tensors of 2 MB or more ({VAR}=1): {', '.join(asking)}; {effect}"
