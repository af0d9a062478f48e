"""``local``: every process group is a child process of ``omni serve``, on this host."""

from __future__ import annotations

import multiprocessing
import os
from multiprocessing.context import BaseContext
from typing import Any

import anyio

from ...errors import ConfigError
from ...launcher import Launcher, LaunchSession, ProcessHandle
from . import fork_env

#: How stage processes start: ``forkserver`` (the default where the platform has it)
#: or ``spawn``; this environment variable chooses.
START_METHOD_ENV = "OMNI_START_METHOD"
START_METHODS = ("forkserver", "spawn")
#: What the fork server imports once, so that a stage process starts with it loaded:
#: torch alone is 2-3 s of CPU per process on a small machine, paid by every stage of
#: a deployment (seven for Qwen3-Omni) and again at each restart under ``spawn``.
#: Plugins' own modules are not preloaded: the fork server outlives deployments in a
#: long-lived parent (a test session, a notebook), and a plugin upgraded meanwhile
#: must be imported afresh. The last one makes the server remove its socket's
#: directory when its parent was killed (:mod:`.fork_server_exit`).
PRELOAD = ("torch", "omni_core.runtime.worker", "omni_core.runtime.launchers.fork_server_exit")


def start_method() -> str:
    """The start method ``OMNI_START_METHOD`` names, else ``forkserver`` where it exists.

    Why a fork server: a spawned stage process is a fresh interpreter that imports
    torch before it can build anything; a fork server imports it once, and each stage
    process is a fork of it. Not a plain fork of ``omni serve``: its event loop, its
    threads and its sockets must not be copied into every stage. The child keeps
    spawn's semantics where they matter: it gets the parent's environment as it is at
    the moment of the start (:func:`spawn_child` sends it), not the fork server's.
    """
    chosen = os.environ.get(START_METHOD_ENV, "").strip()
    if not chosen:
        available = multiprocessing.get_all_start_methods()
        return "forkserver" if "forkserver" in available else "spawn"
    if chosen not in START_METHODS:
        raise ConfigError(
            f"{START_METHOD_ENV}={chosen!r} is not a start method omni knows",
            hint=f"set it to one of {', '.join(START_METHODS)}, or unset it",
        )
    if chosen not in multiprocessing.get_all_start_methods():
        raise ConfigError(
            f"{START_METHOD_ENV}={chosen!r}: this platform has no {chosen} start method",
            hint="unset it (omni uses spawn here)",
        )
    return chosen


def start_context(method: str | None = None) -> BaseContext:
    """The multiprocessing context that starts stage processes (see :func:`start_method`)."""
    method = method or start_method()
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        # Takes effect when the server starts (the first stage process of this parent).
        context.set_forkserver_preload(list(PRELOAD))
    return context


def warm_fork_server() -> None:
    """Start the fork server and wait until it has imported what it preloads.

    Starting a process blocks its caller until the server answers with the child's
    pid, which the first time means until torch is imported (seconds). Stage processes
    must be started on the event loop's thread (``ProcessHandle.start``), so this
    runs first, in a worker thread, with a child that exits at once: the loop is
    never blocked for more than a fork. A server already running answers at once.
    """
    probe = start_context("forkserver").Process(target=int, name="omni:fork-server-probe")
    probe.start()
    probe.join()


def spawn_child(spec: Any, name: str, method: str | None = None) -> tuple[Any, Any]:
    """Start ``child_main(spec)`` in a new process; (process, the pipe's reading end).

    Every launcher ends here, on whichever machine it runs the group. ``method``:
    the start method (default :func:`start_method`); a process whose OpenMP
    settings the fork server did not read is spawned (:mod:`.fork_env`).
    """
    from ..worker import child_main

    method = method or start_method()
    if method == "forkserver":
        start_context(method)  # the preload list, before the server may start below
        process = spec.plan.process(spec.process)
        wanted = fork_env.wanted_settings({**process.env, **spec.extra_env}, os.environ)
        if not fork_env.fork_can_serve(wanted):
            method = "spawn"  # its OpenMP must read settings the server did not (fork_env)
    context = start_context(method)
    parent_end, child_end = context.Pipe(duplex=False)
    proc = context.Process(
        target=child_main,
        args=(spec, child_end, dict(os.environ)),
        name=f"omni:{name}",
        daemon=False,
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
        if start_method() == "forkserver":  # a bad OMNI_START_METHOD is refused here
            start_context("forkserver")  # the preload list
            wanted = [fork_env.wanted_settings(p.env, os.environ) for p in self.plan.processes]
            fork_env.start_server(fork_env.common_settings(wanted))
            await anyio.to_thread.run_sync(warm_fork_server)
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
