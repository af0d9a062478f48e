"""The built-in transports, registered like any plugin's (implementations load on use)."""

from __future__ import annotations

from ..hookspecs import hookimpl
from ..transport import LazyTransport

MODULE = "omni_core.runtime.transports"


@hookimpl
def omni_register_transports() -> list[LazyTransport]:
    return [
        LazyTransport("inproc", f"{MODULE}.inproc:InprocTransport"),
        LazyTransport("shm", f"{MODULE}.shm:ShmTransport"),
        LazyTransport("socket", f"{MODULE}.sockets:SocketTransport"),
        LazyTransport("tcp", f"{MODULE}.sockets:TcpTransport"),
    ]
