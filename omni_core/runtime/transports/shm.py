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
from ._segment import POOL_BYTES
from ._stream import StreamReceiver, StreamSender

SHM_MIN = 64 << 10


class ShmTransport(Transport):
    """Shared-memory buffers with a control frame over ``unix:/path``."""

    name = "shm"
    description = "same host: tensors and buffers in shared memory, control over a Unix socket"
    scopes = frozenset({"host"})

    def __init__(self, shm_min: int = SHM_MIN, pool_bytes: int = POOL_BYTES) -> None:
        self.shm_min = shm_min
        self.pool_bytes = pool_bytes

    def check_address(self, address: str) -> str:
        return str(_address.parse(address, transport=self.name, tcp=False))

    def listen(self, address: str, *, secret: bytes) -> Channel:
        parsed = _address.parse(address, transport=self.name, tcp=False)
        return StreamReceiver(parsed, transport=self.name, fds=True, secret=secret)

    def connect(self, address: str, *, secret: bytes) -> Channel:
        parsed = _address.parse(address, transport=self.name, tcp=False)
        return StreamSender(
            parsed,
            transport=self.name,
            shm_min=self.shm_min,
            secret=secret,
            pool_bytes=self.pool_bytes,
        )
