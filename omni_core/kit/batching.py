"""Requests that arrive while an encoder is busy are encoded together, in one call.

An encoder stage (audio tower, vision tower) is a plain function of a list
of inputs, and on a CPU or GPU one call over eight clips costs far less than
eight calls over one: the weights are read once and the matrices are taller.
Requests reach a stage one coroutine each, so :class:`Coalescer` queues them
and lets one waiter at a time run a batch of the oldest (up to
``max_batch_size``) in a worker thread; whoever arrives meanwhile joins the
next batch. Nothing waits on a timer: a lone request runs at once, and
batches form only from requests that would have waited anyway.

Cancellation: a request cancelled while queued leaves the queue; one
cancelled while its batch runs gets no result, and the batch (others' work)
runs to the end, shielded. The waiter that runs a batch hands the turn to
the oldest queued request when its own result is in, so no request keeps
working for others indefinitely.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import anyio

from ..engine.compute import run_compute

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass(eq=False)
class _Slot(Generic[Item]):
    item: Item
    changed: anyio.Event = field(default_factory=anyio.Event)
    finished: bool = False
    result: Any = None
    error: BaseException | None = None

    def wake(self) -> None:
        self.changed.set()


class Coalescer(Generic[Item, Result]):
    """Runs ``run_batch(items) -> results`` (same order and length) over queued requests."""

    def __init__(self, run_batch: Callable[[list[Item]], Sequence[Result]], max_batch_size: int):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        self.run_batch = run_batch
        self.max_batch_size = max_batch_size
        self._queue: list[_Slot[Item]] = []
        self._running = False
        self.batch_sizes: list[int] = []  # every batch's size, for tests and benchmarks

    async def submit(self, item: Item) -> Result:
        """The result for ``item``, computed in a batch with whatever else is queued."""
        slot = _Slot(item)
        self._queue.append(slot)
        try:
            while not slot.finished:
                if self._running:
                    await slot.changed.wait()
                    slot.changed = anyio.Event()
                    continue
                self._running = True
                try:
                    with anyio.CancelScope(shield=True):
                        await self._run_oldest()
                finally:
                    self._running = False
                    self._pass_turn()
        except BaseException:
            if slot in self._queue:
                self._queue.remove(slot)
            if not self._running:
                self._pass_turn()
            raise
        if slot.error is not None:
            raise slot.error
        return slot.result

    async def _run_oldest(self) -> None:
        batch = self._queue[: self.max_batch_size]
        del self._queue[: len(batch)]
        self.batch_sizes.append(len(batch))
        try:
            results = await run_compute(self.run_batch, [s.item for s in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"a batch of {len(batch)} gave {len(results)} results")
        except Exception as exc:  # every request of the batch fails with the same error
            for slot in batch:
                slot.error, slot.finished = exc, True
                slot.wake()
            return
        for slot, result in zip(batch, results, strict=True):
            slot.result, slot.finished = result, True
            slot.wake()

    def _pass_turn(self) -> None:
        """The oldest queued request runs the next batch."""
        if self._queue:
            self._queue[0].wake()
