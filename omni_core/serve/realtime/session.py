"""One ``/v1/realtime`` connection: client events in, server events out, one response at a time.

Three kinds of work run side by side in the session's task group: reading
client events (never blocked by the model: a response runs in its own
task), turn detection (:mod:`.vad`, in a worker thread, fed by appends), and
at most one response (:mod:`.response`). Every server event goes through
one sender that waits at most ``server.ws_send_timeout`` for a client that
does not read (then the session ends, 1008, and its response is aborted).

A client mistake (an unknown event, bad base64, a voice the pipeline does
not have, a setting this server cannot take) gets an ``error`` event naming
it and the event's id; the session goes on. Only a message that is not a
JSON object of text closes nothing either: it is an error like the others.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from typing import Any

import anyio
from starlette.websockets import WebSocket

from ..common.errors import APIError
from ..common.protocol import MAX_JSON_DEPTH, json_depth
from .config import ConfigError, SessionConfig, apply_update
from .conversation import Conversation, Item, new_id
from .events import BETA_NAMES, error, event, response_object
from .formats import SESSION_RATE, to_session_pcm
from .response import Response, ResponsePlan, new_response, run_response
from .vad import ServerVad

log = logging.getLogger("omni.serve")
MAX_BUFFER_SECONDS = 300.0  # input audio held before a commit
MAX_APPEND_BYTES = 15 * 1024 * 1024  # one input_audio_buffer.append, base64 (OpenAI's cap)
MAX_SESSION_SECONDS = 3600.0
ONLY_TRANSCRIBES = (
    "pipeline %r only transcribes: each committed turn gets its transcript, no response"
)
BETA_CLIENT = {"response.text.delta", "input_audio_transcription"}  # hints of a beta client


class RealtimeSession:
    def __init__(self, websocket: WebSocket, endpoint: Any):
        self.websocket, self.endpoint = websocket, endpoint
        self.service = endpoint.service
        self.id = new_id("sess")
        audio_out = self.service.serving.audio_stage is not None
        self.answers = "chat" in self.service.serving.api  # else it only transcribes
        self.config = SessionConfig.initial(audio_out=audio_out, answers=self.answers)
        self.conversation = Conversation()
        self.buffer = bytearray()  # session PCM since the last commit or clear
        self.buffer_start_ms = 0.0  # where self.buffer starts in the input audio
        self.vad: ServerVad | None = None
        self.speech_start_ms: float | None = None
        self.speech_item_id: str | None = None  # the user item the detected speech becomes
        self.response: Response | None = None
        self.beta = False
        self.outcome: str | None = None
        self._send_lock = anyio.Lock()
        self._tg: Any = None
        self._vad_limiter = anyio.CapacityLimiter(1)

    # -- the connection -------------------------------------------------------------
    async def run(self) -> None:
        await self._send(event("session.created", session=self._describe()))
        with anyio.move_on_after(MAX_SESSION_SECONDS) as expiry:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                await self._read()
                tg.cancel_scope.cancel()
        if expiry.cancelled_caught:
            await self._send(
                error("the session reached its time limit", code="session_expired"), quietly=True
            )
        if self.response is not None:
            self.response.cancel("session_closed")

    async def _read(self) -> None:
        while True:
            message = await self.websocket.receive()
            if message["type"] == "websocket.disconnect":
                self.outcome = "gone"
                return
            if self.outcome is not None:
                return
            try:
                await self._handle(message)
            except APIError as exc:
                await self._send(
                    error(
                        exc.message,
                        code=exc.code or "invalid_request",
                        param=exc.param,
                        event_id=getattr(exc, "event_id", None),
                    )
                )
            except ConfigError as exc:
                await self._send(error(str(exc), code="invalid_value", param=exc.param))

    async def _send(self, payload: dict[str, Any], *, quietly: bool = False) -> None:
        if self.beta and payload["type"] in BETA_NAMES:
            payload = {**payload, "type": BETA_NAMES[payload["type"]]}
        try:
            async with self._send_lock:
                with anyio.fail_after(self.endpoint.send_timeout):
                    await self.websocket.send_text(json.dumps(payload))
        except TimeoutError:
            self.outcome = "stuck"
            if self._tg is not None:
                self._tg.cancel_scope.cancel()
            if not quietly:
                raise anyio.get_cancelled_exc_class()() from None
        except Exception:
            if not quietly:
                self.outcome = self.outcome or "gone"

    def _describe(self) -> dict[str, Any]:
        return self.config.describe(self.service.model_id, self.id)

    # -- client events --------------------------------------------------------------
    async def _handle(self, message: dict[str, Any]) -> None:
        raw = message.get("text")
        if raw is None:
            raise APIError(
                400,
                "binary frames are not part of this protocol; send JSON text",
                code="invalid_event",
            )
        if json_depth(raw.encode()) > MAX_JSON_DEPTH:
            raise APIError(
                400, f"the event nests deeper than {MAX_JSON_DEPTH} levels", code="invalid_event"
            )
        try:
            payload = json.loads(raw)
        except ValueError as exc:
            raise APIError(
                400, f"the event is not valid JSON: {exc}", code="invalid_json"
            ) from None
        if not isinstance(payload, dict) or not isinstance(payload.get("type"), str):
            raise APIError(
                400, "an event must be a JSON object with a string 'type'", code="invalid_event"
            )
        kind, event_id = payload["type"], payload.get("event_id")
        handler = HANDLERS.get(kind)
        if handler is None:
            raise _named(
                APIError(
                    400, f"unknown event type {kind!r}", code="invalid_event_type", param="type"
                ),
                event_id,
            )
        try:
            await handler(self, payload)
        except APIError as exc:
            raise _named(exc, event_id) from None
        except ConfigError as exc:
            await self._send(
                error(str(exc), code="invalid_value", param=exc.param, event_id=event_id)
            )

    async def _session_update(self, payload: dict[str, Any]) -> None:
        session = payload.get("session")
        if isinstance(session, dict) and ({"modalities", "input_audio_format"} & set(session)):
            self.beta = True
        audio_out = self.service.serving.audio_stage is not None
        config = apply_update(self.config, session, audio_out=audio_out)
        if config.turn_detection != self.config.turn_detection:
            self.vad = None  # rebuilt with the new settings on the next append
        self.config = config
        await self._send(event("session.updated", session=self._describe()))

    async def _append(self, payload: dict[str, Any]) -> None:
        audio = payload.get("audio")
        if not isinstance(audio, str):
            raise APIError(
                400, "audio must be a base64 string", code="invalid_value", param="audio"
            )
        if len(audio) > MAX_APPEND_BYTES:
            raise APIError(
                400,
                f"one append holds at most {MAX_APPEND_BYTES} base64 bytes",
                code="invalid_value",
                param="audio",
            )
        try:
            data = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise APIError(
                400, "audio is not valid base64", code="invalid_base64", param="audio"
            ) from None
        pcm = to_session_pcm(data, self.config.input_format)
        limit = int(MAX_BUFFER_SECONDS * SESSION_RATE) * 2
        if len(self.buffer) + len(pcm) > limit:
            raise APIError(
                400,
                f"the input audio buffer holds at most {MAX_BUFFER_SECONDS:g} s; "
                "commit or clear it",
                code="input_audio_buffer_full",
                param="audio",
            )
        self.buffer += pcm
        if self.config.turn_detection is not None:
            await self._detect(pcm)

    async def _detect(self, pcm: bytes) -> None:
        if self.vad is None:
            assert self.config.turn_detection is not None
            self.vad = ServerVad(self.config.turn_detection)
        vad = self.vad
        found = await anyio.to_thread.run_sync(vad.feed, pcm, limiter=self._vad_limiter)
        detection = self.config.turn_detection
        for change in found:
            # Both events name the user item the speech will become (a string: the
            # Realtime API documents item_id as one, and strict clients such as
            # pipecat's refuse a null); committing the turn creates it under that id.
            if change.kind == "started":
                self.speech_start_ms = change.ms
                self.speech_item_id = new_id("item")
                if self.response is not None and detection and detection.interrupt_response:
                    self.response.cancel("turn_detected")  # barge-in
                await self._send(
                    event(
                        "input_audio_buffer.speech_started",
                        audio_start_ms=change.ms,
                        item_id=self.speech_item_id,
                    )
                )
            else:
                item_id, self.speech_item_id = self.speech_item_id or new_id("item"), None
                await self._send(
                    event(
                        "input_audio_buffer.speech_stopped",
                        audio_end_ms=change.ms,
                        item_id=item_id,
                    )
                )
                await self._commit_turn(self.speech_start_ms or 0.0, change.ms, item_id)
                answer = detection and detection.create_response and self.answers
                if answer and self.response is None:
                    self._start(self._plan({}))

    async def _commit_turn(self, start_ms: float, end_ms: float, item_id: str) -> None:
        """The detected turn's audio becomes a user item; what follows it stays buffered."""
        begin = max(0, int((start_ms - self.buffer_start_ms) * SESSION_RATE / 1000) * 2)
        end = max(begin, int((end_ms - self.buffer_start_ms) * SESSION_RATE / 1000) * 2)
        pcm = bytes(self.buffer[begin:end])
        del self.buffer[:end]
        self.buffer_start_ms += end / 2 / SESSION_RATE * 1000
        await self._add_user_audio(pcm, item_id)

    async def _commit(self, payload: dict[str, Any]) -> None:
        if len(self.buffer) < SESSION_RATE * 2 // 10:  # 100 ms, as OpenAI requires
            raise APIError(
                400,
                "the input audio buffer holds less than 100 ms of audio",
                code="input_audio_buffer_commit_empty",
            )
        pcm = bytes(self.buffer)
        self.buffer_start_ms += len(pcm) / 2 / SESSION_RATE * 1000
        self.buffer.clear()
        await self._add_user_audio(pcm)

    async def _add_user_audio(self, pcm: bytes, item_id: str | None = None) -> None:
        item = Item(
            item_id or new_id("item"),
            "user",
            [{"type": "input_audio", "pcm": pcm, "transcript": None}],
        )
        previous = self.conversation.add(item)
        await self._send(
            event("input_audio_buffer.committed", previous_item_id=previous, item_id=item.id)
        )
        await self._send(
            event("conversation.item.added", previous_item_id=previous, item=item.describe())
        )
        if self.config.transcription and self._tg is not None:
            from .transcripts import transcribe

            self._tg.start_soon(transcribe, self, item)

    async def _clear(self, payload: dict[str, Any]) -> None:
        self.buffer_start_ms += len(self.buffer) / 2 / SESSION_RATE * 1000
        self.buffer.clear()
        await self._send(event("input_audio_buffer.cleared"))

    async def _item_create(self, payload: dict[str, Any]) -> None:
        from .items import parse_item

        item = parse_item(payload.get("item"), self.config)
        try:
            previous = self.conversation.add(item, payload.get("previous_item_id"))
        except KeyError:
            raise APIError(
                400,
                "previous_item_id names no item of this conversation",
                code="item_not_found",
                param="previous_item_id",
            ) from None
        await self._send(
            event("conversation.item.added", previous_item_id=previous, item=item.describe())
        )

    async def _item_retrieve(self, payload: dict[str, Any]) -> None:
        item_id = payload.get("item_id")
        try:
            item = self.conversation.get(str(item_id))
        except KeyError:
            raise APIError(
                400,
                f"no item {item_id!r} in this conversation",
                code="item_not_found",
                param="item_id",
            ) from None
        await self._send(event("conversation.item.retrieved", item=item.describe()))

    async def _item_delete(self, payload: dict[str, Any]) -> None:
        item_id = payload.get("item_id")
        try:
            self.conversation.delete(str(item_id))
        except KeyError:
            raise APIError(
                400,
                f"no item {item_id!r} in this conversation",
                code="item_not_found",
                param="item_id",
            ) from None
        await self._send(event("conversation.item.deleted", item_id=item_id))

    async def _item_truncate(self, payload: dict[str, Any]) -> None:
        from .items import truncate

        item_id = payload.get("item_id")
        try:
            item = self.conversation.get(str(item_id))
        except KeyError:
            raise APIError(
                400,
                f"no item {item_id!r} in this conversation",
                code="item_not_found",
                param="item_id",
            ) from None
        end = truncate(item, payload.get("audio_end_ms"))
        await self._send(
            event(
                "conversation.item.truncated",
                item_id=item_id,
                content_index=payload.get("content_index", 0),
                audio_end_ms=end,
            )
        )

    async def _response_create(self, payload: dict[str, Any]) -> None:
        if not self.answers:
            raise APIError(
                400, ONLY_TRANSCRIBES % self.service.serving.pipeline, code="unsupported_api"
            )
        if self.response is not None:
            raise APIError(
                400,
                "a response is already in progress; cancel it first",
                code="conversation_already_has_active_response",
            )
        self._start(self._plan(payload.get("response") or {}))

    async def _response_cancel(self, payload: dict[str, Any]) -> None:
        if self.response is None:
            raise APIError(
                400, "there is no response in progress to cancel", code="response_cancel_not_active"
            )
        self.response.cancel("client_cancelled")

    # -- responses ----------------------------------------------------------------------
    def _plan(self, overrides: Any) -> ResponsePlan:
        from .items import response_plan

        return response_plan(self.config, overrides, self.service)

    def _start(self, plan: ResponsePlan) -> None:
        response = new_response(plan)
        self.response = response
        self._tg.start_soon(self._respond, response)

    async def _respond(self, response: Response) -> None:
        plan = response.plan
        history = (
            self.conversation.messages(plan.instructions)
            if plan.use_conversation
            else ([{"role": "system", "content": plan.instructions}] if plan.instructions else [])
        )
        for extra in plan.extra_items:
            scratch = Conversation()
            scratch.add(extra)
            history += scratch.messages("")
        await self._send(
            event(
                "response.created",
                response=response_object(response.id, "in_progress", modalities=plan.modalities),
            )
        )
        final = response_object(response.id, "failed", modalities=plan.modalities)
        try:
            final = await run_response(response, self.service, history, self.config, self._send)
        finally:
            response.item.audio_ms = response.audio_ms
            if response.handle is not None and plan.use_conversation:
                self.conversation.add(response.item)
            self.response = None
            self.endpoint.record(response, final["status"])
            failure = (final.get("status_details") or {}).get("error")
            if final["status"] == "failed" and failure:
                await self._send(
                    error(
                        failure["message"], code=failure["code"] or "failed", kind=failure["type"]
                    ),
                    quietly=True,
                )
            await self._send(event("response.done", response=final), quietly=True)
            response.done.set()


def _named(exc: APIError, event_id: Any) -> APIError:
    exc.event_id = event_id  # type: ignore[attr-defined]
    return exc


HANDLERS = {
    "session.update": RealtimeSession._session_update,
    "transcription_session.update": RealtimeSession._session_update,
    "input_audio_buffer.append": RealtimeSession._append,
    "input_audio_buffer.commit": RealtimeSession._commit,
    "input_audio_buffer.clear": RealtimeSession._clear,
    "conversation.item.create": RealtimeSession._item_create,
    "conversation.item.delete": RealtimeSession._item_delete,
    "conversation.item.retrieve": RealtimeSession._item_retrieve,
    "conversation.item.truncate": RealtimeSession._item_truncate,
    "response.create": RealtimeSession._response_create,
    "response.cancel": RealtimeSession._response_cancel,
}
