"""The vocoder's decode batcher: same-shape chunks waiting together go in one decode."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
import torch

from omni_core.engine.compute import compute_thread
from omni_qwen3_tts.decode_batcher import DecodeBatcher

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


class Recorder:
    """A stand-in codec: audio = the codes summed, so results can be checked per row."""

    def __init__(self, fail: bool = False):
        self.calls: list[tuple[int, int, int]] = []
        self.fail = fail

    def __call__(self, codes: torch.Tensor, contexts: list[int]) -> torch.Tensor:
        assert len(set(contexts)) == 1  # one key, one context
        context = contexts[0]
        self.calls.append((codes.shape[0], codes.shape[2], context))
        if self.fail:
            raise RuntimeError("codec broke")
        return codes.sum(dim=1)[:, context:].float()


@asynccontextmanager
async def engine_step_running(batcher: DecodeBatcher, chunks: int) -> AsyncIterator[None]:
    """Hold the compute thread (as an engine step does) until ``chunks`` chunks wait.

    What serving looks like: the step that made the chunks' frames is already
    followed by the next one on the compute thread when the chunks arrive.
    """
    gate = threading.Event()
    step = compute_thread().submit(gate.wait)
    try:
        yield
        with anyio.fail_after(10):
            while len(batcher.pending) < chunks:
                await anyio.sleep(0)
    finally:
        gate.set()
        step.result()


async def _decode_all(batcher: DecodeBatcher, items: list[tuple[torch.Tensor, int]]) -> list:
    results: list = [None] * len(items)

    async def one(i: int) -> None:
        codes, context = items[i]
        results[i] = await batcher.decode(codes, context, context)

    async with anyio.create_task_group() as group, engine_step_running(batcher, len(items)):
        for i in range(len(items)):
            group.start_soon(one, i)
    return results


async def test_chunks_that_arrive_behind_a_running_step_share_one_decode():
    recorder = Recorder()
    batcher = DecodeBatcher(recorder, max_batch=16)
    items = [(torch.full((5, 16), i), 2) for i in range(6)]
    results = await _decode_all(batcher, items)
    # the batch is taken when the compute thread starts it, so the first caller's
    # chunk does not leave alone: all six arrived while the step ran
    assert recorder.calls == [(6, 5, 2)]
    for i, audio in enumerate(results):
        assert torch.equal(audio, torch.full((3,), 16.0 * i))


async def test_shapes_are_never_mixed_and_max_batch_is_kept():
    recorder = Recorder()
    batcher = DecodeBatcher(recorder, max_batch=2)
    items = [(torch.ones(4, 16), 0)] + [(torch.ones(7, 16), 3)] * 3 + [(torch.ones(4, 16), 0)]
    await _decode_all(batcher, items)
    # the oldest chunk's length first, both of them; then the three others, two at most
    assert recorder.calls == [(2, 4, 0), (2, 7, 3), (1, 7, 3)]
    assert batcher.chunks == 5


async def test_a_failing_decode_fails_every_chunk_of_its_batch():
    recorder = Recorder(fail=True)
    batcher = DecodeBatcher(recorder, max_batch=4)
    errors: list[BaseException] = []

    async def one() -> None:
        with pytest.raises(RuntimeError, match="codec broke") as caught:
            await batcher.decode(torch.ones(3, 16), 0, 0)
        errors.append(caught.value)

    async with anyio.create_task_group() as group, engine_step_running(batcher, 3):
        for _ in range(3):
            group.start_soon(one)
    assert len(errors) == 3
    # one batch of the three, and all three fail with its cause
    assert recorder.calls == [(3, 3, 0)]
    assert batcher.batches == batcher.chunks == 0
    assert not batcher.busy and not batcher.pending


async def test_each_row_of_a_batch_gets_its_own_payload_in_order():
    seen: list[list[str]] = []

    def decode(codes: torch.Tensor, payloads: list[str]) -> torch.Tensor:
        seen.append(list(payloads))
        return codes[:, 0, :]  # audio = codebook 0, so each row is recognisable

    batcher = DecodeBatcher(decode, max_batch=8)
    results: dict[str, torch.Tensor] = {}

    async def one(name: str, value: int) -> None:
        results[name] = await batcher.decode(torch.full((3, 16), value), "stream", name)

    async with anyio.create_task_group() as group:
        for value, name in enumerate("abcd"):
            group.start_soon(one, name, value)
    assert sorted(p for batch in seen for p in batch) == ["a", "b", "c", "d"]
    for value, name in enumerate("abcd"):
        assert torch.equal(results[name], torch.full((3,), value))


async def test_chunks_of_other_lengths_waiting_behind_a_batch_are_left_alone():
    """Taking a batch out of the queue must not compare chunks' codes (shapes differ)."""
    recorder = Recorder()
    batcher = DecodeBatcher(recorder, max_batch=4)
    lengths = [3, 8, 3, 5, 8, 3, 1]
    items = [(torch.full((n, 16), i, dtype=torch.long), 0) for i, n in enumerate(lengths)]
    results = await _decode_all(batcher, items)
    for (codes, _), audio in zip(items, results, strict=True):
        assert torch.equal(audio, codes.sum(dim=1).float())
    assert len(recorder.calls) < len(lengths)  # equal lengths waiting together were batched


async def test_the_leader_returns_once_its_own_chunk_is_done_and_hands_the_lead_on():
    """Under steady load the queue never empties: a leader that drained it all never
    returned, and its stream stalled until the request timed out (seen in the soak)."""
    recorder = Recorder()
    batcher = DecodeBatcher(recorder, max_batch=1)
    returned_after: dict[str, int] = {}

    async def one(name: str) -> None:
        await batcher.decode(torch.ones(2, 16), 0, 0)
        returned_after[name] = len(recorder.calls)

    async with anyio.create_task_group() as group:
        for index in range(12):
            group.start_soon(one, f"c{index}")
    assert len(recorder.calls) == 12
    assert returned_after["c0"] == 1  # its own decode only, not everyone's
    assert sorted(returned_after.values()) == list(range(1, 13))  # in arrival order, one by one


async def test_a_cancelled_waiter_leaves_the_queue_and_the_lead_goes_on():
    recorder = Recorder()
    batcher = DecodeBatcher(recorder, max_batch=1)
    done: list[str] = []

    async def one(name: str, scope: anyio.CancelScope | None = None) -> None:
        if scope is None:
            await batcher.decode(torch.ones(2, 16), 0, 0)
        else:
            with scope:
                await batcher.decode(torch.ones(2, 16), 0, 0)
        done.append(name)

    doomed = anyio.CancelScope()
    async with anyio.create_task_group() as group:
        group.start_soon(one, "first")
        group.start_soon(one, "doomed", doomed)
        group.start_soon(one, "last")
        await anyio.sleep(0)  # all three queued; the first leads
        doomed.cancel()
    assert "first" in done and "last" in done
    assert len(recorder.calls) == 2  # the cancelled chunk was never decoded
