"""Step 4: a transport. This one wraps another and records every message it carries.

A transport is ``listen(address, secret=...)`` and ``connect(address,
secret=...)``, each returning a Channel with ``send`` / ``recv``; ``secret``
is the deployment's key, which the inner transport uses to authenticate
every connection. Wrapping the built-in ``shm`` transport
keeps tensors on the fast path and adds a trace line per message, written to
the file named by ``OMNI_HELLO_TRACE`` (one JSON object per line).
"""

from __future__ import annotations

import json
import os
from typing import Any

from omni_core import Channel, Transport


class TracedChannel(Channel):
    def __init__(self, inner: Channel, direction: str):
        self.inner, self.direction = inner, direction
        self.address = inner.address

    async def send(self, message: Any) -> None:
        _trace(self.direction, message)
        await self.inner.send(message)

    async def recv(self) -> Any:
        return await self.inner.recv()

    async def aclose(self) -> None:
        await self.inner.aclose()


class TracedTransport(Transport):
    """shm, plus a JSON line per message in $OMNI_HELLO_TRACE."""

    name = "traced"
    scopes = frozenset({"host"})

    @property
    def inner(self) -> Transport:
        # Imported on use: listing plugins must not load the shm machinery.
        from omni_core.runtime.transports.shm import ShmTransport

        return ShmTransport()

    def check_address(self, address: str) -> str:
        return self.inner.check_address(address)

    def listen(self, address: str, *, secret: bytes) -> Channel:
        return TracedChannel(self.inner.listen(address, secret=secret), "in")

    def connect(self, address: str, *, secret: bytes) -> Channel:
        return TracedChannel(self.inner.connect(address, secret=secret), "out")


def _trace(direction: str, message: Any) -> None:
    path = os.environ.get("OMNI_HELLO_TRACE")
    if not path:
        return
    record = {
        "pid": os.getpid(),
        "direction": direction,
        "kind": getattr(message, "kind", type(message).__name__),
        "source": getattr(message, "source", None),
        "target": getattr(message, "target", None),
    }
    with open(path, "a") as handle:
        handle.write(json.dumps(record) + "\n")
