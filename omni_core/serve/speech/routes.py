"""``POST /v1/audio/speech``: text in, audio out (wav, pcm, flac, mp3, opus, aac), streamed or not.

The pipeline's audio is encoded as it arrives, by one
:class:`.encoders.StreamEncoder` per request, which also applies the
client's ``speed`` (time-stretch, pitch kept) and ``sample_rate``: the
server does both, so every pipeline offers them and none receives them.
Format, speed and rate are checked before the request is submitted.

Not streamed: the body is the whole encoding, with exact sizes in its
headers, and ``X-Omni-Finish-Reason`` says why the speech ended.

Streamed (``stream: true`` or any ``stream_format``): the response starts
once the first audio chunk exists, so that a request the pipeline refuses
(an unknown voice …) still gets its 400 rather than a broken stream. Then

- ``stream_format: "audio"`` (and ``stream: true`` alone): the encoded
  bytes, chunked, as the encoder lets them out (WAV behind a header of
  unknown length; FLAC with its total-samples field 0, meaning unknown);
- ``stream_format: "sse"`` (OpenAI's): ``text/event-stream`` events
  ``{"type": "speech.audio.delta", "audio": <base64>}``, each a piece of
  that same byte stream (concatenated, they make a valid file), then
  ``{"type": "speech.audio.done", "usage": {"input_tokens",
  "output_tokens", "total_tokens"}, "finish_reason": "stop"|"length"}``: the
  prompt and completion tokens of the pipeline's usage stage (see
  :class:`.service.Piece`; for the TTS pipelines prompt positions and codec
  frames), or 0s when it reports none, and why the speech ended. A failure
  after the stream started is sent as an ``{"type": "error", "error": {...}}``
  event; a raw audio stream just ends (its finish reason is not sent).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ..audio.encoders import StreamEncoder
from ..common.bodies import OwnedStreamingResponse, read_body, unless_disconnected
from ..common.errors import APIError
from ..common.protocol import SpeechRequest, parse_body
from ..service import Piece, Service, later_reason

PATH = "/v1/audio/speech"
FINISH_HEADER = "X-Omni-Finish-Reason"  # stop, or length when the frame cap ended the speech


async def create_speech(
    request: Request, service: Service, max_body: int, body_timeout: float
) -> Response:
    started = time.perf_counter()
    service.require("speech", PATH)
    body = parse_body(await read_body(request, max_body, body_timeout), SpeechRequest)
    service.check_model(body.model)
    body = with_format(body, service)
    encoder = StreamEncoder(
        body.response_format,
        service.serving.sample_rate or 0,
        body.sample_rate,
        body.speed,
        streaming=body.streaming,
    )
    try:
        handle = await service.admit(body.model_dump(mode="json"), {"api": "speech"})
    except BaseException:
        encoder.close()
        raise
    pieces = service.pieces(handle, path=PATH, started=started)

    async def close() -> None:
        encoder.close()
        await pieces.aclose()
        await service.finish(handle, "the client disconnected")

    if not body.streaming:
        return await _whole(request, service, pieces, encoder, close)

    async def next_audio() -> Piece | None:
        async for piece in pieces:
            if piece.kind == "audio":
                return piece
        return None

    try:
        first = await unless_disconnected(request, next_audio)
    except BaseException:
        await close()
        raise
    if first is None:
        await close()
        raise _no_audio(service)

    ended: dict[str, Any] = {"usage": None, "reason": "stop"}

    async def encoded() -> AsyncGenerator[bytes, None]:
        """The encoder's output as the audio comes (b"" where a feed let nothing out yet)."""
        yield encoder.feed(first.data)
        async for piece in pieces:
            if piece.kind == "audio":
                yield encoder.feed(piece.data)
            elif piece.kind == "usage":
                ended["usage"] = piece.data
            elif piece.kind == "finish":
                ended["reason"] = later_reason(ended["reason"], piece.data)
        yield encoder.flush()

    async def audio() -> AsyncGenerator[bytes, None]:
        """What goes on the wire: the non-empty outputs."""
        async with aclosing(encoded()) as chunks:
            async for data in chunks:
                if data:
                    yield data

    if body.stream_format == "sse":
        return OwnedStreamingResponse(
            _events(audio(), ended),
            close,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )
    return OwnedStreamingResponse(audio(), close, media_type=encoder.media_type)


async def _whole(
    request: Request,
    service: Service,
    pieces: AsyncIterator[Piece],
    encoder: StreamEncoder,
    close: Callable[[], Awaitable[None]],
) -> Response:
    """The whole encoding as one body, with the finish reason in a header."""
    ended = {"reason": "stop"}

    async def collect() -> bytes | None:
        heard = False
        async for piece in pieces:
            if piece.kind == "audio":
                heard = True
                encoder.feed(piece.data)  # encoded as it comes; the bytes leave in flush()
            elif piece.kind == "finish":
                ended["reason"] = later_reason(ended["reason"], piece.data)
        return encoder.flush() if heard else None

    try:
        encoded = await unless_disconnected(request, collect)
    finally:
        await close()
    if encoded is None:
        raise _no_audio(service)
    # "length": the frame cap (max_frames) cut the speech short
    return Response(
        encoded, media_type=encoder.media_type, headers={FINISH_HEADER: ended["reason"]}
    )


async def _events(
    audio: AsyncGenerator[bytes, None], ended: dict[str, Any]
) -> AsyncIterator[bytes]:
    """OpenAI's speech SSE: an audio delta per encoded piece, then done with the usage."""
    try:
        async with aclosing(audio) as chunks:
            async for data in chunks:
                delta = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
                yield _event(delta)
    except APIError as exc:
        yield _event({"type": "error", **exc.body()})
        return
    usage = ended["usage"] or {"prompt_tokens": 0, "completion_tokens": 0}
    counts = {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"]}
    total = counts["input_tokens"] + counts["output_tokens"]
    usage = {**counts, "total_tokens": total}
    # finish_reason is ours (OpenAI's done event has usage only; clients ignore what they
    # do not know): "length" when the frame cap cut the speech short.
    yield _event({"type": "speech.audio.done", "usage": usage, "finish_reason": ended["reason"]})


def _event(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def with_format(body: SpeechRequest, service: Service) -> SpeechRequest:
    """``body`` with the server's default format if it names none (mp3 under the OpenAI preset)."""
    if "response_format" in body.model_fields_set or body.response_format == service.speech_format:
        return body
    return body.model_copy(update={"response_format": service.speech_format})


def _no_audio(service: Service) -> APIError:
    return APIError(
        500,
        f"pipeline {service.serving.pipeline!r} finished without "
        f"producing audio in stage {service.serving.audio_stage!r}",
    )
