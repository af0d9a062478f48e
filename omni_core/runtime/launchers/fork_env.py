"""The OpenMP settings a forked stage process cannot change: its fork server's.

Why: GNU OpenMP (the runtime torch ships) reads its environment once, when
the library loads, and the fork server loads it while importing torch. A
stage process forked from that server keeps the values the server read,
whatever its own environment says afterwards. The plan sets one of them
(``GOMP_SPINCOUNT``, ``plan/threads.py``: idle threads must not spin on
cores other processes need), and a user or a stage's ``env`` may set
others (``OMP_WAIT_POLICY``, ``OMP_PROC_BIND``...). So:

* :func:`start_server` starts the server with the settings that every
  process of the deployment wants, so that ``omni serve``'s processes all
  fork from it;
* :func:`fork_can_serve` tells, per process, whether the running server read
  the settings that process wants; a process that wants others is spawned
  (a fresh interpreter reads its own), which is slower to start and right.

``OMP_NUM_THREADS`` is not one of them: the child applies its thread count
through torch at run time (``plan.threads.apply_cpu_threads``).

The server's settings are read from its own environment block
(``/proc/<pid>/environ``). Where that cannot be read (no ``/proc``), the
parent's current environment stands in for it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

#: Variables the OpenMP runtimes read when they load (GNU's ``OMP_``/``GOMP_``,
#: Intel's ``KMP_``).
LOAD_TIME_PREFIXES = ("OMP_", "GOMP_", "KMP_")
#: ... except those omni applies at run time in the child.
APPLIED_AT_RUN_TIME = frozenset({"OMP_NUM_THREADS"})

Settings = dict[str, str]

#: How long to wait for a server just started to have exec'd (it takes milliseconds).
EXEC_WAIT_SECONDS = 5.0


def openmp_settings(environ: Mapping[str, str]) -> Settings:
    """The load-time OpenMP variables of ``environ``."""
    return {
        key: value
        for key, value in environ.items()
        if key.startswith(LOAD_TIME_PREFIXES) and key not in APPLIED_AT_RUN_TIME
    }


def wanted_settings(process_env: Mapping[str, str], environ: Mapping[str, str]) -> Settings:
    """What a stage process will have: the plan's env under the parent's (the user's wins)."""
    return openmp_settings({**process_env, **environ})


def common_settings(wanted: Iterable[Settings]) -> Settings:
    """The settings every process wants alike (a key some lack or differ on is left out)."""
    wanted = list(wanted)
    if not wanted:
        return {}
    first, *rest = wanted
    return {k: v for k, v in first.items() if all(w.get(k) == v for w in rest)}


def _server() -> Any:
    from multiprocessing import forkserver

    return getattr(forkserver, "_forkserver", None)


def server_pid() -> int | None:
    """The pid of this process's running fork server, or None."""
    return getattr(_server(), "_forkserver_pid", None)


def server_settings() -> Settings | None:
    """The load-time OpenMP settings the running fork server started with, or None."""
    pid = server_pid()
    if pid is None:
        return None
    try:
        _wait_for_exec(pid)
        with open(f"/proc/{pid}/environ", "rb") as handle:
            block = handle.read()
    except OSError:
        return openmp_settings(os.environ)  # no /proc: the parent's stands in
    pairs = (entry.decode(errors="replace").partition("=") for entry in block.split(b"\0"))
    return openmp_settings({key: value for key, _, value in pairs if key})


def _wait_for_exec(pid: int, timeout: float = EXEC_WAIT_SECONDS) -> None:
    """Until the server just started has exec'd: before that its environment block
    is its parent's, or empty while the exec replaces it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            if b"multiprocessing.forkserver" in handle.read():
                return
        time.sleep(0.001)


#: The settings the latest deployment asked the server to start with: a server that
#: died (the OOM killer, say; its stage processes die with it) is started again with
#: them when the next process starts, so the restarted processes still fork.
_requested: Settings = {}


def start_server(settings: Settings) -> None:
    """Start the fork server (if it is not running) with ``settings`` in its environment.

    Quick (one fork and exec; the server's imports happen after), so it runs
    on the caller's thread; the environment is extended only for that moment,
    and a variable the parent has keeps the parent's value. Call after the
    preload list is set (``local.start_context``). The settings are kept for a
    restart of the server (:func:`fork_can_serve`).
    """
    global _requested
    _requested = dict(settings)
    _ensure_running(settings)


def _ensure_running(settings: Settings) -> None:
    from multiprocessing import forkserver

    added = {k: v for k, v in settings.items() if k not in os.environ}
    for key, value in added.items():
        os.environ[key] = value
    try:
        forkserver.ensure_running()
    finally:
        for key in added:
            os.environ.pop(key, None)


def fork_can_serve(wanted: Settings) -> bool:
    """Whether a process wanting ``wanted`` gets it when forked from the running server.

    Starts the server first if it is not running, with the settings the latest
    :func:`start_server` asked for.
    """
    _ensure_running(_requested)
    return server_settings() == wanted
