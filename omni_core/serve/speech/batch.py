"""``POST /v1/audio/speech/batch``: 1-32 speech requests in one call, answered in order.

Body: ``{"model": optional, "items": [speech request, ...]}``; each item is a
``POST /v1/audio/speech`` body (its own ``input``, ``voice``,
``response_format``, sampling fields...), not streamed. Answer::

    {"object": "list", "data": [
        {"index": 0, "status": 200, "response_format": "wav", "audio": "<base64>",
         "finish_reason": "stop"},
        {"index": 1, "status": 400, "error": {"message": ..., "param": ...}}, ...]}

Why one item's error does not fail the others: a batch is many independent
requests sent together to save round trips; each gets the status it would
have had alone. Items run concurrently, at most :data:`CONCURRENCY` at once,
so one batch cannot take the whole admission limit from other clients (an
item refused with 429 says so in its own entry).
"""

from __future__ import annotations

import base64
import time
from typing import Any

import anyio
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..audio.encoders import StreamEncoder
from ..common.bodies import read_body
from ..common.errors import APIError
from ..common.protocol import SpeechRequest, parse_body, validate_data
from ..service import Service, later_reason
from .routes import with_format

PATH = "/v1/audio/speech/batch"
MAX_ITEMS = 32
CONCURRENCY = 8


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    items: list[dict[str, Any]] = Field(min_length=1, max_length=MAX_ITEMS)


async def create_batch(
    request: Request, service: Service, max_body: int, body_timeout: float
) -> Response:
    started = time.perf_counter()
    service.require("speech", PATH)
    body = parse_body(await read_body(request, max_body, body_timeout), BatchRequest)
    service.check_model(body.model)
    results: list[dict[str, Any]] = [{} for _ in body.items]
    limiter = anyio.Semaphore(CONCURRENCY)

    async def run(index: int, item: dict[str, Any]) -> None:
        async with limiter:
            try:
                spoken = await _speak(service, item, body.model, started)
                results[index] = {"index": index, **spoken}
            except APIError as exc:
                results[index] = {"index": index, "status": exc.status, **exc.body()}

    async with anyio.create_task_group() as group:
        for index, item in enumerate(body.items):
            group.start_soon(run, index, item)
    return JSONResponse({"object": "list", "data": results})


async def _speak(
    service: Service, item: dict[str, Any], model: str | None, started: float
) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise APIError(400, "a batch item must be a speech request object")
    speech = validate_data({"model": model, **item}, SpeechRequest)
    service.check_model(speech.model)
    speech = with_format(speech, service)
    if speech.streaming or speech.stream_format is not None:
        raise APIError(
            400, "batch items are not streamed; drop stream/stream_format", param="stream"
        )
    # built first, so a format, speed or sample rate the server cannot make is this
    # item's 400 before the pipeline does any work; encoded as the audio arrives
    encoder = StreamEncoder(
        speech.response_format,
        service.serving.sample_rate or 0,
        speech.sample_rate,
        speech.speed,
        streaming=False,
    )
    heard, finish = False, "stop"
    try:
        handle = await service.admit(speech.model_dump(mode="json"), {"api": "speech"})
        try:
            async for piece in service.pieces(handle, path=PATH, started=started):
                if piece.kind == "audio":
                    heard = True
                    encoder.feed(piece.data)
                elif piece.kind == "finish":
                    finish = later_reason(finish, piece.data)
        finally:
            await service.finish(handle, "the batch ended")
        if not heard:
            raise APIError(500, f"pipeline {service.serving.pipeline!r} produced no audio")
        audio = encoder.flush()
    finally:
        encoder.close()
    return {
        "status": 200,
        "response_format": speech.response_format,
        "audio": base64.b64encode(audio).decode("ascii"),
        "finish_reason": finish,
    }
