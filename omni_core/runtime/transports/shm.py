"""``shm``: buffers in shared memory, a small control frame over a Unix socket.

Between processes of one host, copying a large tensor through a socket costs
two copies plus many system calls. Here the sender copies each large buffer
once into a shared-memory segment (one per message) and sends only the frame
skeleton with the segment's descriptor; the receiver maps the segment and its
tensors *are* that memory (no second copy). Small buffers (under
``shm_min`` bytes) ride inline in the frame, where a segment would cost more
than it saves. Who frees a segment, and why none can leak, is explained in
:mod:`._segment`.
"""

from __future__ import annotations

from ...transport import Channel, Transport
from . import _address

# The stream and segment machinery (asyncio, anyio, mmap) is imported by
# listen/connect only: `omni plan` checks addresses without it.

SHM_MIN = 64 << 10


class ShmTransport(Transport):
    """Shared-memory buffers with a control frame over ``unix:/path``."""

    name = "shm"
    scopes = frozenset({"host"})

    def __init__(self, shm_min: int = SHM_MIN, pool_bytes: int | None = None) -> None:
        self.shm_min = shm_min
        self.pool_bytes = pool_bytes  # None: the segment pool's default (POOL_BYTES)

    def check_address(self, address: str) -> str:
        return str(_address.parse(address, transport=self.name, tcp=False))

    def listen(self, address: str, *, secret: bytes) -> Channel:
        from ._stream import StreamReceiver

        parsed = _address.parse(address, transport=self.name, tcp=False)
        return StreamReceiver(parsed, transport=self.name, fds=True, secret=secret)

    def connect(self, address: str, *, secret: bytes) -> Channel:
        from ._segment import POOL_BYTES
        from ._stream import StreamSender

        parsed = _address.parse(address, transport=self.name, tcp=False)
        return StreamSender(
            parsed,
            transport=self.name,
            shm_min=self.shm_min,
            secret=secret,
            pool_bytes=POOL_BYTES if self.pool_bytes is None else self.pool_bytes,
        )
