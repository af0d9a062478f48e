"""``POST /v1/chat/completions``: messages in; text, and audio when asked, out.

Audio output follows OpenAI's shape: ``message.audio`` (``id``, base64
``data`` in the requested format, ``transcript``, ``expires_at``) when not
streaming; ``choices[0].delta.audio.data`` (base64 PCM16 at the pipeline's
sample rate) in the SSE chunks when streaming, next to ``delta.content``
text deltas. The model's text goes to ``content`` when "text" is among the
modalities, and is also the audio's transcript. A failure after the stream
started is sent as an SSE ``error`` event, which the OpenAI clients raise.

``usage`` (prompt, completion and total tokens) is what the pipeline's usage
stage reported (see :class:`.service.Piece`), or null if it reported none.
Streaming with ``stream_options.include_usage``, every chunk carries
``usage: null`` and a last chunk before ``[DONE]`` has ``choices: []`` and
the usage, as OpenAI sends it.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..audio.encoders import check_format, encode_whole
from ..common.bodies import OwnedStreamingResponse, read_body, unless_disconnected
from ..common.errors import APIError
from ..common.protocol import ChatRequest, parse_body
from ..service import Piece, Service, later_reason
from .media import MediaPolicy, check_media

PATH = "/v1/chat/completions"
AUDIO_LIFETIME = 3600  # seconds; we keep nothing, but clients expect expires_at


def _modalities(body: ChatRequest, service: Service) -> list[str]:
    serving = service.serving
    if body.modalities is None:
        return ["text"] if serving.text_stage else ["text", "audio"]
    wanted = list(dict.fromkeys(body.modalities))
    if "audio" in wanted and not serving.audio_stage:
        raise APIError(
            400,
            f'pipeline {serving.pipeline!r} produces no audio; use modalities ["text"]',
            param="modalities",
        )
    if wanted == ["text"] and not serving.text_stage:
        raise APIError(
            400,
            f"pipeline {serving.pipeline!r} produces no text, only audio; "
            'use modalities ["text", "audio"]',
            param="modalities",
        )
    if not wanted:
        raise APIError(400, "modalities is empty", param="modalities")
    return wanted


async def create_chat(
    request: Request, service: Service, max_body: int, media: MediaPolicy, body_timeout: float
) -> Response:
    started = time.perf_counter()
    service.require("chat", PATH)
    body = parse_body(await read_body(request, max_body, body_timeout), ChatRequest)
    service.check_model(body.model)
    modalities = _modalities(body, service)
    audio_format = body.audio.format if body.audio else "wav"
    if body.stream and "audio" in modalities:
        if body.audio and "format" in body.audio.model_fields_set and audio_format != "pcm16":
            raise APIError(
                400, "streamed audio is pcm16; set audio.format to pcm16", param="audio.format"
            )
        audio_format = "pcm16"
    if "audio" in modalities:
        check_format(audio_format, param="audio.format")
    data = body.payload(modalities)
    service.budget.check(data, "chat")  # counting characters first: it costs nothing
    await check_media(data["messages"], media)
    handle = await service.admit(data, {"api": "chat"})
    pieces = service.pieces(handle, path=PATH, started=started)
    ids = {
        "id": f"chatcmpl-{handle.request_id}",
        "created": int(time.time()),
        "model": body.model or service.model_id,
    }
    audio_id = f"audio-{handle.request_id}"

    async def close() -> None:
        await pieces.aclose()
        await service.finish(handle, "the client disconnected")

    # finish: "length" when a stage says a token or frame cap ended it; usage: what it counted
    ended: dict[str, Any] = {"reason": "stop", "usage": None}

    if not body.stream:

        async def collect() -> tuple[str, bytes]:
            text, pcm = [], bytearray()
            async for piece in pieces:
                if piece.kind == "text":
                    text.append(piece.data)
                elif piece.kind == "audio":
                    pcm += piece.data
                elif piece.kind == "finish":
                    ended["reason"] = later_reason(ended["reason"], piece.data)
                elif piece.kind == "usage":
                    ended["usage"] = piece.data
            return "".join(text), bytes(pcm)

        try:
            text, pcm = await unless_disconnected(request, collect)
        finally:
            await close()
        has_text = "text" in modalities and service.serving.text_stage is not None
        message: dict[str, Any] = {"role": "assistant", "content": text if has_text else None}
        if "audio" in modalities:
            if not pcm:
                raise APIError(500, f"pipeline {service.serving.pipeline!r} produced no audio")
            rate = service.serving.sample_rate or 0
            message["audio"] = {
                "id": audio_id,
                "data": base64.b64encode(encode_whole(pcm, audio_format, rate)).decode(),
                "expires_at": int(time.time()) + AUDIO_LIFETIME,
                "transcript": text,
            }
        return JSONResponse(
            {
                **ids,
                "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "finish_reason": ended["reason"]}],
                "usage": ended["usage"],
            }
        )

    include_usage = body.include_usage

    def event(choices: list[dict[str, Any]], usage: Any = None) -> bytes:
        payload = {**ids, "object": "chat.completion.chunk", "choices": choices}
        if include_usage:
            payload["usage"] = usage
        return f"data: {json.dumps(payload)}\n\n".encode()

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return event([{"index": 0, "delta": delta, "finish_reason": finish}])

    def delta(piece: Piece) -> dict[str, Any] | None:
        if piece.kind == "finish":
            ended["reason"] = later_reason(ended["reason"], piece.data)
            return None
        if piece.kind == "usage":
            ended["usage"] = piece.data
            return None
        if piece.kind == "audio":
            if "audio" not in modalities:
                return None
            return {"audio": {"id": audio_id, "data": base64.b64encode(piece.data).decode()}}
        if "text" in modalities:
            return {"content": piece.data}
        return {"audio": {"id": audio_id, "transcript": piece.data}}

    async def first_piece() -> Piece | None:
        async for piece in pieces:
            if delta(piece) is not None:
                return piece
        return None

    try:  # the first piece before the status line: a refused request still gets its 4xx
        first = await unless_disconnected(request, first_piece)
    except BaseException:
        await close()
        raise

    async def stream() -> Any:
        yield chunk({"role": "assistant", "content": ""})
        try:
            if first is not None:
                yield chunk(delta(first) or {})
                async for piece in pieces:
                    part = delta(piece)
                    if part is not None:
                        yield chunk(part)
        except APIError as exc:
            yield f"data: {json.dumps(exc.body())}\n\n".encode()
            return
        if "audio" in modalities:  # as OpenAI: the last audio update holds only its expiry
            expires = int(time.time()) + AUDIO_LIFETIME
            yield chunk({"audio": {"id": audio_id, "expires_at": expires}})
        yield chunk({}, ended["reason"])
        if include_usage:
            yield event([], ended["usage"])
        yield b"data: [DONE]\n\n"

    return OwnedStreamingResponse(
        stream(), close, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )
