"""``/v1/audio/speech/stream``: a WebSocket that speaks text while it is still being written.

Why: an LLM's answer should be heard while the LLM is still writing it. The
client sends the text in pieces as they come; the server cuts it into
sentences (:mod:`.segmenter`) and submits each one as soon as it is certainly
complete, as its own speech request, exactly what ``POST /v1/audio/speech``
would submit for that sentence (same fields, same voice resolution through
:meth:`..service.Service.admit`). Audio goes back in sentence order.

The protocol (JSON text messages; audio in binary frames unless asked
otherwise), client to server:

- ``{"type": "session.config", ...}``: optional, and only before the first
  ``input.text``; if the first message is ``input.text``, the defaults
  apply. Fields: ``response_format`` (``pcm`` by default; any format of
  ``POST /v1/audio/speech``: each segment's audio is a stream in that format
  of its own, WAV with a header of unknown length), ``audio_transport``
  (``binary`` frames, or ``base64`` in ``audio`` events), ``split``
  (``sentence`` or ``clause``), and any field of a speech request (``model``,
  ``voice``, ``speed``, ``sample_rate``, ``instructions``, ``language``,
  ``seed``, ...), passed to every segment's request. ``input``, ``stream``
  and ``stream_format`` are refused: the text arrives in pieces and the
  audio is always streamed. A second ``session.config`` is refused.
- ``{"type": "input.text", "text": "..."}``: any number of times.
- ``{"type": "input.done"}``: the rest of the text becomes the last segment;
  the session ends once everything is spoken.
- ``{"type": "session.close"}``: stop now; what is not yet spoken is dropped.

Server to client: ``session.created`` (the settings in effect, with the
audio's ``sample_rate``), then per segment, in order, ``segment.started``
(``segment``, ``text``), its audio, ``segment.done`` (``segment``, ``text``,
``audio_seconds``, ``finish_reason``: ``stop``, ``length`` or ``error``);
``error`` (``message``, ``status``, ``param``, ``code``, and ``segment`` when
a segment failed: its ``segment.done`` follows; the session goes on), and at
the end ``session.done`` (``usage``: ``segments`` spoken, their
``characters`` and ``audio_seconds``, and ``failed`` segments), then close
1000. A bad message gets an ``error`` and the socket stays usable.

Bounds: at most :data:`MAX_IN_FLIGHT` segments in the pipeline per session
(the next is submitted once the current one's first audio came, while that
one is still being sent); at most
:data:`BUFFER_SECONDS` of each one's audio held here, after which its audio
is no longer pulled from its request (the runtime's own stream of the
request keeps what the stage already made: at most a segment's length);
text received and not yet spoken beyond :data:`MAX_WAITING_CHARS` stops the
server reading the socket until segments finish. A client that leaves audio
unread for ``server.ws_send_timeout`` is disconnected (1008), and its
requests aborted.

Authentication is the HTTP routes' (:mod:`..common.auth`): the Bearer header, or for
browsers the subprotocol ``bearer.<key>`` next to :data:`SUBPROTOCOL`,
which the server selects when it is offered.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import time
import uuid
from collections import Counter
from contextlib import aclosing, suppress
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup
from starlette.websockets import WebSocket, WebSocketDisconnect

from ..common.auth import deny_websocket
from ..common.errors import APIError
from ..common.protocol import MAX_JSON_DEPTH, json_depth
from ..service import Service, later_reason
from .segmenter import MAX_CHARS, Segmenter
from .stream_buffer import AudioBuffer, Segment
from .stream_config import StreamConfig, parse_config

log = logging.getLogger("omni.serve")
PATH = "/v1/audio/speech/stream"
SUBPROTOCOL = "omni.speech"
MAX_IN_FLIGHT = 2  # segments submitted and not yet wholly sent, per session
BUFFER_SECONDS = 2.0  # audio held per segment before its request is no longer read
MAX_TEXT_CHARS = 64 * 1024  # one input.text
MAX_WAITING_CHARS = 64 * 1024  # received, not yet spoken: past it the socket is not read
CLIENT_TYPES = ("session.config", "input.text", "input.done", "session.close")


class SpeechStreams:
    """The endpoint, and what its live sessions hold (``buffered_bytes``, for tests and metrics)."""

    def __init__(self, service: Service, send_timeout: float):
        self.service, self.send_timeout = service, send_timeout
        rate = service.serving.sample_rate or 24000
        self.segment_buffer_bytes = int(BUFFER_SECONDS * rate) * 2
        self.buffer_limit = MAX_IN_FLIGHT * self.segment_buffer_bytes  # per session
        self.sessions: set[StreamSession] = set()
        self.peak_buffered_bytes = 0  # the most one session ever held
        self.outcomes: Counter[str] = Counter()  # how sessions ended: done, closed, stuck, gone

    @property
    def buffered_bytes(self) -> int:
        return sum(session.buffered for session in self.sessions)

    async def serve(self, websocket: WebSocket) -> None:
        try:
            self.service.require("speech", PATH)
        except APIError as exc:
            await deny_websocket(websocket.scope, websocket.send, exc)
            return
        offered = websocket.scope.get("subprotocols") or []
        await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
        session = StreamSession(websocket, self)
        self.sessions.add(session)
        try:
            await session.run()
        finally:
            self.sessions.discard(session)
            self.outcomes[session.outcome or "error"] += 1


@dataclass(eq=False)
class StreamSession:
    websocket: WebSocket
    streams: SpeechStreams
    config: StreamConfig | None = None
    segmenter: Segmenter | None = None
    input_started: bool = False
    input_done: bool = False
    outcome: str | None = None  # done, closed, stuck or gone
    buffered: int = 0  # PCM bytes held in this session's segment buffers
    waiting_chars: int = 0  # characters of segments made and not yet wholly sent
    usage: dict[str, Any] = field(
        default_factory=lambda: {"segments": 0, "characters": 0, "audio_seconds": 0.0, "failed": 0}
    )

    def __post_init__(self) -> None:
        self.service = self.streams.service
        self._segments = 0
        self._todo_send, self._todo = anyio.create_memory_object_stream[Segment | None](math.inf)
        self._order_send, self._order = anyio.create_memory_object_stream[Segment](MAX_IN_FLIGHT)
        self._slots = anyio.Semaphore(MAX_IN_FLIGHT)
        self._send_lock = anyio.Lock()
        self._progress = anyio.Event()
        self._live: list[Segment] = []
        self._scope: anyio.CancelScope | None = None

    # -- the session ------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with anyio.create_task_group() as tg:
                self._scope = tg.cancel_scope
                tg.start_soon(self._read)
                tg.start_soon(self._submit, tg)
                tg.start_soon(self._send_segments)
        except Exception:
            incident = uuid.uuid4().hex[:16]
            log.exception("internal error (request id %s) in WebSocket %s", incident, PATH)
            await self._close(1011, f"internal server error (request id {incident})")
            return
        finally:
            for segment in self._live:
                segment.audio.drop()
        if self.outcome == "closed":
            await self._say({"type": "session.done", "usage": self.usage}, quietly=True)
            await self._close(1000)
        elif self.outcome == "stuck":
            timeout = self.streams.send_timeout
            log.info("closing a WebSocket on %s: its client read nothing for %g s", PATH, timeout)
            await self._close(1008, f"audio left unread for {timeout:g} s (server.ws_send_timeout)")

    def _stop(self, outcome: str) -> None:
        if self.outcome is None:
            self.outcome = outcome
        if self._scope is not None:
            self._scope.cancel()

    # -- client messages --------------------------------------------------------------

    async def _read(self) -> None:
        while True:
            while self.waiting_chars + self._pending_chars() > MAX_WAITING_CHARS:
                await self._progress.wait()  # backpressure: the socket is not read meanwhile
            message = await self.websocket.receive()
            if message["type"] == "websocket.disconnect":
                self._stop("gone")
                return
            try:
                await self._handle(message)
            except APIError as exc:
                await self._error(exc)

    def _pending_chars(self) -> int:
        return len(self.segmenter.pending) if self.segmenter is not None else 0

    async def _handle(self, message: dict[str, Any]) -> None:
        raw = message.get("text")
        if raw is None:
            raise APIError(400, "binary messages are not part of this protocol; send JSON text")
        if json_depth(raw.encode()) > MAX_JSON_DEPTH:
            raise APIError(400, f"the message nests deeper than {MAX_JSON_DEPTH} levels")
        try:
            event = json.loads(raw)
        except ValueError as exc:
            raise APIError(400, f"the message is not valid JSON: {exc}") from None
        if not isinstance(event, dict):
            raise APIError(400, "a message must be a JSON object with a 'type'")
        kind = event.get("type")
        if kind == "session.config":
            await self._configure(event)
        elif kind == "input.text":
            await self._text(event)
        elif kind == "input.done":
            await self._done()
        elif kind == "session.close":
            self._stop("closed")
        else:
            shown = repr(kind)[:64] if kind is not None else "none"
            raise APIError(
                400,
                f"unknown message type {shown}; known: {', '.join(CLIENT_TYPES)}",
                param="type",
            )

    async def _configure(self, event: dict[str, Any]) -> None:
        if self.input_started:
            raise APIError(
                400, "session.config must come before the first input.text", param="type"
            )
        if self.config is not None:
            raise APIError(
                400,
                "the session is already configured; open another WebSocket for other settings",
                param="type",
            )
        config = parse_config(event, self.service)
        self.config = config
        self.segmenter = Segmenter(config.split, MAX_CHARS)  # type: ignore[arg-type]
        await self._say(config.echo(self.service.model_id))

    async def _text(self, event: dict[str, Any]) -> None:
        text = event.get("text")
        if not isinstance(text, str):
            raise APIError(400, "input.text needs 'text', a string", param="text")
        if len(text) > MAX_TEXT_CHARS:
            raise APIError(
                400,
                f"input.text carries {len(text)} characters; at most {MAX_TEXT_CHARS} "
                "per message (send the text in pieces)",
                param="text",
            )
        if self.input_done:
            raise APIError(400, "input.done was sent: no more text in this session", param="type")
        await self._defaults()
        self.input_started = True
        assert self.segmenter is not None
        self._queue(self.segmenter.feed(text))

    async def _done(self) -> None:
        if self.input_done:
            raise APIError(400, "input.done was already sent", param="type")
        await self._defaults()
        self.input_done = True
        assert self.segmenter is not None
        self._queue(self.segmenter.flush())
        self._todo_send.send_nowait(None)

    async def _defaults(self) -> None:
        """The first message was not a session.config: the defaults apply (and are echoed)."""
        if self.config is None:
            await self._configure({"type": "session.config"})

    def _queue(self, texts: list[str]) -> None:
        for text in texts:
            limit = self.streams.segment_buffer_bytes
            segment = Segment(self._segments, text, AudioBuffer(limit, self._count))
            self._segments += 1
            self.waiting_chars += len(text)
            self._todo_send.send_nowait(segment)

    def _count(self, delta: int) -> None:
        self.buffered += delta
        if self.buffered > self.streams.peak_buffered_bytes:
            self.streams.peak_buffered_bytes = self.buffered

    # -- segments through the pipeline ------------------------------------------------

    async def _submit(self, tg: TaskGroup) -> None:
        """Segments in order into the pipeline, at most MAX_IN_FLIGHT at a time.

        The next one goes in once this one's first audio came: it then has
        all of this one's playing time to be made, and does not compete with
        this one's first chunk, the wait the listener hears.
        """
        async with self._order_send:
            async for segment in self._todo:
                if segment is None:
                    return
                await self._slots.acquire()
                self._live.append(segment)
                tg.start_soon(self._produce, segment)
                await self._order_send.send(segment)
                await segment.audio.started.wait()

    async def _produce(self, segment: Segment) -> None:
        """One segment's request: its audio into the segment's buffer, or its error."""
        assert self.config is not None
        service, handle = self.service, None
        started = time.perf_counter()
        try:
            handle = await service.admit(self.config.request_data(segment.text), {"api": "speech"})
            async with aclosing(service.pieces(handle, path=PATH, started=started)) as pieces:
                async for piece in pieces:
                    if piece.kind == "audio":
                        await segment.audio.put(piece.data)
                    elif piece.kind == "finish":
                        segment.finish_reason = later_reason(segment.finish_reason, piece.data)
        except APIError as exc:
            segment.error = exc
        finally:
            segment.audio.close()
            if handle is not None:
                await service.finish(handle, "the WebSocket session ended")

    async def _send_segments(self) -> None:
        """Each segment's events and audio, in order; then session.done and close."""
        async with self._order:
            async for segment in self._order:
                try:
                    await self._send_segment(segment)
                finally:
                    self._live.remove(segment)
                    segment.audio.drop()
                    self.waiting_chars -= len(segment.text)
                    self._slots.release()
                    self._progress.set()
                    self._progress = anyio.Event()
        await self._say({"type": "session.done", "usage": self.usage})
        self.outcome = "done"
        await self._close(1000)
        self._stop("done")

    async def _send_segment(self, segment: Segment) -> None:
        assert self.config is not None
        index = segment.index
        await self._say({"type": "segment.started", "segment": index, "text": segment.text})
        encoder = self.config.encoder(self.service.serving.sample_rate or 0)
        fed = False
        try:
            while (pcm := await segment.audio.get()) is not None:
                fed = True
                await self._audio(index, encoder.feed(pcm))
            if fed:
                await self._audio(index, encoder.flush())
        finally:
            encoder.close()
        seconds = round(encoder.samples_out / encoder.out_rate, 3)
        if segment.error is None and not fed:
            segment.error = APIError(
                500,
                f"pipeline {self.service.serving.pipeline!r} finished without producing "
                f"audio in stage {self.service.serving.audio_stage!r}",
            )
        if segment.error is not None:
            await self._error(segment.error, index)
            self.usage["failed"] += 1
            reason = "error"
        else:
            self.usage["segments"] += 1
            self.usage["characters"] += len(segment.text)
            self.usage["audio_seconds"] = round(self.usage["audio_seconds"] + seconds, 3)
            reason = segment.finish_reason
        await self._say(
            {
                "type": "segment.done",
                "segment": index,
                "text": segment.text,
                "audio_seconds": seconds,
                "finish_reason": reason,
            }
        )

    # -- to the client ----------------------------------------------------------------

    async def _audio(self, index: int, data: bytes) -> None:
        if not data:
            return
        assert self.config is not None
        if self.config.audio_transport == "base64":
            payload = base64.b64encode(data).decode()
            await self._say({"type": "audio", "segment": index, "audio": payload})
        else:
            await self._send({"type": "websocket.send", "bytes": data})

    async def _error(self, exc: APIError, segment: int | None = None) -> None:
        event: dict[str, Any] = {"type": "error", "message": exc.message, "status": exc.status}
        event["param"], event["code"] = exc.param, exc.code
        if segment is not None:
            event["segment"] = segment
        await self._say(event)

    async def _say(self, event: dict[str, Any], quietly: bool = False) -> None:
        text = json.dumps(event, ensure_ascii=False)
        if quietly:  # after the task group: no deadline verdict to act on, just try
            with anyio.move_on_after(self.streams.send_timeout):
                with suppress(WebSocketDisconnect, RuntimeError):
                    await self.websocket.send({"type": "websocket.send", "text": text})
            return
        await self._send({"type": "websocket.send", "text": text})

    async def _send(self, message: dict[str, Any]) -> None:
        """Send within ``server.ws_send_timeout``, or end the session as stuck."""
        async with self._send_lock:
            try:
                with anyio.fail_after(self.streams.send_timeout):
                    await self.websocket.send(message)
                return
            except TimeoutError:
                self._stop("stuck")
            except WebSocketDisconnect:
                self._stop("gone")
        await anyio.lowlevel.checkpoint()  # the session's scope is cancelled: this raises

    async def _close(self, code: int, reason: str = "") -> None:
        reason = reason.encode()[:123].decode(errors="ignore")  # a close reason's limit
        deadline = anyio.move_on_after(self.streams.send_timeout)
        gone = suppress(WebSocketDisconnect, RuntimeError)  # gone, or closed already
        with anyio.CancelScope(shield=True), deadline, gone:
            await self.websocket.close(code, reason)
