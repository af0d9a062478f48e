"""Preloaded into the fork server: it removes its socket's directory when its parent was killed.

Why: Python's fork server listens on a socket file in its parent's private
temporary directory (``/tmp/pymp-*``), and the parent removes that directory
at a normal exit. A parent killed with SIGKILL (by a user, the OOM killer, a
test) removes nothing, so every such death of ``omni serve`` left a
directory behind. The server outlives its parent by a moment: it exits when
the pipe from its parent reaches end of file, through ``SystemExit``, so the
interpreter's exit handlers run. This module, imported by the server alone
(:data:`.local.PRELOAD`; nothing else imports it), registers one that
removes the directory once the parent is gone. A parent still running keeps
its directory (it removes it itself), and a stage process forked from the
server never runs the handler (those leave through ``os._exit``; the pid is
checked too).

What it reads of ``multiprocessing``: the server's listening address, which
``multiprocessing.forkserver.main`` stores on the module's ``_forkserver``
object (Python 3.4 to 3.13). Where that is missing, nothing is removed.
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import time

from ..pids import running

#: How long the server waits for its parent to be gone before leaving the
#: directory to it: the parent's end of the pipe closes while it is being torn
#: down, moments before the kernel counts it as exited.
PARENT_EXIT_WAIT_SECONDS = 1.0

_SERVER_PID = os.getpid()
_PARENT_PID = os.getppid()


def _listening_directory() -> str | None:
    """The directory of the socket this process serves as a fork server, or None."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    address = getattr(server, "_forkserver_address", None)
    if getattr(server, "_forkserver_pid", None) is not None:
        return None  # this process started a fork server: it is a parent, not the server
    if not isinstance(address, str) or not address.startswith("/"):
        return None  # not started, or an abstract socket that leaves no file
    return os.path.dirname(address)


def _parent_gone(wait: float) -> bool:
    deadline = time.monotonic() + wait
    while running(_PARENT_PID):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def remove_socket_directory(wait: float = PARENT_EXIT_WAIT_SECONDS) -> bool:
    """Remove the dead parent's socket directory; whether anything was removed."""
    if os.getpid() != _SERVER_PID:
        return False
    directory = _listening_directory()
    if directory is None or not os.path.basename(directory).startswith("pymp-"):
        return False
    try:
        info = os.lstat(directory)
    except FileNotFoundError:
        return False  # the parent exited normally and removed it
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        return False
    if not _parent_gone(wait):
        return False
    shutil.rmtree(directory, ignore_errors=True)
    return True


atexit.register(remove_socket_directory)
