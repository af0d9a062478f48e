"""``inproc``: stages of one process hand each other the Python object itself.

Nothing is copied or pickled: the receiver gets the very object that was sent
(so a sender must not mutate a message after sending it). Each address is an
anyio memory object stream in a registry local to this process. A sender may
connect before its receiver listens: its messages wait in the stream (up to
``max_buffer``, then ``send`` waits), as a socket sender waits for its peer.
"""

from __future__ import annotations

import math
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ...transport import AddressError, Channel, ChannelClosed, Transport

PREFIX = "inproc://"


class _Edge:
    """The stream behind one address; the registry keeps its sending side open."""

    def __init__(self, max_buffer: float) -> None:
        self.sender: MemoryObjectSendStream[Any]
        self.receiver: MemoryObjectReceiveStream[Any]
        self.sender, self.receiver = anyio.create_memory_object_stream(max_buffer)
        self.listening = False


_EDGES: dict[str, _Edge] = {}


class InprocReceiver(Channel):
    def __init__(self, address: str, edge: _Edge) -> None:
        self.address = address
        self._edge = edge

    async def send(self, message: Any) -> None:
        raise TypeError("this is the receiving end of an inproc edge")

    async def recv(self) -> Any:
        try:
            return await self._edge.receiver.receive()
        except (anyio.ClosedResourceError, anyio.EndOfStream) as exc:
            raise ChannelClosed(f"inproc receiver at {self.address} is closed") from exc

    async def aclose(self) -> None:
        if _EDGES.get(self.address) is self._edge:
            del _EDGES[self.address]
        self._edge.receiver.close()  # undelivered messages are dropped with it
        self._edge.sender.close()


class InprocSender(Channel):
    def __init__(self, address: str, max_buffer: float) -> None:
        self.address = address
        self._max_buffer = max_buffer
        self._closed = False

    async def send(self, message: Any) -> None:
        if self._closed:
            raise ChannelClosed(f"inproc sender to {self.address} is closed")
        edge = _EDGES.get(self.address)
        if edge is None:  # no receiver yet (or it went away): wait in a fresh stream
            edge = _EDGES[self.address] = _Edge(self._max_buffer)
        try:
            await edge.sender.send(message)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise ChannelClosed(f"inproc receiver at {self.address} closed") from exc

    async def recv(self) -> Any:
        raise TypeError("this is the sending end of an inproc edge")

    async def aclose(self) -> None:
        self._closed = True


class InprocTransport(Transport):
    """Direct object passing between stages of one process."""

    name = "inproc"
    scopes = frozenset({"process"})

    def __init__(self, max_buffer: float = math.inf) -> None:
        self.max_buffer = max_buffer

    def check_address(self, address: str) -> str:
        if not isinstance(address, str):
            raise AddressError(f"inproc: address must be a string, not {type(address).__name__}")
        name = address.removeprefix(PREFIX)
        if not name or name != name.strip():
            raise AddressError(
                f"inproc: {address!r} is not a usable name", hint="write inproc://NAME"
            )
        return PREFIX + name

    def listen(self, address: str, *, secret: bytes = b"") -> Channel:
        # Nothing leaves the process, so there is nobody to authenticate.
        key = self.check_address(address)
        edge = _EDGES.get(key)
        if edge is None:
            edge = _EDGES[key] = _Edge(self.max_buffer)
        if edge.listening:
            raise AddressError(
                f"inproc: another receiver already listens at {key}",
                hint="each edge needs its own address",
            )
        edge.listening = True
        return InprocReceiver(key, edge)

    def connect(self, address: str, *, secret: bytes = b"") -> Channel:
        return InprocSender(self.check_address(address), self.max_buffer)
