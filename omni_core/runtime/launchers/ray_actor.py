"""The Ray actor that holds one process group on its node.

The actor does not run stages itself: it starts the same child the local
launcher starts (:func:`~omni_core.runtime.worker.child_main`, spawned on
the actor's node) and relays what the child says. So stage code never runs
inside a Ray worker, the child dies with its actor (PR_SET_PDEATHSIG: a
killed actor leaves no stage process behind), and a restart is a new child
in the same bundle, not a new placement.

Nothing here is imported by the parent unless the ray launcher is chosen.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import signal
import socket
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Any


class ProcessGroupActor:
    """One process group: reserve its port, start its child, report the child's events."""

    def __init__(self, name: str, runtime_dir: str):
        self.name = name
        self.runtime_dir = runtime_dir
        self.proc: Any = None
        self.conn: Any = None
        self.log_path = ""
        self.reported_exit = False
        # Children are forked from one thread that lives as long as the actor:
        # Linux sends a child its parent-death signal when the *thread* that
        # forked it ends, and the threads that run actor methods are Ray's.
        self.forks: queue.Queue[tuple[Any, Future]] = queue.Queue()
        threading.Thread(target=self._fork_loop, name="omni-fork", daemon=True).start()
        # The node may not share the parent's file system: the runtime directory
        # (sockets of this node's processes, GPU start-up locks) is made here, and the
        # log directory by each process (see worker._redirect_output).
        os.makedirs(runtime_dir, mode=0o700, exist_ok=True)

    def reserve(self, host: str) -> str:
        """A free TCP port on this node for the group's cross-node listener.

        The child binds it again with SO_REUSEADDR when it starts (and after
        every restart), so its peers can keep the address for the whole run.
        """
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, 0))
            return f"tcp://{host}:{sock.getsockname()[1]}"

    def node_ip(self) -> str:
        import ray

        return ray.util.get_node_ip_address()

    def start(self, spec: Any) -> int:
        """Spawn the child with ``spec`` (its parent is this actor); its pid."""
        import ray

        gpus = [int(g) for g in ray.get_gpu_ids()]
        process = spec.plan.process(spec.process)
        # Ray hides every GPU but the bundle's: the process's cluster GPU id is
        # device 0 of what it sees.
        gpu_map = {process.gpu: 0} if process.gpu is not None and gpus else {}
        spec = dataclasses.replace(
            spec, parent_pid=os.getpid(), gpu_map={**spec.gpu_map, **gpu_map}
        )
        self.log_path = spec.log_path
        done: Future = Future()
        self.forks.put((spec, done))
        self.proc, self.conn = done.result()
        self.reported_exit = False
        return self.proc.pid

    def _fork_loop(self) -> None:
        from .local import spawn_child

        while True:
            spec, done = self.forks.get()
            try:
                # spawned: an actor starts one process group, so a fork server here
                # would be one more process (and torch imported twice) for one child
                done.set_result(spawn_child(spec, self.name, method="spawn"))
            except BaseException as exc:  # reported to the caller of start()
                done.set_exception(exc)

    def next_event(self, timeout: float) -> tuple[Any, ...] | None:
        """The child's next message, or its exit (once), or None after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None:
                return None
            if self.conn is not None and self.conn.poll(0.05):
                try:
                    return tuple(self.conn.recv())
                except (EOFError, OSError):
                    self.conn = None
            if not self.proc.is_alive() and (self.conn is None or not self.conn.poll()):
                if self.reported_exit:
                    return None
                self.proc.join(1)
                self.reported_exit = True
                return ("exited", self.proc.exitcode, self.log_tail())
        return None

    def signal(self, number: int) -> None:
        if self.proc is not None and self.proc.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, number)

    def stop(self, timeout: float) -> int | None:
        """TERM, then KILL after ``timeout``; the exit status."""
        if self.proc is None:
            return None
        self.signal(signal.SIGTERM)
        self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(2)
        return self.proc.exitcode

    def where(self) -> dict[str, Any]:
        import ray

        context = ray.get_runtime_context()
        return {
            "node_id": context.get_node_id(),
            "node_address": ray.util.get_node_ip_address(),
            "actor": self.name,
            "pid": self.proc.pid if self.proc is not None else None,
        }

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path, errors="replace") as handle:
                return "".join(deque(handle, maxlen=lines)).rstrip() or "(empty log)"
        except OSError:
            return "(no log)"
