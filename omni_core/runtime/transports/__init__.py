"""Built-in transports: ``inproc`` (one process), ``shm`` (one host), ``socket``.

The runtime picks one per edge (see :mod:`omni_core.transport` for the
interface). None of these modules imports torch or numpy: buffers are
recognised by looking at already-imported modules only.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

# Names load on first access: importing one transport (``omni plan`` checks
# the addresses of shm and socket) must not import the others' machinery.
_EXPORTS = {
    "InprocTransport": "inproc",
    "ShmTransport": "shm",
    "SocketTransport": "sockets",
    "TcpTransport": "sockets",
}

__all__ = ["BUILTIN_TRANSPORTS", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    if name == "BUILTIN_TRANSPORTS":
        return [__getattr__(n) for n in ("InprocTransport", "ShmTransport", "SocketTransport")]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
