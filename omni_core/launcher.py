"""The interface of a launcher: where and how the runtime starts a plan's process groups.

The runtime owns everything a deployment does once its processes run:
routing, heartbeats, restarts with back-off, failing the requests of a dead
process. A launcher owns only the processes themselves: where each one is
started (a child of ``omni serve``, a Ray actor on some node, later a pod or a
Slurm step), and how the parent learns that it is ready, alive or gone.
``runtime.launcher`` names one; plugins register more through the
``omni_register_launchers`` hook, as they register transports.

The contract:

* ``launcher.inventory(config)`` - the cluster's nodes and GPUs when the
  launcher can see them (``omni plan`` plans against it), else None.
* ``launcher.session(plan, config)`` - a :class:`LaunchSession` for one run.
  ``await session.open()`` reserves what the plan needs (a placement group,
  ports) and fills ``session.addresses`` (process name, and ``coordinator``,
  to the TCP address its cross-node edges reach it at; empty on one node);
  ``session.process(plan, log_path)`` returns a :class:`ProcessHandle` for one
  process group; ``await session.aclose()`` releases everything, so that
  nothing the run created survives it.
* A :class:`ProcessHandle` looks like a :class:`multiprocessing.Process` with
  its pipe: ``await start(spec)`` runs :func:`omni_core.runtime.worker.child_main`
  with the spec wherever the launcher puts it; ``poll``/``recv`` read the
  child's ``("ready", timings)`` or ``("failed", text)``; ``is_alive``,
  ``exitcode``, ``terminate``, ``kill`` and ``join`` do what they do for a
  local process. The same child code runs under every launcher.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class ProcessHandle(ABC):
    """One started process group, as the supervisor sees it."""

    log_path: str = ""

    @abstractmethod
    async def start(self, spec: Any) -> None:
        """Start the group's child with ``spec`` (a ChildSpec).

        Called on the event loop's thread, and a local child must be spawned
        on it: Linux ties a child's parent-death signal to the thread that
        forked it, so a child forked from a worker thread would be killed
        when that thread retires. Blocking work (a cluster call) goes to a
        thread; the fork does not.
        """

    @abstractmethod
    def poll(self) -> bool:
        """Whether a message from the child waits to be read."""

    @abstractmethod
    def recv(self) -> tuple[str, Any]:
        """The child's next message; EOFError when it can send no more."""

    @abstractmethod
    def is_alive(self) -> bool: ...

    @property
    @abstractmethod
    def exitcode(self) -> int | None:
        """The exit status (negative: killed by that signal); None while it runs."""

    @abstractmethod
    def terminate(self) -> None:
        """Ask the child to stop (SIGTERM): it finishes cleanly."""

    @abstractmethod
    def kill(self) -> None:
        """Stop the child at once (SIGKILL)."""

    @abstractmethod
    def join(self, timeout: float | None = None) -> None:
        """Wait for the child to be gone and release what the handle holds."""

    def where(self) -> dict[str, Any]:
        """Where the child runs, for ``/health`` (node, actor name)."""
        return {}

    def log_tail(self, lines: int = 20) -> str | None:
        """The last lines of the child's log when the parent cannot read the file itself."""
        return None


class LaunchSession(ABC):
    """One deployment's processes under one launcher, from open to close."""

    addresses: dict[str, str]

    @abstractmethod
    async def open(self) -> None:
        """Reserve what the plan needs; refuse (OmniError) when the cluster cannot hold it."""

    @abstractmethod
    def process(self, name: str, log_path: str) -> ProcessHandle:
        """A handle for the plan's process ``name`` (not started)."""

    @abstractmethod
    async def aclose(self) -> None:
        """Release everything the session created (after every process stopped)."""


class Launcher(ABC):
    """A named way to start a plan's process groups."""

    name: str = ""
    description: str = ""

    def inventory(self, config: Any) -> Any | None:
        """The GpuInventory (with nodes) this launcher sees, or None to detect locally."""
        return None

    @abstractmethod
    def session(self, plan: Any, config: Any) -> LaunchSession:
        """A session that will start ``plan``'s processes."""


class LazyLauncher(Launcher):
    """A launcher imported on first use, so that listing plugins never imports Ray."""

    def __init__(self, name: str, target: str, description: str):
        self.name = name
        self.target = target
        self.description = description
        self._impl: Launcher | None = None

    def load(self) -> Launcher:
        if self._impl is None:
            from .factory import import_object

            self._impl = import_object(self.target, what=f"launcher {self.name!r}")()
        return self._impl

    def inventory(self, config: Any) -> Any | None:
        return self.load().inventory(config)

    def session(self, plan: Any, config: Any) -> LaunchSession:
        return self.load().session(plan, config)
