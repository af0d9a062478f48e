"""The request bodies of the OpenAI-compatible endpoints, validated with pydantic.

Unknown top-level fields are kept (``extra="allow"``): they are the sampling
settings a model takes beyond OpenAI's (``top_k``, ``repetition_penalty`` …)
and reach the entry stage untouched; the stage rejects what it does not know.
Validation failures become 400 with the field named, never 422, because that
is what OpenAI answers and what its clients expect.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import APIError

SPEECH_FORMATS = ("wav", "pcm", "flac")
CHAT_AUDIO_FORMATS = ("wav", "pcm16", "flac")
# No OpenAI request nests beyond a handful of levels. Deeper bodies are refused
# before parsing: json, pydantic and the IPC encoder all recurse, and a few
# thousand brackets would exhaust the stack (a 500 carrying a RecursionError).
MAX_JSON_DEPTH = 64
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # +1 / -1 as signed bytes


def _voice_name(value: Any) -> Any:
    """OpenAI clients send a voice as a name or as ``{"id": name}``."""
    if isinstance(value, dict) and isinstance(value.get("id"), str):
        return value["id"]
    return value


class SpeechRequest(BaseModel):
    """``POST /v1/audio/speech``."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str = Field(min_length=1)
    voice: str | None = None
    response_format: Literal["wav", "pcm", "flac"] = "wav"
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    instructions: str | None = None
    stream: bool = False
    stream_format: Literal["audio"] | None = None

    @field_validator("voice", mode="before")
    @classmethod
    def _voice(cls, value: Any) -> Any:
        return _voice_name(value)

    @property
    def streaming(self) -> bool:
        return self.stream or self.stream_format == "audio"


class ChatMessage(BaseModel):
    """One message; its content parts are checked part by part in :mod:`.content`."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[Any] | None = None


class AudioOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    voice: str | None = None
    format: Literal["wav", "pcm16", "flac"] = "wav"

    @field_validator("voice", mode="before")
    @classmethod
    def _voice(cls, value: Any) -> Any:
        return _voice_name(value)


class ChatRequest(BaseModel):
    """``POST /v1/chat/completions``."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioOutput | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: Literal[1] = 1
    stream: bool = False
    stream_options: dict[str, Any] | None = None


Model = TypeVar("Model", bound=BaseModel)


def json_depth(raw: bytes) -> int:
    """How deeply arrays and objects nest in the JSON text ``raw``, without parsing it.

    Strings are cut out first (brackets inside them do not count); what is left
    is reduced to its brackets and summed as +1/-1 steps, all in C loops, so a
    body at the size limit costs well under a second and no recursion.
    """
    steps = _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS).translate(_STEPS)
    return max(itertools.accumulate(memoryview(steps).cast("b")), default=0)


def parse_body(raw: bytes, model: type[Model]) -> Model:
    """Decode and validate a JSON body; APIError(400) naming the first bad field."""
    depth = json_depth(raw)
    if depth > MAX_JSON_DEPTH:
        raise APIError(
            400,
            f"the request body nests arrays and objects {depth} levels deep; "
            f"the limit is {MAX_JSON_DEPTH}",
        )
    try:
        data = json.loads(raw) if raw else None
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc) from None


def _validation_error(exc: ValidationError) -> APIError:
    problems = []
    for error in exc.errors(include_url=False):
        path = ".".join(str(part) for part in error["loc"])
        message = error["msg"]
        if error["type"] == "literal_error" and "input" in error:
            message += f", got {error['input']!r}"
        problems.append((path, f"field {path!r}: {message}" if path else message))
    text = "; ".join(message for _, message in problems)
    return APIError(400, f"invalid request: {text}", param=problems[0][0] or None)
