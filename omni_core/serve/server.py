"""uvicorn on the caller's event loop, next to the runtime it serves.

``omni serve`` owns the signals (it must stop admitting, stop uvicorn, then
stop the runtime's children in that order), so :class:`OmniServer` turns off
uvicorn's own signal capture, which would otherwise re-raise the signal after
uvicorn returns and kill the parent before the children are stopped.

uvicorn bounds only the idle time between requests (``timeout_keep_alive``):
a client that sends half a request line, or headers and then half a body,
holds its connection for ever. :class:`DeadlineProtocol` gives every request
``server.header_timeout`` for its headers and ``server.body_timeout`` for its
body, and closes the connection when either passes. A connection upgraded to
a WebSocket leaves both clocks behind; :class:`OmniWebSocketProtocol` then
drops a client that stopped reading when the application gives up on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from ..schema.deployment import ServerConfig
from .common.log_limits import limit_repeats

log = logging.getLogger("omni.serve")
# The handler answers a slow body with a 408 at body_timeout (read_body); the
# connection-level deadline waits this much longer, so that it only catches
# bodies no handler reads (a 401, a 404 …) rather than racing the 408.
BODY_GRACE = 2.0
HEADER_TIMEOUT = ServerConfig.model_fields["header_timeout"].default
BODY_TIMEOUT = ServerConfig.model_fields["body_timeout"].default
WS_MAX_MESSAGE_BYTES = 1024 * 1024  # a WebSocket client's message: JSON with a piece of text


class DeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's headers and one for its body.

    The headers' clock starts when the connection opens, or at the first byte
    of a later request on a kept-alive connection (between requests uvicorn's
    keep-alive timeout applies); it stops when h11 has the whole head. The
    body's clock starts there and stops when the body is complete. h11's own
    state says which phase a connection is in, also for pipelined requests.
    Subclasses made by :func:`make_server` set the two timeouts.
    """

    header_timeout: float = HEADER_TIMEOUT
    body_timeout: float = BODY_TIMEOUT

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._deadline: asyncio.TimerHandle | None = None
        self._phase: str | None = None
        self._upgraded = False
        super().connection_made(transport)
        self._arm("headers")

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:
            self._arm("headers")  # a new request begins (no-op while already timing one)
        super().data_received(data)
        if not self._upgraded:
            self._follow()

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        """The socket now belongs to a WebSocket; a body deadline left armed would cut it."""
        self._disarm()
        self._upgraded = True
        super().handle_websocket_upgrade(event)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _follow(self) -> None:
        state = self.conn.their_state
        if state is h11.IDLE:
            if self.conn.trailing_data[0]:
                self._arm("headers")  # part of the next request is already buffered
            else:
                self._disarm()  # idle between requests: keep-alive's business
        elif state is h11.SEND_BODY:
            self._arm("body")
        else:
            self._disarm()

    def _arm(self, phase: str) -> None:
        if self._phase == phase:
            return
        self._disarm()
        delay = self.header_timeout if phase == "headers" else self.body_timeout + BODY_GRACE
        self._phase = phase
        self._deadline = self.loop.call_later(delay, self._expire, phase, delay)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline, self._phase = None, None

    def _expire(self, phase: str, delay: float) -> None:
        self._deadline, self._phase = None, None
        if self.transport.is_closing():
            return
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        log.info(
            "closing the connection of %s: its request %s took over %g s", client, phase, delay
        )
        self.transport.close()


def deadline_protocol(header_timeout: float, body_timeout: float) -> type[DeadlineProtocol]:
    """A :class:`DeadlineProtocol` with these timeouts (uvicorn instantiates the class itself)."""
    for name, value in (("header_timeout", header_timeout), ("body_timeout", body_timeout)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0 seconds, got {value}")
    return type(
        "OmniHTTPProtocol",
        (DeadlineProtocol,),
        {"header_timeout": header_timeout, "body_timeout": body_timeout},
    )


class OmniWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol, except that a close it cannot send drops the connection,
    and a refused handshake is not logged as an error.

    uvicorn waits for room in the transport's buffer before every send, the
    close frame included; for a client that stopped reading there never is
    room, so the close (and the connection, and its buffers) would wait for
    ever. The application decides that a client is stuck (the speech stream
    after ``server.ws_send_timeout``); its close with any code but 1000 then
    aborts the connection at once. A normal close (1000) still waits its turn
    behind the audio a slow client is still reading.

    A handshake refused with a full HTTP response (a 401, a 404: see
    :func:`.auth.deny_websocket`) is over once that response is sent, but
    uvicorn only learns so when the socket's close comes back to it; an
    application that returns first made it log "ASGI callable returned
    without completing handshake" for every refused client, which any
    scanner could turn into a flood of errors.
    """

    async def send(self, message: Any) -> None:
        if (
            message["type"] == "websocket.close"
            and message.get("code", 1000) != 1000
            and self.handshake_complete
            and not self.close_sent
            and not self.writable.is_set()
        ):
            self.close_sent = True
            self.transport.abort()
            return
        await super().send(message)
        if message["type"] == "websocket.http.response.body" and not message.get("more_body"):
            self.handshake_complete = True  # refused in full (as connection_lost will say)


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
    app: Any,
    host: str,
    port: int,
    *,
    grace: float,
    header_timeout: float = HEADER_TIMEOUT,
    body_timeout: float = BODY_TIMEOUT,
    log_level: str = "warning",
) -> OmniServer:
    """A server for ``app``; the timeouts come from ``server.header_timeout``/``body_timeout``."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=deadline_protocol(header_timeout, body_timeout),
        ws=OmniWebSocketProtocol,
        ws_max_size=WS_MAX_MESSAGE_BYTES,
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

    with limit_repeats() as limiter:  # an attack's flood of identical errors, as counts
        async with anyio.create_task_group() as tg:
            tg.start_soon(announce)
            tg.start_soon(limiter.flush_every_interval)
            await server.serve(sockets)
            tg.cancel_scope.cancel()
