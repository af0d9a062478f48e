"""``POST /v1/audio/transcriptions`` and ``POST /v1/audio/translations``.

A multipart form in (:mod:`.form`), the file checked and made readable
(:mod:`.audio`), a chat-shaped request admitted into the pipeline
(:mod:`.request`), its text out in the requested format (:mod:`.formats`).
Served by every pipeline that declares the ``"transcription"`` api; the
others answer 404 ``unsupported_api`` like any route they do not serve.

``stream=true`` answers ``text/event-stream`` with OpenAI's events:
``{"type": "transcript.text.delta", "delta": str}`` per text piece, then
``{"type": "transcript.text.done", "text": str, "usage": {...}}``; the done
text (and a non-streamed response's) is the text stage's final
``transcript`` when it gives one (qwen3-asr: repetitions collapsed), else
the deltas joined. As with
chat, the first piece is awaited before the status line, so a request the
pipeline refuses still gets its 4xx; a failure after that is an
``{"type": "error", "error": {...}}`` event.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import Response

from ...media import MediaError
from ..common.bodies import OwnedStreamingResponse, read_form, unless_disconnected
from ..common.errors import APIError
from ..service import Piece, Service
from .audio import FIELD, prepare_audio
from .audio import limits_for as audio_limits
from .form import TranscriptionForm, parse_form
from .formats import Transcript, render, token_usage
from .request import AUDIO_PART, chat_data

TRANSCRIPTIONS_PATH = "/v1/audio/transcriptions"
TRANSLATIONS_PATH = "/v1/audio/translations"
TASKS = {TRANSCRIPTIONS_PATH: "transcribe", TRANSLATIONS_PATH: "translate"}


async def create_transcription(
    request: Request, service: Service, path: str, max_body: int, body_timeout: float
) -> Response:
    """Answer one transcription (or translation, by ``path``) request."""
    started = time.perf_counter()
    service.require("transcription", path)
    upload = await read_form(request, max_body, body_timeout)
    try:
        form = await parse_form(upload, TASKS[path])
    finally:
        await upload.close()
    service.check_model(form.model)
    try:
        clip = await anyio.to_thread.run_sync(prepare_audio, form.file, audio_limits(max_body))
    except MediaError as exc:
        raise APIError(400, exc.message, param=FIELD) from None
    handle = await service.admit(chat_data(form, clip), {"api": "transcription"})
    pieces = _about_file(service.pieces(handle, path=path, started=started))

    async def close() -> None:
        await pieces.aclose()
        await service.finish(handle, "the client disconnected")

    ended: dict[str, Any] = {"usage": None, "details": {}}
    if not form.stream:

        async def collect() -> str:
            text = []
            async for piece in pieces:
                if piece.kind == "text":
                    text.append(piece.data)
                elif piece.kind in ("usage", "details"):
                    ended[piece.kind] = piece.data
            return "".join(text)

        try:
            text = await unless_disconnected(request, collect)
        finally:
            await close()
        details = dict(ended["details"])
        text = details.pop("transcript", text)
        if form.words and "words" not in details and text.strip():
            raise APIError(
                400,
                f"pipeline {service.serving.pipeline!r} gives no word timings; leave out "
                "timestamp_granularities 'word' (qwen3-asr gives them with a forced aligner)",
                param="timestamp_granularities",
            )
        transcript = Transcript(text, clip.seconds, ended["usage"], **details)
        return render(form, transcript)

    async def first_text() -> Piece | None:
        async for piece in pieces:
            if piece.kind == "text":
                return piece
            if piece.kind == "usage":
                ended["usage"] = piece.data
        return None

    try:  # before the status line: a refused request still gets its 4xx
        first = await unless_disconnected(request, first_text)
    except BaseException:
        await close()
        raise
    return OwnedStreamingResponse(
        _events(first, pieces, ended, form),
        close,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache"},
    )


async def _events(
    first: Piece | None,
    pieces: AsyncIterator[Piece],
    ended: dict[str, Any],
    form: TranscriptionForm,
) -> AsyncIterator[bytes]:
    """A delta event per text piece, then the done event with the whole text and usage."""
    text: list[str] = []
    try:
        if first is not None:
            text.append(first.data)
            yield _event({"type": "transcript.text.delta", "delta": first.data})
            async for piece in pieces:
                if piece.kind == "text":
                    text.append(piece.data)
                    yield _event({"type": "transcript.text.delta", "delta": piece.data})
                elif piece.kind == "usage":
                    ended["usage"] = piece.data
                elif piece.kind == "details":
                    ended["details"] = piece.data
    except APIError as exc:
        yield _event({"type": "error", **exc.body()})
        return
    final = ended["details"].get("transcript", "".join(text))
    done: dict[str, Any] = {"type": "transcript.text.done", "text": final}
    usage = token_usage(ended["usage"])
    if usage is not None:
        done["usage"] = usage
    yield _event(done)


async def _about_file(pieces: AsyncIterator[Piece]) -> AsyncIterator[Piece]:
    """``pieces``, with a stage's refusal of the audio part said about ``file``.

    The stage names the clip by where it sits in the chat request it was
    given (``messages.1.content.0.input_audio``), a field this client never
    sent; the refusal (too long for ``factory.max_audio_seconds`` …) is about
    its ``file``.
    """
    try:
        async for piece in pieces:
            yield piece
    except APIError as exc:
        if exc.status != 400 or AUDIO_PART not in exc.message:
            raise
        message = exc.message.replace(f"{AUDIO_PART}.data", FIELD).replace(AUDIO_PART, FIELD)
        raise APIError(400, message, param=FIELD) from None
    finally:
        await pieces.aclose()  # type: ignore[attr-defined]


def _event(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()
