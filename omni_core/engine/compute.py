"""One thread per process runs its torch compute: the engine's steps, codecs, encoders.

Why one thread, and why it matters on the CPU: torch parallelises each op
with OpenMP, and GNU OpenMP (the runtime torch ships) gives every OS thread
that starts a parallel region a team of its own. Once a process holds more
OpenMP threads than it has cores (the loop thread's team from loading the
model, plus a team for each worker thread a step happened to run on), the
runtime stops letting idle team members spin between regions and puts them
to sleep instead, and waking them costs tens of microseconds at every op. A
decode step is a thousand short ops, so measured here (2 cores, a bf16
3072x1024 matrix-vector product): 0.30 ms on the thread that owns the only
team, 0.43 ms on a worker thread beside the loop thread's team; a Qwen3-TTS
0.6B frame spent 250 ms in those products in the engine's worker thread
against 180 ms on the main thread.

So a stage process, once built (:func:`dedicate`):

* gives the compute thread the process's planned thread count;
* drops the loop thread to one torch thread and releases its OpenMP team
  (``omp_pause_resource_all``), so the compute thread's team is the only one;
* leaves every other thread at one torch thread (torch starts each new
  thread at the count last set, here the loop thread's one).

The team's idle threads then spin between ops (OpenMP's default spin,
milliseconds), which is what makes the step fast and what a process sharing
its cores with others cannot afford: the plan shortens it there
(``plan/threads.py``, ``GOMP_SPINCOUNT``).

Every heavy call then goes through :func:`run_compute`, one at a time, in
submission order; two stages of one process no longer run their compute side
by side, which on a CPU only split the same cores. Without :func:`dedicate`
(tests, scripts, a process that never loaded torch) the thread starts on
first use and runs each job at the caller's torch thread count, as a worker
thread would. On CUDA the same thread launches the kernels; nothing changes.

A cancelled caller drops its job if it has not started, and otherwise waits
for it to end (a step half done must not race the next one) before it sees
the cancellation: a client gone leaves no backlog of its chunks to decode.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import os
import queue
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import anyio

Result = TypeVar("Result")

FOLLOW_CALLER = 0  # the compute thread's thread count: the submitting thread's, per job


class ComputeThread:
    """A daemon thread that runs submitted callables in order (``Future`` results).

    A daemon, so a job blocked for good (a tensor-parallel follower waiting
    for its leader) never holds the process open at exit; any other job is let
    finish there first (:func:`_stop_at_exit`).
    """

    def __init__(self) -> None:
        self.threads = FOLLOW_CALLER
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple, int]] = (
            queue.SimpleQueue()
        )
        self.thread = threading.Thread(target=self._loop, name="omni-compute", daemon=True)
        self.thread.start()

    def submit(self, fn: Callable[..., Result], *args: Any) -> Future[Result]:
        future: Future[Result] = Future()
        self._jobs.put((future, fn, args, _caller_threads() if not self.threads else 0))
        return future

    def fix_threads(self, number: int) -> None:
        """Run every job from now on with ``number`` torch threads (a job of its own)."""

        def fix() -> None:
            self.threads = number
            _set_torch_threads(number)

        if threading.current_thread() is self.thread:
            fix()
        else:
            self.submit(fix).result()

    def stop(self, timeout: float) -> None:
        """End the thread once the jobs before this call are done, waiting ``timeout`` s at most."""
        self._jobs.put(None)  # type: ignore[arg-type]
        self.thread.join(timeout)

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            self._run(job)
            del job  # waiting for the next, hold nothing of this one (see _run)

    @staticmethod
    def _run(job: tuple[Future, Callable[..., Any], tuple[Any, ...], int | None]) -> None:
        # A function of its own, so that the job's function, arguments and result
        # die when it returns: held in the loop's locals, the last job's model and
        # tensors stayed alive while the thread waited (a benchmark's freed model,
        # 10.5 GB of it, and the reference it then runs was killed for memory).
        future, fn, args, wanted = job
        if not future.set_running_or_notify_cancel():
            return
        if wanted:
            _set_torch_threads(wanted)
        try:
            result = fn(*args)
        except BaseException as exc:
            future.set_exception(exc)
        else:
            future.set_result(result)


_current: ComputeThread | None = None
_lock = threading.Lock()


def _forget_after_fork() -> None:
    global _current, _lock
    _current, _lock = None, threading.Lock()  # a forked child has no compute thread


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


#: How long a process at exit waits for its compute thread's jobs to end.
EXIT_WAIT_SECONDS = 10.0


@atexit.register
def _stop_at_exit() -> None:
    """Let the compute thread finish its job and end before the interpreter does.

    Why: a benchmark that had printed all its figures died at exit, now and
    then under load, with "terminate called without an active exception"
    (exit -6). The likely cause, not reproduced on demand: a daemon thread
    still inside torch when the interpreter finalizes is ended by
    ``pthread_exit`` as soon as it wants the GIL back, a forced unwinding that
    aborts in torch's C++ frames. Ended here first, the thread leaves as any
    thread does, its OpenMP team with it. A job blocked for good (a
    tensor-parallel follower) is waited for ``EXIT_WAIT_SECONDS`` only.
    """
    global _current
    with _lock:
        current, _current = _current, None
    if current is not None and threading.current_thread() is not current.thread:
        current.stop(EXIT_WAIT_SECONDS)


def compute_thread() -> ComputeThread:
    """The process's compute thread, started on first use (following callers' thread counts)."""
    global _current
    with _lock:
        if _current is None:
            _current = ComputeThread()
        return _current


def dedicate(threads: int | None) -> ComputeThread:
    """Make the compute thread the only OpenMP team of this process, with ``threads`` threads.

    Called once by a stage process after its stages are built (the loop thread
    loaded the weights with every core). ``threads`` None or 0: the count the
    calling thread has now. A process without torch only starts the thread.
    """
    torch = sys.modules.get("torch")
    current = compute_thread()
    number = threads or (torch.get_num_threads() if torch is not None else 0)
    if number:
        current.fix_threads(number)  # before the loop thread's count below: new threads copy it
    if torch is not None:
        torch.set_num_threads(1)  # this thread, and every thread started from now on
        _release_openmp_team()
    return current


def call_on_compute_thread(fn: Callable[..., Result], *args: Any) -> Result:
    """``fn(*args)`` on the compute thread, blocking the caller (start-up work, not serving).

    For work whose result depends on the thread it runs on, as a compiled
    step's guards do on the thread count. Called from the compute thread
    itself, it runs ``fn`` at once rather than wait for itself.
    """
    current = compute_thread()
    if threading.current_thread() is current.thread:
        return fn(*args)
    return current.submit(fn, *args).result()


async def run_compute(fn: Callable[..., Result], *args: Any) -> Result:
    """``fn(*args)`` on the compute thread, after the jobs before it; the loop serves meanwhile.

    Measured with both Qwen3-TTS stages in one process on 2 cores, running a
    vocoder chunk beside a step on a one-thread side thread cost 16% of the
    throughput at concurrency 8 against running it between steps: a team
    member that loses its core stalls the whole step.
    """
    future = compute_thread().submit(fn, *args)
    try:
        return await _wait(future)
    except BaseException:
        # Cancelled: a job still queued is dropped; one already running ends first
        # (a step half done must not race the next one, nor its caller's cleanup).
        if not future.cancel() and not future.done():
            with anyio.CancelScope(shield=True):
                with contextlib.suppress(Exception):
                    await _wait(future)
        raise


async def _wait(future: Future[Result]) -> Result:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # trio: a worker thread waits for the future
        return await anyio.to_thread.run_sync(future.result, abandon_on_cancel=True)
    return await asyncio.wrap_future(future, loop=loop)


def _caller_threads() -> int:
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else 0


def _set_torch_threads(number: int) -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != number:
        torch.set_num_threads(number)


def _release_openmp_team() -> None:
    """Free the calling thread's OpenMP team (OpenMP 5's ``omp_pause_resource_all``).

    Its idle threads would otherwise count against the cores for good and
    throttle the compute thread's team (module docstring). A no-op where the
    runtime has no such call (an older or other OpenMP).
    """
    library = _openmp_library()
    if library is None:
        return
    with contextlib.suppress(AttributeError, OSError):
        library.omp_pause_resource_all(1)  # omp_pause_soft


def _openmp_library() -> Any:
    """The OpenMP runtime torch loaded (GNU ``libgomp`` or LLVM ``libomp``), or None."""
    if not os.path.exists("/proc/self/maps"):
        return None
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        for line in maps:
            path = line.split()[-1] if line.strip() else ""
            name = os.path.basename(path)
            if name.startswith(("libgomp", "libomp", "libiomp")) and ".so" in name:
                with contextlib.suppress(OSError):
                    return ctypes.CDLL(path)
    return None
