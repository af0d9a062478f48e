"""Bearer API-key check on every route but ``/health`` (and the playground's static pages).

``/health`` stays open because load balancers and orchestrators probe it
without credentials; it reveals process states, not data. The playground's
page and files (:mod:`.playground`) are open too: they are the same for
everyone and hold no secret, and the browser must load them before it can
ask its user for the key; every API call the page makes is checked as usual. The key is compared
in constant time.

WebSockets are checked at the handshake, before the application accepts
them: ``Authorization: Bearer <key>`` as for HTTP, or, since a browser's
``new WebSocket(url, protocols)`` cannot set headers, the key offered as a
subprotocol ``bearer.<key>`` (the server never selects that one, so the key
is not echoed). A refused handshake is answered HTTP 401 with the same JSON
error as HTTP routes (uvicorn's denial-response extension), or, on a server
without that extension, closed with 1008 (policy violation). Every refusal
is one info line in the log (who, where, why): refusals are what scanners
and wrong keys cause, not server faults.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any

from .errors import APIError, error_response

log = logging.getLogger("omni.serve")
OPEN_PATHS = frozenset({"/health"})
BEARER_SUBPROTOCOL = "bearer."
# OpenAI's browser clients put the key in this subprotocol for /v1/realtime.
OPENAI_SUBPROTOCOL = "openai-insecure-api-key."


class APIKeyMiddleware:
    """``open_paths`` and ``open_prefixes`` add pages that hold no secrets (the playground:
    a browser must load it before it can ask for the key)."""

    def __init__(
        self,
        app: Any,
        api_key: str,
        open_paths: frozenset[str] = frozenset(),
        open_prefixes: tuple[str, ...] = (),
    ):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.open_paths = OPEN_PATHS | open_paths
        self.open_prefixes = open_prefixes

    def is_open(self, path: str) -> bool:
        return path in self.open_paths or path.startswith(self.open_prefixes)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket") or self.is_open(scope["path"]):
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization")
        if given is None and scope["type"] == "websocket":
            given = _subprotocol_key(scope)
        if given is None or not hmac.compare_digest(given, self.expected):
            how = "'Authorization: Bearer <key>'"
            if scope["type"] == "websocket":
                how += " or the subprotocol 'bearer.<key>'"
            message = f"missing API key: send it as {how}" if given is None else "invalid API key"
            error = APIError(
                401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"}
            )
            if scope["type"] == "websocket":
                await deny_websocket(scope, send, error)
            else:
                await error_response(error)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _subprotocol_key(scope: Any) -> bytes | None:
    """``bearer.<key>`` among the offered subprotocols, as the header's ``Bearer <key>``."""
    for offered in scope.get("subprotocols", ()):
        for prefix in (BEARER_SUBPROTOCOL, OPENAI_SUBPROTOCOL):
            if offered.startswith(prefix):
                return f"Bearer {offered[len(prefix) :]}".encode()
    return None


async def deny_websocket(scope: Any, send: Any, error: APIError) -> None:
    """Refuse a WebSocket handshake: HTTP ``error.status`` with its JSON body, else close 1008."""
    client = scope.get("client")
    log.info(
        "refused a WebSocket handshake from %s to %s: %d %s",
        f"{client[0]}:{client[1]}" if client else "a client",
        scope.get("path", "?"),
        error.status,
        error.message,
    )
    if "websocket.http.response" not in scope.get("extensions", {}):
        reason = error.message.encode()[:123].decode(errors="ignore")  # a close reason's limit
        await send({"type": "websocket.close", "code": 1008, "reason": reason})
        return
    response = error_response(error)
    await send(
        {
            "type": "websocket.http.response.start",
            "status": response.status_code,
            "headers": response.raw_headers,
        }
    )
    await send({"type": "websocket.http.response.body", "body": response.body})
