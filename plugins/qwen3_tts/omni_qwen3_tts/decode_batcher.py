"""Batches the vocoder's chunk decodes across concurrent requests.

Streaming requests ask for chunks of the same shape most of the time
(``chunk_frames`` new frames; behind ``left_context`` frames when decoding the
release's way), so chunks that wait at the same moment under the same key
are stacked into one ``[B, 16, T]`` decode: one pass of the codec instead of
B. Each chunk also carries a payload for the decode function (its stream
state, or its left context). No background task is needed: the first
caller that finds the batcher idle leads, decoding the queue in arrival order
(batches of others' chunks too) until its own chunk is done; then it hands
the lead to the owner of the oldest chunk still waiting and returns. A leader
that drained the whole queue instead never returned while chunks kept coming:
under steady load one request's stream stalled until its timeout. The lead
is shielded from cancellation, so an aborted leader still finishes the batch
it took on and hands over; a waiter that is cancelled takes its chunk out of
the queue, and passes the lead on if it had just been given it.

A batch is taken from the queue when the compute thread starts it, not
when the leader asks for it: the decode runs on the compute thread behind
the engine step that is running (``omni_core.engine.compute``), and the
chunks that the other requests of the step before made arrive while it
waits. Taken at submission, the first of them to reach the batcher was
decoded alone and the rest a call later; taken at the start, they share
one call (bench_moss_tts.py at 8 requests: 32 chunks in 8 codec calls ->
7, each call reading the codec's 3.5 GB of weights; 4 since the engine
admits requests when its step starts too, which keeps eight requests sent
at once in step: codec 5.2 -> 4.6 s). The
queue is therefore guarded by a lock: the event loop adds and withdraws
chunks, the compute thread takes them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import anyio
import torch

from omni_core.engine.compute import run_compute


@dataclass(eq=False)  # chunks are found by identity: comparing their codes tensors would raise
class _Chunk:
    codes: torch.Tensor  # [T, 16]
    key: Hashable
    payload: Any
    done: anyio.Event = field(default_factory=anyio.Event)
    turn: anyio.Event = field(default_factory=anyio.Event)  # done, or the lead handed over
    audio: Any = None
    error: BaseException | None = None


class DecodeBatcher:
    def __init__(self, decode_batch: Callable[[torch.Tensor, list[Any]], Any], max_batch: int):
        """``decode_batch(codes [B, 16, T], payloads) -> audio [B, N]``, run in a worker thread.

        Only chunks with equal keys (and so equal ``T``) share a batch.
        """
        self.decode_batch = decode_batch
        self.max_batch = max(1, max_batch)
        self.pending: list[_Chunk] = []
        self.lock = threading.Lock()  # pending: added to on the loop, taken on the compute thread
        self.busy = False
        self.batches = self.chunks = 0  # for tests and figures

    async def decode(self, codes: torch.Tensor, key: Hashable, payload: Any) -> Any:
        chunk = _Chunk(codes, (codes.shape[0], key), payload)
        with self.lock:
            self.pending.append(chunk)
        while not chunk.done.is_set():
            if not self.busy:
                await self._lead(chunk)
                continue
            chunk.turn = anyio.Event()
            try:
                await chunk.turn.wait()
            except BaseException:
                with self.lock:
                    if chunk in self.pending:  # gone before its turn: nobody wants its audio
                        self.pending.remove(chunk)
                if not self.busy:  # it may have just been handed the lead: pass it on
                    self._hand_over()
                raise
        if chunk.error is not None:
            raise chunk.error
        return chunk.audio

    async def _lead(self, chunk: _Chunk) -> None:
        """Decode the queue in order until ``chunk`` is done, then hand the lead over."""
        self.busy = True
        try:
            with anyio.CancelScope(shield=True):
                while self.pending and not chunk.done.is_set():
                    await self._decode_next()
        finally:
            self.busy = False
            self._hand_over()

    def _hand_over(self) -> None:
        with self.lock:
            first = self.pending[0] if self.pending else None
        if first is not None:
            first.turn.set()

    async def _decode_next(self) -> None:
        batch, audio, error = await run_compute(self._take_and_decode)
        if error is not None:  # every chunk of the batch fails with the cause
            for chunk in batch:
                chunk.error = error
                _finish(chunk)
            return
        if not batch:
            return  # every chunk waiting was withdrawn before the compute thread got here
        self.batches += 1
        self.chunks += len(batch)
        for row, chunk in enumerate(batch):
            chunk.audio = audio[row]
            _finish(chunk)

    def _take_and_decode(self) -> tuple[list[_Chunk], Any, Exception | None]:
        """On the compute thread: take the oldest chunk's batch as the queue is now, decode it.

        The chunks' events are left to the loop (``_decode_next``): anyio's
        events belong to the event loop's thread.
        """
        with self.lock:
            if not self.pending:
                return [], None, None
            key = self.pending[0].key
            batch = [c for c in self.pending if c.key == key][: self.max_batch]
            for chunk in batch:
                self.pending.remove(chunk)
        try:
            codes = torch.stack([c.codes for c in batch]).transpose(1, 2)  # [B, 16, T]
            return batch, self.decode_batch(codes, [c.payload for c in batch]), None
        except Exception as exc:
            return batch, None, exc


def _finish(chunk: _Chunk) -> None:
    chunk.done.set()
    chunk.turn.set()
