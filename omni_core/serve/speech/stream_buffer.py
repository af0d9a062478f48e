"""One segment of a speech WebSocket session: its text and the audio held for the socket.

The buffer is what bounds a session's memory: a segment's request is not
read further while its held audio is past the limit, so a client that reads
slowly slows its own requests instead of growing the server.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import anyio

from ..common.errors import APIError


class AudioBuffer:
    """One segment's PCM between its request and the socket: ``put`` waits past ``limit`` bytes.

    A chunk bigger than the limit still goes in when the buffer is empty, so
    the buffer never blocks a segment for good.
    """

    def __init__(self, limit: int, on_change: Any):
        self.limit, self.on_change = limit, on_change  # on_change(delta_bytes)
        self.chunks: deque[bytes] = deque()
        self.size = 0
        self.closed = False
        self.started = anyio.Event()  # the first chunk came, or the request ended
        self._wake = anyio.Event()

    async def put(self, pcm: bytes) -> None:
        while self.size and self.size + len(pcm) > self.limit:
            await self._changed()
        self.chunks.append(pcm)
        self.size += len(pcm)
        self.on_change(len(pcm))
        self.started.set()
        self._notify()

    async def get(self) -> bytes | None:
        """The next chunk; None once the request ended and everything was taken."""
        while not self.chunks:
            if self.closed:
                return None
            await self._changed()
        pcm = self.chunks.popleft()
        self.size -= len(pcm)
        self.on_change(-len(pcm))
        self._notify()
        return pcm

    def close(self) -> None:
        self.closed = True
        self.started.set()
        self._notify()

    def drop(self) -> None:
        """Forget what is held (the session ended); the counters go back down."""
        self.on_change(-self.size)
        self.chunks.clear()
        self.size = 0
        self.close()

    async def _changed(self) -> None:
        await self._wake.wait()

    def _notify(self) -> None:
        self._wake.set()
        self._wake = anyio.Event()


@dataclass
class Segment:
    index: int
    text: str
    audio: AudioBuffer
    finish_reason: str = "stop"
    error: APIError | None = None
