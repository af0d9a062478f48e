"""``local``: every process group is a child process of ``omni serve``, on this host."""

from __future__ import annotations

import multiprocessing
from typing import Any

from ...errors import ConfigError
from ...launcher import Launcher, LaunchSession, ProcessHandle

SPAWN = multiprocessing.get_context("spawn")


def spawn_child(spec: Any, name: str) -> tuple[Any, Any]:
    """Start ``child_main(spec)`` in a fresh interpreter; (process, the pipe's reading end).

    Every launcher ends here, on whichever machine it runs the group.
    """
    from ..worker import child_main

    parent_end, child_end = SPAWN.Pipe(duplex=False)
    proc = SPAWN.Process(
        target=child_main, args=(spec, child_end), name=f"omni:{name}", daemon=False
    )
    proc.start()
    child_end.close()
    return proc, parent_end


class LocalProcess(ProcessHandle):
    """A spawned child and the pipe it reports ready or failed on."""

    def __init__(self, name: str, log_path: str):
        self.name, self.log_path = name, log_path
        self.proc: Any = None
        self.conn: Any = None

    async def start(self, spec: Any) -> None:
        self.proc, self.conn = spawn_child(spec, self.name)  # on the loop's thread: see start

    def poll(self) -> bool:
        return self.conn.poll()

    def recv(self) -> tuple[str, Any]:
        return self.conn.recv()

    def is_alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    @property
    def exitcode(self) -> int | None:
        return self.proc.exitcode

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    def terminate(self) -> None:
        self.proc.terminate()

    def kill(self) -> None:
        self.proc.kill()

    def join(self, timeout: float | None = None) -> None:
        self.proc.join(timeout)
        if self.conn is not None:
            self.conn.close()


class LocalSession(LaunchSession):
    def __init__(self, plan: Any):
        self.plan = plan
        self.addresses: dict[str, str] = {}

    async def open(self) -> None:
        nodes = self.plan.nodes
        if nodes is None:
            return
        away = sorted({p.node for p in self.plan.processes if p.node != nodes.coordinator})
        if away:
            raise ConfigError(
                f"the plan places processes on node{'s' if len(away) > 1 else ''} "
                f"{', '.join(away)}, but the local launcher starts processes on this host only",
                hint='set runtime.launcher = "ray" (pip install omni-core[ray]), or plan for '
                "one node",
            )

    def process(self, name: str, log_path: str) -> ProcessHandle:
        return LocalProcess(name, log_path)

    async def aclose(self) -> None:
        return None


class LocalLauncher(Launcher):
    name = "local"
    description = "child processes of omni serve, one host"

    def session(self, plan: Any, config: Any) -> LaunchSession:
        return LocalSession(plan)
