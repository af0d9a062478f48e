"""Batches the vocoder's chunk decodes across concurrent requests.

Streaming requests ask for chunks of the same shape most of the time
(``chunk_frames`` new frames; behind ``left_context`` frames when decoding the
release's way), so chunks that wait at the same moment under the same key
are stacked into one ``[B, 16, T]`` decode: one pass of the codec instead of
B. Each chunk also carries a payload for the decode function (its stream
state, or its left context). No background task is needed: the first
caller that finds the batcher idle drains the queue (its own chunk and every
chunk that arrives meanwhile), the others wait for their result. The drain is
shielded from cancellation, so an aborted leader still serves the chunks it
took on; it then re-raises the cancellation.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import anyio
import torch


@dataclass(eq=False)  # chunks are found by identity: comparing their codes tensors would raise
class _Chunk:
    codes: torch.Tensor  # [T, 16]
    key: Hashable
    payload: Any
    done: anyio.Event = field(default_factory=anyio.Event)
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
        if not self.busy:
            self.busy = True
            try:
                with anyio.CancelScope(shield=True):
                    while self.pending:
                        await self._decode_next()
            finally:
                self.busy = False
        await chunk.done.wait()
        if chunk.error is not None:
            raise chunk.error
        return chunk.audio

    async def _decode_next(self) -> None:
        key = self.pending[0].key
        batch = [c for c in self.pending if c.key == key][: self.max_batch]
        for chunk in batch:
            self.pending.remove(chunk)
        codes = torch.stack([c.codes for c in batch]).transpose(1, 2)  # [B, 16, T]
        payloads = [c.payload for c in batch]
        try:
            audio = await anyio.to_thread.run_sync(self.decode_batch, codes, payloads)
        except Exception as exc:  # every chunk of the batch fails with the cause
            for chunk in batch:
                chunk.error = exc
                chunk.done.set()
            return
        self.batches += 1
        self.chunks += len(batch)
        for row, chunk in enumerate(batch):
            chunk.audio = audio[row]
            chunk.done.set()
