"""Starting, watching and stopping the process groups of a plan, under any launcher."""

from __future__ import annotations

import signal
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import anyio

from ..errors import OmniError
from ..launcher import ProcessHandle
from ..plan.model import ProcessPlan
from .worker import ChildSpec

TERM_TIMEOUT = 5.0


class StartupError(OmniError):
    """A process did not become ready: its error, or a timeout, with its last log lines."""


def describe_exit(code: int | None) -> str:
    if code is None:
        return "is still running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name} (exit status {code})"
        except ValueError:
            return f"exited with status {code}"
    return f"exited with status {code}"


NO_LOG = "(no log)"
#: A child that died before its worker opened the log died in multiprocessing's own
#: start-up, and the usual cause is a script that starts omni from its top level: every
#: stage process runs the parent's main script again (forkserver and spawn alike), so
#: the script starts omni once more inside the child, which Python refuses.
NO_LOG_HINT = (
    "it ended before omni's code ran in it, so its own error went to this terminal's "
    "stderr; if a script of yours starts omni, put that code under "
    '`if __name__ == "__main__":` (each stage process runs the script\'s top level again)'
)


def log_tail(path: str, lines: int = 20) -> str:
    try:
        with open(path, errors="replace") as handle:
            tail = deque(handle, maxlen=lines)
    except OSError:
        return NO_LOG
    return "".join(tail).rstrip() or "(empty log)"


@dataclass
class Child:
    """One process group and what the supervisor knows of it."""

    plan: ProcessPlan
    log_path: str
    proc: ProcessHandle | Any = None
    state: str = "starting"  # starting, healthy, unresponsive, restarting, failed, stopped
    restarts: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    started_at: float = 0.0
    ready_seconds: float = 0.0
    ready_at: float = 0.0  # monotonic; the heartbeat clock starts here
    last_exit: str = ""

    @property
    def name(self) -> str:
        return self.plan.name

    async def spawn(self, spec: ChildSpec, handle: ProcessHandle) -> None:
        """Start the group through ``handle``, a fresh one from the launcher's session."""
        self.proc = handle
        self.started_at = time.monotonic()
        await handle.start(spec)
        self.state = "starting"

    @property
    def runs_here(self) -> bool:
        """A child of this process (the local launcher), not one a Ray actor started."""
        return self.proc is not None and self.proc.log_tail() is None

    def log_tail(self) -> str:
        remote = self.proc.log_tail() if self.proc is not None else None
        return remote if remote is not None else log_tail(self.log_path)

    async def wait_ready(self, timeout: float) -> None:
        """Until the child says ready; StartupError on its failure, death or timeout."""
        deadline = self.started_at + timeout
        while True:
            # OSError: the pipe was closed under this wait, by a stop() that reaped the
            # process meanwhile (a tensor-parallel sibling's failure stops its group while
            # every rank is still waited for); the process is gone, said just below.
            try:
                said = self.proc.poll()
            except OSError:
                said = False
            if said:
                try:
                    kind, detail = self.proc.recv()
                except (EOFError, OSError):
                    kind, detail = "died", ""
                if kind == "ready":
                    self.timings = detail
                    self.ready_at = time.monotonic()
                    self.ready_seconds = self.ready_at - self.started_at
                    self.state = "healthy"
                    return
                if kind == "failed":
                    raise StartupError(f"process {self.name} failed to start:\n{detail.rstrip()}")
            if not self.proc.is_alive():
                tail = self.log_tail()
                raise StartupError(
                    f"process {self.name} {describe_exit(self.proc.exitcode)} while starting; "
                    f"last log lines:\n{tail}",
                    hint=NO_LOG_HINT if tail == NO_LOG and self.runs_here else None,
                )
            if time.monotonic() > deadline:
                raise StartupError(
                    f"process {self.name} did not become ready in {timeout:g} s; "
                    f"last log lines:\n{self.log_tail()}",
                    hint="raise runtime.startup_timeout if loading is just slow",
                )
            await anyio.sleep(0.02)

    async def stop(self, *, kill: bool = False) -> None:
        """SIGTERM, then SIGKILL after a timeout; reaps the process.

        ``kill`` skips SIGTERM: a hung or stopped process would not handle it,
        and waiting for it would only delay the restart.
        """
        proc = self.proc
        if proc is None:
            return
        if kill and proc.is_alive():
            proc.kill()
        if proc.is_alive():
            proc.terminate()
            deadline = time.monotonic() + TERM_TIMEOUT
            while proc.is_alive() and time.monotonic() < deadline:
                await anyio.sleep(0.02)
            if proc.is_alive():
                proc.kill()
        await anyio.to_thread.run_sync(proc.join, 2.0)
        self.state = "stopped"
