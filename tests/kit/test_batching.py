"""Coalescer: queued requests share one call, lone ones do not wait, cancellation is clean."""

from __future__ import annotations

import threading

import anyio
import pytest

from omni_core.kit.batching import Coalescer

pytestmark = pytest.mark.anyio


class Gate:
    """A batch function that blocks until released, recording every batch it saw."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.release = threading.Event()
        self.entered = threading.Event()

    def __call__(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        self.entered.set()
        self.release.wait(10)
        return [i * 10 for i in items]


async def test_a_lone_request_runs_at_once_alone() -> None:
    coalescer = Coalescer(lambda items: [i + 1 for i in items], max_batch_size=4)
    assert await coalescer.submit(41) == 42
    assert coalescer.batch_sizes == [1]


async def test_requests_arriving_while_busy_share_the_next_call_in_order() -> None:
    gate = Gate()
    coalescer = Coalescer(gate, max_batch_size=3)
    results: dict[int, int] = {}

    async def one(i: int) -> None:
        results[i] = await coalescer.submit(i)

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, 0)
        await anyio.to_thread.run_sync(gate.entered.wait, 5)
        for i in range(1, 6):  # five arrive while the first batch runs
            tg.start_soon(one, i)
        await anyio.sleep(0.05)
        gate.release.set()
    assert results == {i: i * 10 for i in range(6)}
    assert gate.batches == [[0], [1, 2, 3], [4, 5]]


async def test_a_request_cancelled_while_queued_leaves_the_queue() -> None:
    gate = Gate()
    coalescer = Coalescer(gate, max_batch_size=8)
    results: dict[int, int] = {}

    async def one(i: int) -> None:
        results[i] = await coalescer.submit(i)

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, 0)
        await anyio.to_thread.run_sync(gate.entered.wait, 5)
        doomed = anyio.CancelScope()

        async def cancelled() -> None:
            with doomed:
                await coalescer.submit(1)

        tg.start_soon(cancelled)
        tg.start_soon(one, 2)
        await anyio.sleep(0.05)
        doomed.cancel()
        await anyio.sleep(0.05)
        gate.release.set()
    assert results == {0: 0, 2: 20}
    assert gate.batches == [[0], [2]]


async def test_the_runner_cancelled_mid_batch_still_delivers_the_others() -> None:
    gate = Gate()
    coalescer = Coalescer(gate, max_batch_size=2)
    results: dict[int, int] = {}

    async def one(i: int) -> None:
        results[i] = await coalescer.submit(i)

    async with anyio.create_task_group() as tg:
        runner = anyio.CancelScope()

        async def first() -> None:
            with runner:
                await coalescer.submit(0)

        tg.start_soon(first)
        await anyio.to_thread.run_sync(gate.entered.wait, 5)
        tg.start_soon(one, 1)
        tg.start_soon(one, 2)
        tg.start_soon(one, 3)
        await anyio.sleep(0.05)
        runner.cancel()  # the batch it runs is shielded; the turn passes on
        await anyio.sleep(0.05)
        gate.release.set()
    assert results == {1: 10, 2: 20, 3: 30}
    assert gate.batches == [[0], [1, 2], [3]]


async def test_a_failed_batch_fails_each_of_its_requests_and_the_next_batch_runs() -> None:
    def sometimes(items: list[int]) -> list[int]:
        if 13 in items:
            raise ValueError("unlucky clip")
        return items

    coalescer = Coalescer(sometimes, max_batch_size=1)
    with pytest.raises(ValueError, match="unlucky"):
        await coalescer.submit(13)
    assert await coalescer.submit(7) == 7


def test_a_batch_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Coalescer(lambda items: items, max_batch_size=0)
