"""Socket addresses as written in plans and deploy files: parse once, fail clearly.

Accepted spellings:

* ``unix:/run/omni/thinker.sock`` - a Unix domain socket at a path;
* ``unix:@omni-thinker`` - a Linux abstract socket (no file, nothing to clean up);
* ``tcp://127.0.0.1:5555``, ``tcp://[::1]:5555``, ``tcp://host:0`` (any free port).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from ...transport import AddressError

FORMS = "unix:/path/to.sock, unix:@abstract-name, or tcp://HOST:PORT"
# sun_path is 108 bytes on Linux (104 on macOS), including the terminating NUL.
_SUN_PATH_MAX = 107 if sys.platform.startswith("linux") else 103


@dataclass(frozen=True)
class SocketAddress:
    """A parsed address: ``path`` for Unix sockets, ``host``/``port`` for TCP."""

    scheme: str  # "unix" or "tcp"
    path: str = ""  # "@name" for an abstract socket
    host: str = ""
    port: int = 0

    @property
    def abstract(self) -> bool:
        return self.scheme == "unix" and self.path.startswith("@")

    def bind_target(self) -> str | tuple[str, int]:
        """What ``socket.bind``/``connect`` take for this address."""
        if self.scheme == "tcp":
            return (self.host, self.port)
        return "\0" + self.path[1:] if self.abstract else self.path

    def __str__(self) -> str:
        if self.scheme == "tcp":
            host = f"[{self.host}]" if ":" in self.host else self.host
            return f"tcp://{host}:{self.port}"
        return f"unix:{self.path}"


def parse(address: str, *, transport: str, tcp: bool = True) -> SocketAddress:
    """``address`` parsed, or :class:`AddressError` naming the accepted forms."""
    hint = f"write {FORMS}" if tcp else "write unix:/path/to.sock or unix:@abstract-name"
    if not isinstance(address, str) or not address:
        raise AddressError(f"{transport}: empty address", hint=hint)
    if address.startswith("unix:"):
        path = address[len("unix:") :]
        if path.startswith("//"):  # tolerate unix:///abs/path
            path = path[2:]
        if not path or path == "@":
            raise AddressError(f"{transport}: {address!r} names no socket path", hint=hint)
        if "\0" in path:
            raise AddressError(f"{transport}: {address!r} contains a NUL byte", hint=hint)
        if path.startswith("@") and not sys.platform.startswith("linux"):
            raise AddressError(
                f"{transport}: abstract sockets ({address!r}) exist only on Linux",
                hint="use a filesystem path: unix:/path/to.sock",
            )
        if len(path.encode()) > _SUN_PATH_MAX:
            raise AddressError(
                f"{transport}: socket path {path!r} is {len(path.encode())} bytes; "
                f"the system allows {_SUN_PATH_MAX}",
                hint="use a shorter directory (e.g. under /tmp) or an abstract name",
            )
        return SocketAddress("unix", path=path)
    if address.startswith("tcp://"):
        if not tcp:
            raise AddressError(
                f"{transport}: {address!r} is a TCP address; "
                f"{transport} works between processes of one host only",
                hint=hint + " (or use the socket transport for TCP)",
            )
        rest = address[len("tcp://") :]
        host, sep, port_text = rest.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
            raise AddressError(
                f"{transport}: {address!r} is not tcp://HOST:PORT (PORT 0-65535)", hint=hint
            )
        return SocketAddress("tcp", host=host, port=int(port_text))
    raise AddressError(f"{transport}: cannot read address {address!r}", hint=hint)
