"""What the endpoints (and ``omni run``) share: the pipeline's serving declaration,
admission, and turning a request's events into text deltas and PCM audio.

Runtime errors map to HTTP once, here: ``Overloaded`` 429 (with Retry-After),
``Unavailable`` 503, a stage's ``RequestError`` 400 with the stage's message,
the loss of a process the request was bound to (it died or hung) 503 naming
it, any other stage failure 500 with the request id only: the failure's text
(an exception's message, which can carry paths or data) and the stage's
traceback go to the server log (``omni.serve``) under that id, with the stage
and its process, never to the client. A stage that breaks the serving
contract (a text delta that is not a ``str``, audio the server cannot encode,
a malformed ``usage``) is a 500 naming the stage, the field and what was
expected, logged under the request id too.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio

from ..errors import ConfigError
from ..runtime.coordinator import Overloaded, RequestFailed, RequestHandle, Unavailable
from .audio.pcm import to_pcm16
from .common import openai_compat
from .common.budgets import InputBudget
from .common.errors import APIError

log = logging.getLogger("omni.serve")


def public_model_name(model_path: str) -> str:
    """``model_path`` as clients may see it: a hub id or preset as written, a directory's name.

    A local checkpoint's full path describes the host (user names, mounts,
    layout) and is no use to a client, which only needs a name to send back
    as ``model``; the operator's start-up output keeps the path.
    """
    if not model_path:
        return ""
    local = os.path.expanduser(model_path)
    if model_path.startswith(("/", ".", "~")) or model_path.count("/") > 1 or os.path.isdir(local):
        return os.path.basename(os.path.abspath(local))
    return model_path


# What a pipeline class may list in ``api``: speech (text in, audio out), chat (messages in),
# transcription (audio in, its text out: /v1/audio/transcriptions and /translations).
APIS = ("speech", "chat", "transcription")
# What a speech request's ``input`` is to the pipeline: text to read aloud, or a message
# the model answers aloud (PipelineConfig.speech_input).
SPEECH_INPUTS = ("read", "answer")


@dataclass(frozen=True)
class Serving:
    """A pipeline class's serving attributes, checked once at start-up."""

    pipeline: str
    api: tuple[str, ...]
    audio_stage: str | None
    text_stage: str | None
    sample_rate: int | None
    speech_input: str = "read"

    @classmethod
    def of(cls, pipeline_cls: Any) -> Serving:
        serving = cls(
            pipeline_cls.pipeline_name,
            tuple(pipeline_cls.api),
            pipeline_cls.audio_stage,
            pipeline_cls.text_stage,
            pipeline_cls.sample_rate,
            getattr(pipeline_cls, "speech_input", "read"),
        )
        where = f"pipeline {serving.pipeline!r} ({pipeline_cls.__module__}.{pipeline_cls.__name__})"
        unknown = set(serving.api) - set(APIS)
        if unknown:
            raise ConfigError(
                f"{where} declares unknown api {sorted(unknown)}; known: {', '.join(APIS)}"
            )
        if not serving.api:
            raise ConfigError(
                f"{where} declares no api, so there is nothing to serve",
                hint='set api = ("speech",), ("chat",) and/or ("transcription",) on the class',
            )
        if serving.speech_input not in SPEECH_INPUTS:
            raise ConfigError(
                f"{where} declares speech_input {serving.speech_input!r}; "
                f"known: {', '.join(SPEECH_INPUTS)}",
                hint='"read" (the input is read aloud) or "answer" (the model answers it aloud)',
            )
        if "speech" in serving.api and not (serving.audio_stage and serving.sample_rate):
            raise ConfigError(
                f"{where} serves speech but does not declare both audio_stage and sample_rate"
            )
        if serving.audio_stage and not serving.sample_rate:
            raise ConfigError(f"{where} declares audio_stage without sample_rate")
        if "chat" in serving.api and not (serving.text_stage or serving.audio_stage):
            raise ConfigError(
                f"{where} serves chat but declares neither text_stage nor audio_stage"
            )
        if "transcription" in serving.api and not serving.text_stage:
            raise ConfigError(
                f"{where} serves transcription but declares no text_stage (the transcript)"
            )
        return serving

    @property
    def usage_stage(self) -> str | None:
        """The stage whose token counts are the request's usage: the text stage, else audio."""
        return self.text_stage or self.audio_stage


@dataclass
class Piece:
    """Something for the client: a text delta (str), PCM16 audio (bytes), why it ended, usage.

    A terminal stage's final output may be a dict that carries either or both of

    - ``"finish_reason"``: ``"stop"`` (the model ended, or hit a stop string)
      or ``"length"`` (a token or frame cap ended it) -> ``Piece("finish", str)``.
      Where the pipeline has a text stage, its reason is the request's: an
      audio stage's ``"stop"`` (the talker spoke all the text it was given)
      is dropped, so it never hides the text's ``"length"``; an audio
      ``"length"`` (its frame cap) counts. Consumers fold reasons with
      :func:`later_reason`;
    - ``"usage"``: ``{"prompt_tokens": int, "completion_tokens": int}`` ->
      ``Piece("usage", {"prompt_tokens", "completion_tokens", "total_tokens"})``.
      Only the :attr:`Serving.usage_stage` counts (a speech pipeline's text
      stage, not its audio stage: the counts are never summed across stages);
    - ``"language"`` (what the model heard) and ``"words"`` (``[{"word", "start",
      "end"}]``, seconds) from the text stage -> ``Piece("details", {...})``, for
      a transcription's ``verbose_json``; and ``"transcript"``, the final text
      when it is not just the streamed deltas joined (qwen3-asr collapses
      runaway repetitions in its finished text), which a transcription's
      response and done event then carry.
    """

    kind: str  # "text", "audio", "finish", "usage" or "details"
    data: Any


def later_reason(ended: str, reason: str) -> str:
    """The request's finish reason once a stage reported ``reason``: "length" stays.

    Any terminal stage's cap ends the answer short (the text stage's
    max_tokens, the audio stage's frame cap), whichever stage reports last.
    """
    return "length" if "length" in (ended, reason) else reason


@dataclass
class Service:
    runtime: Any
    serving: Serving
    model_names: tuple[str, ...]
    request_timeout: float
    audio_meter: Any = None  # .metrics.AudioMeter: times each request's audio chunks
    voices: Any = None  # .voices.Voices: resolves a speech request's voice (aliases, uploads)
    # text limits, checked before anything is submitted
    budget: InputBudget = field(default_factory=InputBudget)

    # what /v1/audio/speech encodes when the request names no response_format
    speech_format: str = openai_compat.DEFAULT_SPEECH_FORMAT
    hidden_names: frozenset[str] = frozenset()  # accepted as model, never listed

    @classmethod
    def of(cls, runtime: Any, pipeline_cls: Any, config: Any) -> Service:
        server = config.server
        serving = Serving.of(pipeline_cls)
        public = public_model_name(config.model_path)
        names = [
            *server.served_model_names,
            public,
            config.model_path,  # still accepted from a client that knows it, never shown
            pipeline_cls.pipeline_name,
        ]
        if server.openai_compat:  # OpenAI's names for the APIs served (see .openai_compat)
            names += openai_compat.model_names(serving.api)
        model_names = tuple(dict.fromkeys(n for n in names if n))
        hidden = {config.model_path} - {public, *server.served_model_names}
        return cls(
            runtime,
            serving,
            model_names,
            config.runtime.request_timeout,
            budget=InputBudget.of(config.server),
            speech_format=(
                openai_compat.SPEECH_FORMAT
                if server.openai_compat
                else openai_compat.DEFAULT_SPEECH_FORMAT
            ),
            hidden_names=frozenset(hidden),
        )

    @property
    def model_id(self) -> str:
        return self.model_names[0]

    def require(self, api: str, path: str) -> None:
        if api not in self.serving.api:
            raise APIError(
                404,
                f"pipeline {self.serving.pipeline!r} does not serve {path}; "
                f"it serves: {', '.join(self.serving.api)}",
                code="unsupported_api",
            )

    def check_model(self, model: str | None) -> None:
        if model and model not in self.model_names:
            served = ", ".join(repr(n) for n in self.model_names if n not in self.hidden_names)
            raise APIError(
                404,
                f"model {model!r} is not served here; this server serves {served}; to accept "
                "other names, list them in server.served_model_name (e.g. "
                f"""--server.served_model_name '["{self.model_id}", "{model[:64]}"]'), or set """
                "server.openai_compat = true for OpenAI's model names",
                param="model",
                code="model_not_found",
            )

    async def admit(self, data: dict[str, Any], params: dict[str, Any]) -> RequestHandle:
        """Admit one API request: its text budgets, its voice, then into the runtime."""
        self.require_ready()
        self.budget.check(data, params.get("api"))
        if params.get("api") == "speech" and self.voices is not None:
            data = self.voices.apply(data)  # every speech API: aliases, uploaded voices
        try:
            return await self.runtime.dispatch(data, params)
        except Overloaded as exc:
            raise APIError(429, exc.render(), headers={"Retry-After": "1"}) from None
        except Unavailable as exc:
            raise APIError(503, exc.render()) from None
        except RequestFailed as exc:
            raise APIError(503, exc.render()) from None

    def require_ready(self) -> None:
        """503 while the runtime starts (the HTTP server listens from the first moment)."""
        if getattr(self.runtime, "ready", True):
            return
        children = getattr(self.runtime, "children", {})
        ready = sum(1 for child in children.values() if child.state == "healthy")
        raise APIError(
            503,
            f"the server is starting: {ready} of {len(children)} processes ready "
            "(GET /health shows each one); retry shortly",
            code="starting",
            headers={"Retry-After": "2"},
        )

    async def finish(self, handle: RequestHandle, reason: str) -> None:
        """Abort ``handle`` everywhere unless it already ended (safe to call twice)."""
        if not handle.done.is_set():
            with anyio.CancelScope(shield=True):
                await self.runtime.abort(handle, reason)

    async def pieces(
        self, handle: RequestHandle, *, path: str = "", started: float | None = None
    ) -> AsyncIterator[Piece]:
        """The request's text deltas and audio as they come; APIError on failure or timeout.

        A terminal stage that emitted no chunks but returned its whole output
        (a string, or an array of samples) counts as one piece. Every audio
        piece of every API passes here: ``audio_meter`` times each as it is
        handed on, labelled by ``path``.
        """
        started = time.perf_counter() if started is None else started
        streamed: set[str] = set()
        meter = None if self.audio_meter is None else self.audio_meter.request(path, started)
        deadline = time.monotonic() + self.request_timeout
        stream = handle.stream()
        try:
            while True:
                try:
                    with anyio.fail_after(max(0.0, deadline - time.monotonic())):
                        event = await stream.__anext__()
                except StopAsyncIteration:
                    return
                try:
                    if event.final and isinstance(event.data, dict):
                        endings = self._ending(event)
                    else:
                        endings = None
                        piece = self._piece(event, streamed)
                except ContractError as exc:
                    raise self._contract_broken(handle, event.stage, exc) from None
                if endings is not None:
                    for ending in endings:
                        yield ending
                    continue
                if piece is None:
                    continue
                if piece.kind == "audio" and meter is not None:  # PCM16 mono: 2 bytes a sample
                    meter.chunk(len(piece.data) / (2 * (self.serving.sample_rate or 1)))
                yield piece
        except TimeoutError:
            await self.finish(handle, "timed out")
            raise APIError(
                504,
                f"the request did not finish in {self.request_timeout:g} s "
                "(runtime.request_timeout)",
            ) from None
        except RequestFailed as exc:
            if exc.client_error:
                raise APIError(400, exc.message) from None
            if exc.process_lost:  # operational state, not internals: say it, invite a retry
                raise APIError(503, exc.message, headers={"Retry-After": "1"}) from None
            log.error(
                "request %s failed in stage %r (process %s): %s%s",
                handle.request_id,
                exc.stage or "?",
                exc.process or "?",
                exc.message.removeprefix(f"stage {exc.stage!r} failed: "),
                f"\n{exc.detail}" if exc.detail else "",
            )
            raise APIError(
                500,
                f"internal server error (request id {handle.request_id}); "
                "the server log has the details",
            ) from None
        finally:
            if meter is not None:
                meter.end()
            await stream.aclose()

    def _contract_broken(self, handle: RequestHandle, stage: str, exc: ContractError) -> APIError:
        """Log a stage's breach of the serving contract under the request id; its 500."""
        try:
            process = self.runtime.table.process_for(stage, handle.binding)
        except (AttributeError, KeyError):
            process = "?"
        log.error(
            "request %s failed in stage %r (process %s): %s",
            handle.request_id,
            stage,
            process,
            exc.message,
        )
        return APIError(500, f"{exc.message} (request id {handle.request_id})")

    def _ending(self, event: Any) -> list[Piece]:
        """The finish reason and usage a terminal stage's final dict carries (see Piece)."""
        serving = self.serving
        if event.stage not in (serving.audio_stage, serving.text_stage):
            return []
        found = []
        reason = event.data.get("finish_reason")
        spoken_all = event.stage != serving.text_stage and serving.text_stage and reason == "stop"
        if isinstance(reason, str) and not spoken_all:  # see Piece
            found.append(Piece("finish", reason))
        usage = event.data.get("usage")
        if usage is not None and event.stage == serving.usage_stage:
            found.append(Piece("usage", _usage(usage, event.stage)))
        details = {
            k: event.data[k] for k in ("language", "words", "transcript") if event.data.get(k)
        }
        if details and event.stage == serving.text_stage:
            found.append(Piece("details", details))
        return found

    def _piece(self, event: Any, streamed: set[str]) -> Piece | None:
        serving = self.serving
        if event.stage not in (serving.audio_stage, serving.text_stage):
            return None
        if event.final and (
            event.stage in streamed or not _is_whole(event.data, event.stage, serving)
        ):
            return None
        streamed.add(event.stage)
        if event.stage == serving.audio_stage:
            what = "final output" if event.final else "audio chunk"
            try:
                return Piece("audio", to_pcm16(event.data))
            except (TypeError, ValueError) as exc:
                raise ContractError(
                    f"stage {event.stage!r} (the pipeline's audio_stage) produced an {what} "
                    f"the server cannot encode ({exc}); expected 1-D float32 samples in "
                    "[-1, 1] (a numpy array or a tensor)"
                ) from None
        if not isinstance(event.data, str):
            raise ContractError(
                f"stage {event.stage!r} (the pipeline's text_stage) produced a text delta of "
                f"type {type(event.data).__name__}; expected str: await request.emit(text) "
                "with a string"
            )
        return Piece("text", event.data)


class ContractError(Exception):
    """A terminal stage's output breaks what the server serves (see Service.pieces)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def _usage(usage: Any, stage: str) -> dict[str, int]:
    """A stage's ``usage``, checked, plus ``total_tokens``; ContractError if it is malformed."""
    counts = {}
    for key in ("prompt_tokens", "completion_tokens"):
        value = usage.get(key) if isinstance(usage, dict) else None
        if type(value) is not int or value < 0:
            raise ContractError(
                f"stage {stage!r} reported usage {key} = {value!r} in its final output; "
                'expected "usage": {"prompt_tokens": int >= 0, "completion_tokens": int >= 0}'
            )
        counts[key] = value
    return {**counts, "total_tokens": counts["prompt_tokens"] + counts["completion_tokens"]}


def _is_whole(data: Any, stage: str, serving: Serving) -> bool:
    """Is a final output that followed no chunks the whole text or audio itself?"""
    if stage == serving.text_stage:
        return isinstance(data, str)
    return hasattr(data, "shape")
