"""The compute thread: where every stage's torch work runs, one job at a time."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading

import anyio
import pytest
import torch

from omni_core.engine.compute import call_on_compute_thread, compute_thread, run_compute

pytestmark = pytest.mark.anyio


async def test_jobs_run_on_the_compute_thread_in_order_and_return_results():
    order: list[int] = []

    def job(i: int) -> str:
        order.append(i)
        return threading.current_thread().name

    async with anyio.create_task_group() as tg:
        names: list[str] = []

        async def one(i: int) -> None:
            names.append(await run_compute(job, i))

        for i in range(5):
            tg.start_soon(one, i)
            await anyio.sleep(0)  # submitted in this order
    assert order == [0, 1, 2, 3, 4]
    assert set(names) == {"omni-compute"}
    assert compute_thread().thread.daemon  # never holds the process open at exit


async def test_a_failing_job_raises_in_the_caller_and_the_thread_goes_on():
    def boom() -> None:
        raise ValueError("bad shapes")

    with pytest.raises(ValueError, match="bad shapes"):
        await run_compute(boom)
    assert await run_compute(lambda: 41 + 1) == 42


async def test_a_cancelled_caller_waits_for_its_job_to_finish():
    started, release = threading.Event(), threading.Event()
    finished: list[bool] = []

    def step() -> None:
        started.set()
        release.wait(5)
        finished.append(True)

    scope = anyio.CancelScope()
    returned = anyio.Event()

    async def call() -> None:
        with scope:
            await run_compute(step)
        returned.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        await anyio.to_thread.run_sync(started.wait, 5)
        scope.cancel()
        await anyio.sleep(0.05)
        assert not returned.is_set() and not finished  # cancelled, still waiting for the step
        release.set()
    assert scope.cancelled_caught and finished == [True]


async def test_without_dedicate_a_job_runs_with_the_callers_thread_count(monkeypatch):
    from omni_core.engine import compute

    # a compute thread of its own: another test in this process may have dedicated the
    # process's one (a fixed count), which is what this test is without
    monkeypatch.setattr(compute, "_current", None)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert await run_compute(torch.get_num_threads) == 1
        torch.set_num_threads(2)
        assert await run_compute(torch.get_num_threads) == 2
    finally:
        torch.set_num_threads(before)
        if compute._current is not None:
            compute._current.stop(5)


DEDICATE = textwrap.dedent(
    """
    import json, os, threading, time, torch
    from omni_core.engine.compute import compute_thread, dedicate

    def tasks():
        return len(os.listdir("/proc/self/task"))

    torch.ones(1 << 22).sum()  # the main thread's OpenMP team, as loading makes it
    alone = tasks()
    dedicate(2)
    on_compute = compute_thread().submit(
        lambda: (torch.ones(1 << 22).sum(), torch.get_num_threads())[1]
    ).result()
    for _ in range(100):  # a released thread may take a moment to be gone
        if tasks() <= alone + 1:
            break
        time.sleep(0.05)
    after = tasks()
    seen = []
    other = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    other.start(); other.join()
    print(json.dumps({"alone": alone, "after": after, "compute": on_compute,
                      "main": torch.get_num_threads(), "other": seen[0]}))
    """
)


@pytest.mark.skipif(sys.platform != "linux", reason="counts threads in /proc")
def test_dedicate_leaves_the_compute_thread_the_only_openmp_team():
    done = subprocess.run(
        [sys.executable, "-c", DEDICATE],
        capture_output=True,
        text=True,
        timeout=120,
        env={"OMP_NUM_THREADS": "2", "PATH": "/usr/bin:/bin"},
        check=True,
    )
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["compute"] == 2  # the planned count, on the compute thread
    assert figures["main"] == 1 and figures["other"] == 1  # every other thread: one
    # Before: main + its team's worker. After: main + the compute thread + its
    # worker; had the main thread's team stayed, one thread more.
    assert figures["after"] == figures["alone"] + 1, figures


async def test_a_cancelled_callers_job_that_has_not_started_never_runs():
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def blocker() -> None:
        started.set()
        release.wait(5)
        ran.append("blocker")

    async with anyio.create_task_group() as tg:
        tg.start_soon(run_compute, blocker)
        await anyio.to_thread.run_sync(started.wait, 5)
        with anyio.CancelScope() as queued:
            queued.cancel()
            await run_compute(ran.append, "queued")  # behind the blocker: dropped
        release.set()
    assert await run_compute(lambda: list(ran)) == ["blocker"]


def test_call_on_compute_thread_runs_there_and_inline_from_there():
    worker = compute_thread().thread
    assert call_on_compute_thread(threading.current_thread) is worker

    def nested() -> threading.Thread:  # would wait for itself if it queued the inner call
        return call_on_compute_thread(threading.current_thread)

    assert compute_thread().submit(nested).result(timeout=10) is worker


def test_a_finished_job_leaves_nothing_alive_on_the_compute_thread():
    """The thread waits for its next job holding none of the last one's arguments or result."""
    import gc
    import weakref

    class Model:  # stands for a model or a tensor a job was given and returned
        pass

    given, returned = Model(), Model()
    refs = [weakref.ref(given), weakref.ref(returned)]
    pair = compute_thread().submit(lambda a, b: (a, b), given, returned).result()
    assert pair == (given, returned)
    del pair
    del given, returned
    gc.collect()
    assert [ref() for ref in refs] == [None, None]


EXITING = textwrap.dedent(
    """
    import sys, time
    from omni_core.engine.compute import compute_thread

    def job(path):
        time.sleep(0.5)  # the interpreter is finalizing by now, unless exit waits
        with open(path, "w") as out:
            out.write("done")

    compute_thread().submit(job, sys.argv[1])
    """
)


def test_a_process_exits_after_its_compute_job_ends_not_inside_it(tmp_path) -> None:
    """Exit lets the running job finish and the thread end, so that no daemon thread is
    cut off inside torch by the interpreter's finalization (which aborts the process)."""
    marker = tmp_path / "done"
    done = subprocess.run(
        [sys.executable, "-c", EXITING, str(marker)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert marker.read_text() == "done"
