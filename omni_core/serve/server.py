"""uvicorn on the caller's event loop, next to the runtime it serves.

``omni serve`` owns the signals (it must stop admitting, stop uvicorn, then
stop the runtime's children in that order), so :class:`OmniServer` turns off
uvicorn's own signal capture, which would otherwise re-raise the signal after
uvicorn returns and kill the parent before the children are stopped.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import uvicorn


class OmniServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def addresses(self) -> list[str]:
        """``http://host:port`` of every bound socket (the real port when 0 was asked)."""
        urls = []
        for server in getattr(self, "servers", []):
            for sock in server.sockets:
                host, port = sock.getsockname()[:2]
                host = f"[{host}]" if ":" in host else host
                urls.append(f"http://{host}:{port}")
        return urls


def bind(host: str, port: int) -> socket.socket:
    """Bind the listening socket before any model loads, so that a taken port fails fast."""
    from ..errors import ConfigError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say they
    # are TCP, and without it every response waits out the client's delayed ACK (~40 ms).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            hint="choose another --port (or --host)",
        ) from None
    return sock


def make_server(
    app: Any, host: str, port: int, *, grace: float, log_level: str = "warning"
) -> OmniServer:
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="off",
        access_log=False,
        log_level=log_level,
        timeout_graceful_shutdown=max(1, int(grace)),
        server_header=False,
    )
    return OmniServer(config)


async def serve_runtime(
    server: OmniServer,
    sockets: list[socket.socket] | None = None,
    on_started: Callable[[list[str]], None] | None = None,
) -> None:
    """Serve until ``server.should_exit``; ``on_started(urls)`` once the sockets are bound."""

    async def announce() -> None:
        while not server.started:
            if server.should_exit:
                return
            await anyio.sleep(0.02)
        if on_started is not None:
            on_started(server.addresses())

    async with anyio.create_task_group() as tg:
        tg.start_soon(announce)
        await server.serve(sockets)
        tg.cancel_scope.cancel()
