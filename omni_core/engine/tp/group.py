"""One tensor-parallel group: its private rendezvous, its process group, and what a break does.

Rendezvous. The runtime names a file in the deployment's runtime directory
(created 0700, removed when the run ends) for each start of each group; every
rank opens a ``torch.distributed.FileStore`` on it. No TCP port is reserved
(gloo and NCCL pick their own ephemeral ones), another user cannot reach the
store, and a restarted group gets a fresh file, so a rank of the old
generation can never join the new one. Before the process group is built,
each rank writes ``omni/joined/<rank>``: a rank that waits in vain can then
say which ranks never arrived, rather than torch's "timed out".

A break. When a collective fails (a peer died: gloo sees its socket close at
once), the group is over: the runtime will notice the dead process, fail the
stage's requests with a 503 naming it, and restart the whole group. The
surviving rank therefore does not fail the step with an error of its own
(that would race the supervisor and answer 500 for what is a lost process);
it waits up to ``grace`` seconds to be stopped, and exits on its own if it is
not (a break with no dead process: a timeout, a network fault). A group
that is closing raises at once instead (the stage is stopping anyway).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist

from ...errors import OmniError

EXIT_BROKEN = 70  # a rank that left a broken group on its own (EX_SOFTWARE)
BROKEN_GRACE = 10.0  # seconds a rank of a broken group waits for the supervisor


class TPStartError(OmniError):
    """A tensor-parallel group could not form: which rank, and why."""


class TPGroupBroken(RuntimeError):
    """A collective failed; the group cannot compute any more."""


@dataclass
class TPGroup:
    """This process's place in its tensor-parallel group (one group per process)."""

    name: str  # the logical process, for messages
    rank: int
    size: int
    backend: str  # "gloo" or "nccl"
    device: torch.device
    store_path: str
    ranks: list[str] = field(default_factory=list)  # process name of each rank
    grace: float = BROKEN_GRACE
    exit_on_break: bool = True  # False in tests that run a group outside the runtime
    closing: bool = False
    failure: str = ""

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def process_of(self, rank: int) -> str:
        return self.ranks[rank] if rank < len(self.ranks) else f"rank {rank}"

    # -- collectives, each failing the same way ---------------------------------
    def all_reduce(self, tensor: torch.Tensor) -> None:
        """Sum ``tensor`` over the ranks, in place."""
        self._check()
        try:
            dist.all_reduce(tensor)
        except Exception as exc:
            self.broken("an all-reduce", exc)

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Rank 0's ``tensor`` into every rank's, in place."""
        self._check()
        try:
            dist.broadcast(tensor, 0)
        except Exception as exc:
            self.broken("a broadcast", exc)

    def _check(self) -> None:
        if self.failure:
            raise TPGroupBroken(self.failure)

    def broken(self, what: str, exc: BaseException) -> NoReturn:
        """A collective failed: wait for the supervisor (see the module docstring)."""
        self.failure = (
            f"tensor-parallel group {self.name!r}: {what} on rank {self.rank} "
            f"({self.process_of(self.rank)}) failed, so a peer is gone or unreachable: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        )
        print(self.failure, file=sys.stderr, flush=True)
        if self.exit_on_break:
            deadline = time.monotonic() + self.grace
            while time.monotonic() < deadline and not self.closing:
                time.sleep(0.05)
            if not self.closing:
                print(
                    f"rank {self.rank} of {self.name!r} was not stopped within {self.grace:g} s "
                    "of the break; it exits so that the group is restarted",
                    file=sys.stderr,
                    flush=True,
                )
                sys.stderr.flush()
                os._exit(EXIT_BROKEN)
        raise TPGroupBroken(self.failure) from exc

    def close(self) -> None:
        """The stage is stopping: a break from now on raises at once."""
        self.closing = True


_current: TPGroup | None = None


def current_group() -> TPGroup | None:
    """The group this process belongs to (set by :func:`init_group`), or None."""
    return _current


def init_group(
    *,
    name: str,
    rank: int,
    size: int,
    store_path: str,
    backend: str,
    device: str | torch.device,
    timeout: float,
    ranks: list[str] | None = None,
) -> TPGroup:
    """Meet the other ranks at ``store_path`` and build the process group (blocking).

    TPStartError, naming the ranks that never arrived, when the others do not
    all join within ``timeout`` seconds, or naming this rank when a peer's
    process ends while the connections form.
    """
    global _current
    if _current is not None:
        raise RuntimeError(f"this process is already rank {_current.rank} of {_current.name!r}")
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is outside a group of {size}")
    names = list(ranks or [])
    group = TPGroup(name, rank, size, backend, torch.device(device), store_path, names)
    if group.device.type == "cuda":
        torch.cuda.set_device(group.device)
    wait = timedelta(seconds=timeout)
    store = dist.FileStore(store_path, size)
    store.set_timeout(wait)
    store.set(f"omni/joined/{rank}", str(os.getpid()))
    keys = [f"omni/joined/{r}" for r in range(size)]
    try:
        store.wait(keys, wait)
    except Exception:  # torch raises its own timeout types (DistStoreError, RuntimeError)
        missing = [r for r in range(size) if not store.check([keys[r]])]
        who = ", ".join(f"rank {r} ({group.process_of(r)})" for r in missing) or "no rank"
        raise TPStartError(
            f"tensor-parallel group {name!r}: rank {rank} ({group.process_of(rank)}) waited "
            f"{timeout:g} s at the rendezvous, and {who} never arrived",
            hint="the missing rank's process failed or hangs before it: read its log; raise "
            "runtime.startup_timeout if loading is just slow",
        ) from None
    try:
        dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=wait)
    except RuntimeError as exc:  # a peer that arrived and then died while the links formed
        raise TPStartError(
            f"tensor-parallel group {name!r}: rank {rank} ({group.process_of(rank)}) could "
            f"not connect to the other ranks: {str(exc).splitlines()[0]}",
            hint="another rank's process ended while the group formed: read its log",
        ) from None
    _current = group
    # A rank that ends without leaving (a script, a stage that returns) would let gloo's
    # threads abort the interpreter's exit with std::terminate (SIGABRT, seen under load).
    atexit.register(leave_group)
    return group


def leave_group(timeout: float = 2.0) -> None:
    """Leave the process group as the process stops.

    Torch's process group must be destroyed before the interpreter ends (its
    threads otherwise abort the exit with ``std::terminate``). A rank whose
    peer died mid-collective might block in the destruction, so it gets
    ``timeout`` seconds in a daemon thread.
    """
    global _current
    if _current is not None:
        _current.close()
    _current = None
    if not dist.is_initialized():
        return
    leaving = threading.Thread(target=dist.destroy_process_group, name="tp-leave", daemon=True)
    leaving.start()
    leaving.join(timeout)
