"""SIGTERM unwinds a script like Ctrl-C, so that what it made is removed.

Python's default SIGTERM ends a process on the spot: no ``finally`` block, no
context manager's exit and no ``atexit`` handler runs. A test run or a
benchmark stopped by a time limit (``timeout``, CI, a GPU lease ending a
command) then leaves its temporary directories, runtime sockets and child
processes' state behind. With :func:`unwind_on_sigterm` the signal raises
:class:`Terminated` (a ``KeyboardInterrupt``) in the main thread instead,
which unwinds exactly as Ctrl-C does; pytest reports the run as interrupted
and still tears its fixtures down. :func:`run_script` does the same for a
script's ``main`` and exits with 143, the status a shell gives for SIGTERM.

The first SIGTERM raises; later ones, and SIGINTs, are ignored while it
unwinds. A process often gets more than one (``timeout`` signals the whole
process group, the parent that stops its child signals it again, and
pytest-xdist's worker sends itself SIGINT when its cleanup takes over 5 s),
and a second exception in the middle of cleanup would leave the very things
this is for. Supervisors that lose patience send SIGKILL, which nothing can
handle.
:func:`run_child` runs a child process that gets time to unwind likewise.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

#: A shell's exit status for a process ended by SIGTERM (128 + 15).
EXIT_TERMINATED = 128 + signal.SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: unwind as for Ctrl-C."""


_raised = threading.Event()
_forward = threading.Event()


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    if _raised.is_set():
        return
    _raised.set()
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _raise_terminated)  # ignored from now on, as above
    if _forward.is_set() and signum == signal.SIGTERM:
        for pid in children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    raise Terminated(f"received {signal.Signals(signum).name}")


def unwind_on_sigterm(*, forward_to_children: bool = False) -> bool:
    """Turn SIGTERM into :class:`Terminated` in this (main) thread; False if it cannot.

    Only the main thread can set a handler, and only a default one is
    replaced: a program that handles SIGTERM itself (``omni serve``, a Ray
    worker) keeps its own. ``forward_to_children`` sends the signal on to
    this process's children first: pytest-xdist's workers, which a group
    signal misses once one of them leads a process group of its own (starting
    a Ray head node makes it one). Not for children that take a second SIGTERM
    as "hurry" (``omni serve``): they get the group's signal already.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    if forward_to_children:
        _forward.set()
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return signal.getsignal(signal.SIGTERM) is _raise_terminated
    signal.signal(signal.SIGTERM, _raise_terminated)
    return True


def children() -> list[int]:
    """This process's child processes (Linux: /proc; elsewhere none are known)."""
    pids: list[int] = []
    for listing in Path("/proc/self/task").glob("*/children"):
        with contextlib.suppress(OSError):
            pids += [int(pid) for pid in listing.read_text().split()]
    return pids


@contextmanager
def signal_handlers_kept() -> Iterator[None]:
    """SIGTERM's and SIGINT's handlers put back as they were, whatever the block set.

    ``ray.init`` replaces both with a ``sys.exit``: a test or a launcher that
    joins a cluster would then stop mid-way on SIGTERM, without its cleanup.
    Off the main thread, where no handler can be set, it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for number, handler in kept.items():
            if handler is not None:  # None: set outside Python, cannot be put back
                signal.signal(number, handler)


def run_script(main: Callable[[], int | None]) -> NoReturn:
    """``sys.exit(main())``, where SIGTERM unwinds ``main`` and exits with 143."""
    unwind_on_sigterm()
    try:
        status = main()
    except Terminated:
        print("terminated (SIGTERM): stopped after cleaning up", file=sys.stderr)
        status = EXIT_TERMINATED
    sys.exit(status)


def run_child(
    argv: Sequence[str], *, timeout: float | None = None, grace: float = 30, **popen: Any
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True, timeout=...)``, but a child
    stopped early (the timeout, or this process interrupted) gets SIGTERM and up to
    ``grace`` seconds to clean up before SIGKILL; ``subprocess.run`` kills it at once.

    Raises ``subprocess.TimeoutExpired`` (with what the child printed) on the
    timeout, and re-raises an interrupt once the child is gone.
    """
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen
    ) as child:
        # interrupted, communicate() would first wait 0.25 s on its own for the child to
        # exit (CPython's Popen._sigint_wait_secs): _stop signals it at once instead
        child._sigint_wait_secs = 0  # type: ignore[attr-defined]
        try:
            out, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            out, err = _stop(child, grace)
            raise subprocess.TimeoutExpired(list(argv), timeout or 0, out, err) from None
        except BaseException:
            _stop(child, grace)
            raise
    return subprocess.CompletedProcess(list(argv), child.returncode, out, err)


def _stop(child: subprocess.Popen[str], grace: float) -> tuple[str, str]:
    """SIGTERM, then what it prints until it exits, SIGKILL after ``grace`` seconds."""
    if child.poll() is None:
        child.terminate()
    try:
        return child.communicate(timeout=grace)
    except subprocess.TimeoutExpired:
        child.kill()
        return child.communicate()
