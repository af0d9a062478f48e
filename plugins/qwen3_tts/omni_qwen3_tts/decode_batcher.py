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
"""

from __future__ import annotations

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
        self.busy = False
        self.batches = self.chunks = 0  # for tests and figures

    async def decode(self, codes: torch.Tensor, key: Hashable, payload: Any) -> Any:
        chunk = _Chunk(codes, (codes.shape[0], key), payload)
        self.pending.append(chunk)
        while not chunk.done.is_set():
            if not self.busy:
                await self._lead(chunk)
                continue
            chunk.turn = anyio.Event()
            try:
                await chunk.turn.wait()
            except BaseException:
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
        if self.pending:
            self.pending[0].turn.set()

    async def _decode_next(self) -> None:
        key = self.pending[0].key
        batch = [c for c in self.pending if c.key == key][: self.max_batch]
        for chunk in batch:
            self.pending.remove(chunk)
        codes = torch.stack([c.codes for c in batch]).transpose(1, 2)  # [B, 16, T]
        payloads = [c.payload for c in batch]
        try:
            audio = await run_compute(self.decode_batch, codes, payloads)
        except Exception as exc:  # every chunk of the batch fails with the cause
            for chunk in batch:
                chunk.error = exc
                _finish(chunk)
            return
        self.batches += 1
        self.chunks += len(batch)
        for row, chunk in enumerate(batch):
            chunk.audio = audio[row]
            _finish(chunk)


def _finish(chunk: _Chunk) -> None:
    chunk.done.set()
    chunk.turn.set()
