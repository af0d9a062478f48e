"""The ``/v1/realtime`` endpoint: handshakes, live sessions, and what they add up to.

Authentication is every route's (:mod:`..common.auth`): the ``Authorization``
header the SDKs send, or for browsers the subprotocol ``bearer.<key>`` (and
OpenAI's browser spelling ``openai-insecure-api-key.<key>``), offered next to
``realtime``, which the server selects. The pipeline must serve chat.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections import Counter
from typing import Any

from starlette.websockets import WebSocket

from ..common.auth import deny_websocket
from ..common.errors import APIError
from .response import PATH, Response
from .session import RealtimeSession

log = logging.getLogger("omni.serve")
SUBPROTOCOL = "realtime"


class RealtimeEndpoint:
    def __init__(self, service: Any, send_timeout: float):
        self.service, self.send_timeout = service, send_timeout
        self.sessions: set[RealtimeSession] = set()
        self.responses: Counter[str] = Counter()  # status -> responses that ended so

    def record(self, response: Response, status: str) -> None:
        self.responses[status] += 1

    async def serve(self, websocket: WebSocket) -> None:
        try:
            # A pipeline that only listens (api "transcription") serves transcription
            # sessions: input transcription, no responses (session.py).
            api = self.service.serving.api
            self.service.require(
                "chat" if "chat" in api or "transcription" not in api else "transcription", PATH
            )
            self.service.check_model(websocket.query_params.get("model"))
        except APIError as exc:
            await deny_websocket(websocket.scope, websocket.send, exc)
            return
        offered = websocket.scope.get("subprotocols") or []
        await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
        session = RealtimeSession(websocket, self)
        self.sessions.add(session)
        try:
            await session.run()
        except Exception:
            incident = uuid.uuid4().hex[:16]
            log.exception("internal error (request id %s) in WebSocket %s", incident, PATH)
            await _close(websocket, 1011, f"internal server error (request id {incident})")
            return
        finally:
            self.sessions.discard(session)
        if session.outcome == "stuck":
            await _close(
                websocket,
                1008,
                f"events left unread for {self.send_timeout:g} s (server.ws_send_timeout)",
            )
        elif session.outcome != "gone":
            await _close(websocket, 1000)


async def _close(websocket: WebSocket, code: int, reason: str = "") -> None:
    with contextlib.suppress(Exception):  # already closed by the client
        await websocket.close(code, reason)
