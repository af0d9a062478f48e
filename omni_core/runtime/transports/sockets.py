"""``socket``: frames over a Unix domain socket or TCP, for any two processes.

Each connection first authenticates (:mod:`._auth`). Each message is then one
frame (see :mod:`._wire`): a small skeleton, then every tensor, array and
large bytes object as raw bytes. The sender writes a
buffer's memory as it is (a non-contiguous tensor is made contiguous first);
the receiver allocates the tensor and the kernel copies the bytes into it, so
buffer data is never pickled and copied once per side.
"""

from __future__ import annotations

from ...transport import AddressError, Channel, Transport
from . import _address

# The stream machinery (asyncio, anyio) is imported by listen/connect only:
# `omni plan` checks addresses without it.


class SocketTransport(Transport):
    """Length-prefixed frames over ``unix:/path`` or ``tcp://HOST:PORT``."""

    name = "socket"
    scopes = frozenset({"host", "network"})

    def check_address(self, address: str) -> str:
        return str(_address.parse(address, transport=self.name))

    def listen(self, address: str, *, secret: bytes) -> Channel:
        from ._stream import StreamReceiver

        self.check_address(address)
        return StreamReceiver(
            _address.parse(address, transport=self.name),
            transport=self.name,
            fds=False,
            secret=secret,
        )

    def connect(self, address: str, *, secret: bytes) -> Channel:
        from ._stream import StreamSender

        return StreamSender(
            _address.parse(address, transport=self.name),
            transport=self.name,
            shm_min=None,
            secret=secret,
        )


class TcpTransport(SocketTransport):
    """The socket transport over ``tcp://HOST:PORT`` only: what edges between nodes use.

    Its own name lets a plan say which edges leave the host, and lets
    ``runtime.cross_node_transport`` be checked: a Unix address is refused here.
    """

    name = "tcp"
    scopes = frozenset({"network"})

    def check_address(self, address: str) -> str:
        parsed = _address.parse(address, transport=self.name)
        if parsed.scheme != "tcp":
            raise AddressError(
                f"tcp: {address!r} is not a TCP address", hint="write tcp://HOST:PORT"
            )
        return str(parsed)
