"""``POST /v1/audio/speech``: text in, audio out (wav, pcm or flac), whole or streamed.

Not streamed: the whole signal is collected and encoded with exact sizes.
Streamed (``stream: true`` or ``stream_format: "audio"``): the response
starts once the first audio chunk exists, so that a request the pipeline
refuses (an unknown voice …) still gets its 400 rather than a broken stream;
then PCM goes out as the audio stage emits it (WAV behind a header of unknown
length). FLAC is not streamed: its header needs the whole signal.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from .audio import MEDIA_TYPES, check_encoder, encode, wav_header
from .bodies import OwnedStreamingResponse, read_body, unless_disconnected
from .errors import APIError
from .protocol import SpeechRequest, parse_body
from .service import Piece, Service

PATH = "/v1/audio/speech"
FINISH_HEADER = "X-Omni-Finish-Reason"  # stop, or length when the frame cap ended the speech


async def create_speech(
    request: Request, service: Service, max_body: int, body_timeout: float
) -> Response:
    started = time.perf_counter()
    service.require("speech", PATH)
    body = parse_body(await read_body(request, max_body, body_timeout), SpeechRequest)
    service.check_model(body.model)
    fmt = body.response_format
    check_encoder(fmt)
    if body.streaming and fmt == "flac":
        raise APIError(
            400,
            "flac cannot be streamed (its header needs the whole signal); "
            "stream wav or pcm, or ask for flac without streaming",
            param="response_format",
        )
    handle = await service.submit(body.model_dump(mode="json"), {"api": "speech"})
    pieces = service.pieces(handle, path=PATH, started=started)
    rate = service.serving.sample_rate or 0

    async def next_audio() -> Piece | None:
        async for piece in pieces:
            if piece.kind == "audio":
                return piece
        return None

    if not body.streaming:
        finish = {"reason": "stop"}

        async def collect() -> bytes:
            pcm = bytearray()
            async for piece in pieces:
                if piece.kind == "audio":
                    pcm += piece.data
                elif piece.kind == "finish":
                    finish["reason"] = piece.data
            return bytes(pcm)

        try:
            pcm = await unless_disconnected(request, collect)
        finally:
            await pieces.aclose()
            await service.finish(handle, "the client disconnected")
        if not pcm:
            raise APIError(
                500,
                f"pipeline {service.serving.pipeline!r} finished without "
                f"producing audio in stage {service.serving.audio_stage!r}",
            )
        # "length": the frame cap (max_frames) cut the speech short
        return Response(
            encode(pcm, fmt, rate),
            media_type=MEDIA_TYPES[fmt],
            headers={FINISH_HEADER: finish["reason"]},
        )

    try:
        first = await unless_disconnected(request, next_audio)
    except BaseException:
        await pieces.aclose()
        await service.finish(handle, "the client disconnected")
        raise
    if first is None:
        await service.finish(handle, "no audio")
        raise APIError(
            500,
            f"pipeline {service.serving.pipeline!r} finished without "
            f"producing audio in stage {service.serving.audio_stage!r}",
        )

    async def stream() -> Any:
        if fmt == "wav":
            yield wav_header(rate, None)
        yield first.data
        async for piece in pieces:
            if piece.kind == "audio":
                yield piece.data

    async def close() -> None:
        await pieces.aclose()
        await service.finish(handle, "the client disconnected")

    return OwnedStreamingResponse(stream(), close, media_type=MEDIA_TYPES[fmt])
