"""Reading request bodies under a limit, and tying a request's life to its connection.

A client that disconnects must not leave its request running in the stages:
non-streaming handlers race the work against the disconnect message, and
streaming responses abort in a ``finally`` that runs however the response ends.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
from starlette.requests import ClientDisconnect, Request
from starlette.responses import StreamingResponse

from .errors import APIError
from .log_limits import AlreadyLogged

log = logging.getLogger("omni.serve")
T = TypeVar("T")
CLOSE = {"Connection": "close"}  # the unread rest of the body cannot precede another request


class ClientGone(Exception):
    """The client disconnected before its response was ready."""


class StreamCut(AlreadyLogged):
    """A streamed response failed after its status line was sent; its connection is cut.

    Cut, not ended: a body that ends normally would look complete to the
    client. A streamed format with its own error event (SSE) sends that
    event instead and never gets here.
    """


async def read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The whole body within ``timeout`` seconds, or APIError(413) as soon as it exceeds ``limit``.

    A client that sends its body slowly (or never) gets a 408 and its connection
    closed (the rest of its body will not be read), instead of holding a
    connection and a handler for as long as it likes.
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise APIError(413, _too_large(int(declared), limit))
    chunks, size = [], 0
    try:
        with anyio.fail_after(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise APIError(413, _too_large(size, limit))
                chunks.append(chunk)
    except TimeoutError:
        raise APIError(
            408,
            f"the request body was not received within {timeout:g} s "
            f"({size} bytes arrived); the operator can raise server.body_timeout",
            headers=CLOSE,
        ) from None
    except ClientDisconnect:
        raise ClientGone from None
    return b"".join(chunks)


async def read_form(request: Request, limit: int, timeout: float) -> Any:
    """A ``multipart/form-data`` body as Starlette's ``FormData``, read under the body bounds.

    The body is read whole by :func:`read_body` (size limit, deadline) before
    the parser sees it, so a slow or oversized upload is refused exactly like
    a JSON body. One file part at most; the caller closes the form.
    """
    from starlette.formparsers import MultiPartException, MultiPartParser

    kind = request.headers.get("content-type", "")
    if not kind.startswith("multipart/form-data"):
        raise APIError(
            400, f"expected a multipart/form-data body, got {kind or 'no content type'!r}"
        )
    raw = await read_body(request, limit, timeout)

    async def body() -> Any:
        yield raw

    parser = MultiPartParser(request.headers, body(), max_files=1, max_fields=16)
    try:
        return await parser.parse()
    except MultiPartException as exc:
        raise APIError(400, f"the multipart body is malformed: {exc.message}") from None


def _too_large(size: int, limit: int) -> str:
    return (
        f"the request body is larger than the limit of {limit} bytes (at least {size}); "
        "the operator can raise server.max_body_bytes"
    )


async def unless_disconnected(request: Request, work: Callable[[], Awaitable[T]]) -> T:
    """``await work()``, cancelled with ClientGone if the client disconnects first.

    Call only after the body has been read: then the next ASGI message is the
    disconnect.
    """
    outcome: list[T] = []
    failure: list[Exception] = []
    gone = False
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            nonlocal gone
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    gone = True
                    tg.cancel_scope.cancel()
                    return

        async def run() -> None:
            try:
                outcome.append(await work())
            except Exception as exc:  # re-raised bare below, not as an exception group
                failure.append(exc)
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        tg.start_soon(run)
    if failure:
        raise failure[0]
    if gone or not outcome:
        raise ClientGone
    return outcome[0]


class OwnedStreamingResponse(StreamingResponse):
    """A streaming response that runs ``on_close`` however it ends (done, failed, client gone)."""

    def __init__(
        self, content: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]], **kw: Any
    ):
        super().__init__(content, **kw)
        self.on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except APIError as exc:
            log.warning(
                "%s %s: failed after its response started (%d %s); the connection was cut",
                scope.get("method", ""),
                scope.get("path", ""),
                exc.status,
                exc.message,
            )
            raise StreamCut(exc.message) from None
        finally:
            with anyio.CancelScope(shield=True):
                close = getattr(self.body_iterator, "aclose", None)
                if close is not None:
                    await close()
                await self.on_close()
