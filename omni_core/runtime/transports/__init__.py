"""Built-in transports: ``inproc`` (one process), ``shm`` (one host), ``socket``.

The runtime picks one per edge (see :mod:`omni_core.transport` for the
interface). None of these modules imports torch or numpy: buffers are
recognised by looking at already-imported modules only.
"""

from __future__ import annotations

from ...transport import Transport
from .inproc import InprocTransport
from .shm import ShmTransport
from .sockets import SocketTransport

BUILTIN_TRANSPORTS: list[type[Transport]] = [InprocTransport, ShmTransport, SocketTransport]

__all__ = ["BUILTIN_TRANSPORTS", "InprocTransport", "ShmTransport", "SocketTransport"]
