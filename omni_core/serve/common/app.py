"""The Starlette application: routes, error shapes, auth and metrics around a Runtime.

``create_app(runtime, resolution)`` is all ``omni serve`` (and the tests)
need. The runtime is started and stopped by the caller, not by the app's
lifespan, so that start-up progress and signals stay with the command line.
Routes for an API the pipeline does not declare still exist and answer 404
with a message saying what the pipeline serves.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from ..chat.media import MediaPolicy
from ..chat.routes import PATH as CHAT_PATH
from ..chat.routes import create_chat
from ..realtime.response import PATH as REALTIME_PATH
from ..realtime.routes import RealtimeEndpoint
from ..service import Service
from ..speech.batch import PATH as BATCH_PATH
from ..speech.batch import create_batch
from ..speech.routes import PATH as SPEECH_PATH
from ..speech.routes import create_speech
from ..speech.stream import PATH as SPEECH_STREAM_PATH
from ..speech.stream import SpeechStreams
from ..transcribe.routes import TRANSCRIPTIONS_PATH, TRANSLATIONS_PATH, create_transcription
from ..views.deployment import PATH as DEPLOYMENT_PATH
from ..views.deployment import SVG_PATH as DEPLOYMENT_SVG_PATH
from ..views.deployment import DeploymentPages
from ..views.playground import open_paths, playground_routes
from ..voices.routes import PATH as VOICES_PATH
from ..voices.routes import Voices
from .auth import APIKeyMiddleware, deny_websocket
from .bodies import ClientGone, read_form
from .errors import APIError, error_response
from .metrics import Metrics, MetricsMiddleware

log = logging.getLogger("omni.serve")
CLIENT_CLOSED = 499  # nginx's "client closed request": only ever seen in the metrics
UNHEALTHY = {"unhealthy", "stopping", "starting"}


def create_app(runtime: Any, resolution: Any, *, api_key: str | None = None) -> Starlette:
    """An ASGI app serving ``runtime``; ``api_key`` overrides ``server.api_key``."""
    config = resolution.config
    server = config.server
    service = Service.of(runtime, resolution.pipeline_cls, config)
    metrics = Metrics(
        runtime,
        {SPEECH_PATH, BATCH_PATH, VOICES_PATH, CHAT_PATH, "/v1/models", "/health", "/metrics"},
    )
    service.audio_meter = metrics.audio
    created = int(time.time())

    media = MediaPolicy.of(server)
    voices = Voices.of(resolution.pipeline_cls, config)
    service.voices = voices

    async def speech(request: Request) -> Response:
        return await create_speech(request, service, server.max_body_bytes, server.body_timeout)

    async def chat(request: Request) -> Response:
        return await create_chat(
            request, service, server.max_body_bytes, media, server.body_timeout
        )

    async def transcribe(request: Request) -> Response:  # and translate: by the path
        return await create_transcription(
            request, service, request.url.path, server.max_body_bytes, server.body_timeout
        )

    async def list_voices(request: Request) -> Response:
        service.require("speech", VOICES_PATH)
        return JSONResponse(voices.listing())

    async def upload_voice(request: Request) -> Response:
        service.require("speech", VOICES_PATH)
        form = await read_form(request, server.max_body_bytes, server.body_timeout)
        try:
            return JSONResponse(await voices.upload(form, service), status_code=201)
        finally:
            await form.close()

    async def delete_voice(request: Request) -> Response:
        service.require("speech", VOICES_PATH)
        return JSONResponse(voices.delete(request.path_params["name"]))

    async def speech_batch(request: Request) -> Response:
        return await create_batch(request, service, server.max_body_bytes, server.body_timeout)

    async def models(request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": service.model_id,
                        "object": "model",
                        "created": created,
                        "owned_by": "omni",
                        "pipeline": service.serving.pipeline,
                        "api": list(service.serving.api),
                    }
                ],
            }
        )

    async def health(request: Request) -> Response:
        state = {"pipeline": service.serving.pipeline, **runtime.health()}
        return JSONResponse(state, status_code=503 if state["status"] in UNHEALTHY else 200)

    async def prometheus(request: Request) -> Response:
        body, content_type = metrics.exposition(request.headers.get("accept"))
        return Response(body, headers={"Content-Type": content_type})

    speech_streams = SpeechStreams(service, server.ws_send_timeout)  # denies if no speech
    realtime = RealtimeEndpoint(service, server.ws_send_timeout)  # denies if no chat
    routes = [
        Route(SPEECH_PATH, _guarded(speech), methods=["POST"]),
        Route(BATCH_PATH, _guarded(speech_batch), methods=["POST"]),
        Route(VOICES_PATH, _guarded(list_voices), methods=["GET"]),
        Route(VOICES_PATH, _guarded(upload_voice), methods=["POST"]),
        Route(VOICES_PATH + "/{name}", _guarded(delete_voice), methods=["DELETE"]),
        Route(CHAT_PATH, _guarded(chat), methods=["POST"]),
        Route(TRANSCRIPTIONS_PATH, _guarded(transcribe), methods=["POST"]),
        Route(TRANSLATIONS_PATH, _guarded(transcribe), methods=["POST"]),
        Route("/v1/models", _guarded(models), methods=["GET"]),
        Route("/health", _guarded(health), methods=["GET"]),
        Route("/metrics", _guarded(prometheus), methods=["GET"]),
        WebSocketRoute(SPEECH_STREAM_PATH, speech_streams.serve),
        WebSocketRoute(REALTIME_PATH, realtime.serve),
    ]
    deployment = DeploymentPages(runtime.plan, service)
    routes += [
        Route(DEPLOYMENT_PATH, _guarded(deployment.json), methods=["GET"]),
        Route(DEPLOYMENT_SVG_PATH, _guarded(deployment.svg), methods=["GET"]),
    ]
    if server.playground:
        routes += playground_routes(service)
    routes.append(WebSocketRoute("/{path:path}", _unknown_websocket))  # after every other route
    key = api_key if api_key is not None else server.api_key
    middleware = [Middleware(MetricsMiddleware, metrics=metrics)]
    if key:
        exact, prefixes = open_paths(server.playground)
        middleware.append(
            Middleware(APIKeyMiddleware, api_key=key, open_paths=exact, open_prefixes=prefixes)
        )
    app = Starlette(
        routes=routes, middleware=middleware, exception_handlers={HTTPException: _http_exception}
    )
    metrics.endpoints.update(r.path for r in app.routes if hasattr(r, "path"))  # WebSocket too
    app.state.service, app.state.metrics = service, metrics
    app.state.speech_streams = speech_streams
    return app


def _guarded(endpoint: Callable[[Request], Awaitable[Response]]):
    """Our errors become OpenAI-shaped JSON; a bug becomes a logged 500, not a dropped socket.

    The 500 says nothing about the bug (exception text can carry paths, data
    or internals to an untrusted client); it carries a request id that the
    log prints next to the traceback, so the operator can find it.
    """

    async def guarded(request: Request) -> Response:
        try:
            return await endpoint(request)
        except APIError as exc:
            return error_response(exc)
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED)
        except Exception:
            incident = uuid.uuid4().hex[:16]
            log.exception(
                "internal error (request id %s) in %s %s",
                incident,
                request.method,
                request.url.path,
            )
            return error_response(APIError(500, f"internal server error (request id {incident})"))

    return guarded


async def _unknown_websocket(websocket: WebSocket) -> None:
    """A handshake to a path we do not serve: a 404 like HTTP's, and a line in the log.

    Starlette's own fallback closes such handshakes with a bare 403 and says
    nothing; the client learns nothing, and neither does the operator.
    """
    error = APIError(404, f"no such endpoint: {websocket.scope['path']}")
    await deny_websocket(websocket.scope, websocket.send, error)


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = {
        404: f"no such endpoint: {request.url.path}",
        405: f"method {request.method} is not allowed on {request.url.path}",
    }
    return error_response(
        APIError(
            exc.status_code,
            message.get(exc.status_code, exc.detail),
            headers=dict(exc.headers or {}),
        )
    )
