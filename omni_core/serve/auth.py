"""Bearer API-key check on every route but ``/health``.

``/health`` stays open because load balancers and orchestrators probe it
without credentials; it reveals process states, not data. The key is compared
in constant time.
"""

from __future__ import annotations

import hmac
from typing import Any

from .errors import APIError, error_response

OPEN_PATHS = frozenset({"/health"})


class APIKeyMiddleware:
    def __init__(self, app: Any, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization")
        if given is None or not hmac.compare_digest(given, self.expected):
            message = (
                "missing API key: send it as 'Authorization: Bearer <key>'"
                if given is None
                else "invalid API key"
            )
            response = error_response(
                APIError(
                    401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"}
                )
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
