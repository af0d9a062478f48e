"""One response: a chat request through the pipeline, streamed back as Realtime events.

The conversation so far is the request's messages (:mod:`.conversation`); the
text the pipeline writes is the response's text, or its audio's transcript
when it speaks. Audio is resampled from the pipeline's rate to the session's
24 kHz and then into the client's output format. Cancelling (``response.cancel``,
or the user speaking over it) aborts the request in every process and leaves
in the conversation only what was sent.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field, replace
from typing import Any

import anyio

from ..audio.encoders import StreamEncoder
from ..common.errors import APIError
from ..common.protocol import ChatRequest, validate_data
from ..service import Service, later_reason
from .config import SessionConfig
from .conversation import Item, new_id
from .events import event, response_object, usage_object
from .formats import SESSION_RATE, from_session_pcm

PATH = "/v1/realtime"
ADMIT_WAIT = 60.0  # seconds a response waits for room in the runtime before it fails


@dataclass
class ResponsePlan:
    """What ``response.create`` asked for, over the session's settings."""

    instructions: str
    modalities: tuple[str, ...]
    voice: str | None
    max_tokens: int | None
    temperature: float | None = None
    use_conversation: bool = True
    extra_items: list[Item] = field(default_factory=list)


@dataclass(eq=False)
class Response:
    id: str
    plan: ResponsePlan
    item: Item
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    handle: Any = None
    cancel_reason: str | None = None
    audio_ms: float = 0.0  # audio sent to the client
    text: str = ""  # text (or transcript) sent to the client
    started: float = field(default_factory=time.perf_counter)
    first_audio: float | None = None
    done: anyio.Event = field(default_factory=anyio.Event)

    def cancel(self, reason: str) -> None:
        if self.cancel_reason is None:
            self.cancel_reason = reason
        self.scope.cancel()


def chat_data(service: Service, messages: list[dict[str, Any]], plan: ResponsePlan) -> dict:
    """The chat request a response is, validated as ``POST /v1/chat/completions`` would be."""
    speaks = "audio" in plan.modalities
    voices = getattr(service, "voices", None)
    if plan.voice and voices is not None:  # server.voice_aliases (the OpenAI preset's too)
        plan = replace(plan, voice=voices.aliases.get(plan.voice, plan.voice))
    body: dict[str, Any] = {"messages": messages}
    if plan.max_tokens is not None:
        body["max_tokens"] = plan.max_tokens
    if plan.temperature is not None:
        body["temperature"] = plan.temperature
    if speaks:
        body["audio"] = {"format": "pcm16", **({"voice": plan.voice} if plan.voice else {})}
    request = validate_data(body, ChatRequest)
    modalities = ["text", "audio"] if speaks else ["text"]
    if not service.serving.text_stage:
        modalities = ["audio"]
    data = request.payload(modalities)
    if speaks and plan.voice:
        data["voice"] = plan.voice  # as the chat route passes a voice on to the stages
    service.budget.check(data, "chat")
    return data


async def run_response(
    response: Response,
    service: Service,
    messages: list[dict[str, Any]],
    config: SessionConfig,
    send: Any,
) -> dict[str, Any]:
    """Stream one response to ``send``; returns its final ``response`` object."""
    plan, item = response.plan, response.item
    speaks = "audio" in plan.modalities
    ids = {"response_id": response.id, "item_id": item.id, "output_index": 0, "content_index": 0}
    part_type = "audio" if speaks else "text"
    status, details, usage, reason = "completed", None, None, "stop"
    encoder = None
    try:
        with response.scope:
            data = chat_data(service, messages, plan)
            response.handle = await _admit(service, data)
            await send(
                event(
                    "response.output_item.added",
                    response_id=response.id,
                    output_index=0,
                    item=item.describe(),
                )
            )
            await send(
                event("conversation.item.added", previous_item_id=None, item=item.describe())
            )
            await send(
                event(
                    "response.content_part.added",
                    **ids,
                    part={"type": part_type, "transcript" if speaks else "text": ""},
                )
            )
            rate = service.serving.sample_rate or SESSION_RATE
            if speaks:
                encoder = StreamEncoder("pcm", rate, SESSION_RATE, 1.0)
            async for piece in service.pieces(response.handle, path=PATH, started=response.started):
                if piece.kind == "text":
                    response.text += piece.data
                    kind = (
                        "response.output_audio_transcript.delta"
                        if speaks
                        else ("response.output_text.delta")
                    )
                    await send(event(kind, **ids, delta=piece.data))
                elif piece.kind == "audio" and speaks and encoder is not None:
                    await _send_audio(response, encoder.feed(piece.data), config, send, ids)
                elif piece.kind == "finish":
                    reason = later_reason(reason, piece.data)
                elif piece.kind == "usage":
                    usage = piece.data
            if encoder is not None:
                await _send_audio(response, encoder.flush(), config, send, ids)
    except APIError as exc:
        status = "failed"
        details = {
            "type": "failed",
            "error": {
                "type": "server_error" if exc.status >= 500 else "invalid_request_error",
                "code": exc.code,
                "message": exc.message,
            },
        }
    finally:
        if encoder is not None:
            encoder.close()
        if response.handle is not None:
            await service.finish(response.handle, response.cancel_reason or "response ended")
    if response.cancel_reason is not None:
        status = "cancelled"
        details = {"type": "cancelled", "reason": response.cancel_reason}
    elif status == "completed" and reason == "length":
        status = "incomplete"
        details = {"type": "incomplete", "reason": "max_output_tokens"}
    item.status = "incomplete" if status != "completed" else "completed"
    item.parts = [
        {
            "type": "output_audio" if speaks else "output_text",
            "transcript" if speaks else "text": response.text,
        }
    ]
    if response.handle is not None:
        if speaks:
            await send(event("response.output_audio.done", **ids))
            await send(
                event("response.output_audio_transcript.done", **ids, transcript=response.text)
            )
        else:
            await send(event("response.output_text.done", **ids, text=response.text))
        part = {"type": part_type, "transcript" if speaks else "text": response.text}
        await send(event("response.content_part.done", **ids, part=part))
        await send(
            event(
                "response.output_item.done",
                response_id=response.id,
                output_index=0,
                item=item.describe(),
            )
        )
    output = [item.describe()] if response.handle is not None else []
    return response_object(
        response.id,
        status,
        modalities=plan.modalities,
        output=output,
        usage=usage_object(usage),
        details=details,
    )


async def _admit(service: Service, data: dict[str, Any]) -> Any:
    """Admit the request, waiting (up to :data:`ADMIT_WAIT`) while the server is at capacity.

    A chat client gets a 429 and retries; a person talking to an agent would
    rather hear the answer a moment later, so a realtime response queues.
    """
    delay, deadline = 0.05, time.monotonic() + ADMIT_WAIT
    while True:
        try:
            return await service.admit(data, {"api": "chat"})
        except APIError as exc:
            if exc.status != 429 or time.monotonic() + delay > deadline:
                raise
        await anyio.sleep(delay)
        delay = min(delay * 2, 1.0)


async def _send_audio(
    response: Response, pcm: bytes, config: SessionConfig, send: Any, ids: dict[str, Any]
) -> None:
    if not pcm:
        return
    if response.first_audio is None:
        response.first_audio = time.perf_counter()
    response.audio_ms += len(pcm) / 2 / SESSION_RATE * 1000
    data = from_session_pcm(pcm, config.output_format)
    await send(event("response.output_audio.delta", **ids, delta=base64.b64encode(data).decode()))


def new_response(plan: ResponsePlan) -> Response:
    item = Item(new_id("item"), "assistant", status="in_progress")
    return Response(new_id("resp"), plan, item)
