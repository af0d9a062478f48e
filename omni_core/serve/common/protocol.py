"""The request bodies of the OpenAI-compatible endpoints, validated with pydantic.

Unknown top-level fields are kept (``extra="allow"``): they are settings a
model takes beyond what is declared here and reach the entry stage untouched;
the stage rejects what it does not know. Validation failures become 400 with
the field named (``error.param``), never 422, because that is what OpenAI
answers and what its clients expect. Numbers are strict: ``true`` is not 1
and ``"0.5"`` is not 0.5.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AllowInfNan,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from .errors import APIError

SPEECH_FORMATS = ("wav", "pcm", "flac", "mp3", "opus", "aac")
CHAT_AUDIO_FORMATS = ("wav", "pcm16", "flac", "mp3", "opus", "aac")
SAMPLE_RATES = (8000, 48000)  # what a client may ask for; the encoders say which ones each takes
# No OpenAI request nests beyond a handful of levels. Deeper bodies are refused
# before parsing: json, pydantic and the IPC encoder all recurse, and a few
# thousand brackets would exhaust the stack (a 500 carrying a RecursionError).
MAX_JSON_DEPTH = 64
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # +1 / -1 as signed bytes
MAX_STOP = 4  # stop strings per request, as OpenAI
SEED_RANGE = (-(2**63), 2**63 - 1)  # a signed 64-bit integer, as vLLM and SGLang take it
# an int or a finite float; never a bool, a string, NaN or Infinity (which json.loads reads)
Number = Annotated[float, Strict(), AllowInfNan(False)]


def _voice_name(value: Any) -> Any:
    """OpenAI clients send a voice as a name or as ``{"id": name}``."""
    if isinstance(value, dict) and isinstance(value.get("id"), str):
        return value["id"]
    return value


class SpeechRequest(BaseModel):
    """``POST /v1/audio/speech``.

    ``speed`` (time-stretched, pitch kept) and ``sample_rate`` (resampled) are
    the server's work on the audio the pipeline made (:mod:`..audio.encoders`), so
    they are excluded from ``model_dump``, what the pipeline receives: every
    pipeline gets them, none has to implement them.
    """

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str = Field(min_length=1)
    voice: str | None = None
    response_format: Literal["wav", "pcm", "flac", "mp3", "opus", "aac"] = "wav"
    speed: Number = Field(default=1.0, ge=0.25, le=4.0, exclude=True)
    sample_rate: StrictInt | None = Field(
        default=None, ge=SAMPLE_RATES[0], le=SAMPLE_RATES[1], exclude=True
    )
    instructions: str | None = None
    stream: bool = False
    stream_format: Literal["audio", "sse"] | None = None  # sse: base64 audio in JSON events

    @field_validator("voice", mode="before")
    @classmethod
    def _voice(cls, value: Any) -> Any:
        return _voice_name(value)

    @property
    def streaming(self) -> bool:
        return self.stream or self.stream_format is not None


class ChatMessage(BaseModel):
    """One message; its content parts are checked part by part in :mod:`..chat.content`."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[Any] | None = None


class AudioOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    voice: str | None = None
    format: Literal["wav", "pcm16", "flac", "mp3", "opus", "aac"] = "wav"

    @field_validator("voice", mode="before")
    @classmethod
    def _voice(cls, value: Any) -> Any:
        return _voice_name(value)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: StrictBool | None = None
    include_obfuscation: StrictBool | None = None  # accepted; we add no obfuscation padding


def _unsupported(what: str, fix: str) -> PydanticCustomError:
    return PydanticCustomError("unsupported", f"{what} is not supported by this server; {fix}")


class ChatRequest(BaseModel):
    """``POST /v1/chat/completions``.

    What the entry stage receives (:meth:`payload`, as ``request.data``) is
    the validated body (``model_dump(mode="json")``: ``messages``, ``audio``,
    ``stream`` …, and any extra field the client sent) plus two keys the
    server writes:

    - ``modalities``: the outputs to produce, ``["text"]``, ``["audio"]`` or
      ``["text", "audio"]``, defaults filled in;
    - ``sampling``: the sampling settings, normalised. Stages read these here,
      never from the top-level fields (the client's spelling)::

        {
            "max_tokens": int | None,   # max_completion_tokens, else max_tokens; >= 1
            "temperature": float | None,  # [0, 2]; 0 is greedy
            "top_p": float | None,      # (0, 1]
            "top_k": int | None,        # >= 1, or 0 for no top-k limit (-1 sent is 0)
            "seed": int | None,         # signed 64-bit
            "stop": list[str],          # 0 to 4 non-empty strings; [] when none
            "repetition_penalty": float | None,  # > 0; 1 is none
        }

      ``None`` means the client did not say: the model's own default applies.
      A stage that cannot honour a value given (a seed, say) raises
      ``RequestError`` naming it rather than ignoring it.

    Refused here with a 400 naming the field: ``n`` other than 1, non-zero
    ``presence_penalty``/``frequency_penalty``, ``logprobs: true``,
    ``top_logprobs``, ``logit_bias``, a ``response_format`` other than text,
    ``tools``/``tool_choice``/``functions``/``function_call``, and
    ``stream_options`` without ``stream: true``.
    """

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioOutput | None = None
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: Number | None = Field(default=None, ge=0, le=2)
    top_p: Number | None = Field(default=None, gt=0, le=1)
    top_k: StrictInt | None = None
    seed: StrictInt | None = Field(default=None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    stop: str | list[str] | None = None
    repetition_penalty: Number | None = Field(default=None, gt=0)
    presence_penalty: Number | None = None
    frequency_penalty: Number | None = None
    n: StrictInt | None = None
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = None
    logit_bias: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None

    @field_validator("max_completion_tokens")
    @classmethod
    def _one_cap(cls, value: int | None, info: ValidationInfo) -> int | None:
        other = info.data.get("max_tokens")
        if value is not None and other is not None and other != value:
            raise PydanticCustomError(
                "conflict",
                "max_completion_tokens ({value}) and max_tokens ({other}) differ; "
                "send one of them (max_tokens is the older name of the same cap)",
                {"value": value, "other": other},
            )
        return value

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int | None) -> int | None:
        if value is not None and value < -1:
            raise PydanticCustomError(
                "top_k",
                "top_k must be >= 1, or -1 or 0 for no top-k limit; got {value}",
                {"value": value},
            )
        return value

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, value: Any) -> Any:
        """Checked whole, before the union, so that every error names ``stop`` itself."""
        if value is None:
            return value
        stops = [value] if isinstance(value, str) else value
        if not isinstance(stops, list) or not all(isinstance(stop, str) for stop in stops):
            raise PydanticCustomError("stop", "stop must be a string or a list of strings")
        if len(stops) > MAX_STOP:
            raise PydanticCustomError(
                "stop",
                "at most {limit} stop strings, got {count}",
                {"limit": MAX_STOP, "count": len(stops)},
            )
        if any(not stop for stop in stops):
            raise PydanticCustomError("stop", "stop strings must not be empty")
        return value

    @field_validator("n")
    @classmethod
    def _n(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise PydanticCustomError(
                "unsupported",
                "n must be 1: this server returns one choice per request; got {value}",
                {"value": value},
            )
        return value

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _penalty(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value:
            raise _unsupported(
                f"{info.field_name} other than 0",
                "omit it or send 0 (repetition_penalty is supported)",
            )
        return value

    @field_validator("logprobs")
    @classmethod
    def _logprobs(cls, value: bool | None) -> bool | None:
        if value:
            raise _unsupported("logprobs", "omit logprobs or send false")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs(cls, value: int | None) -> int | None:
        if value:
            raise _unsupported("top_logprobs", "omit it or send 0")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value:
            raise _unsupported("logit_bias", "omit it or send {}")
        return value

    @field_validator("response_format")
    @classmethod
    def _response_format(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and value != {"type": "text"}:
            kind = value.get("type")
            what = f"response_format {kind[:64]!r}" if isinstance(kind, str) else "response_format"
            raise _unsupported(
                what,
                'the answer is free text: omit response_format or send {"type": "text"}',
            )
        return value

    @field_validator("tools", "functions")
    @classmethod
    def _tools(cls, value: list[Any] | None, info: ValidationInfo) -> list[Any] | None:
        if value:
            raise _unsupported(f"{info.field_name} (function calling)", "omit it")
        return value

    @field_validator("tool_choice", "function_call")
    @classmethod
    def _tool_choice(cls, value: Any, info: ValidationInfo) -> Any:
        if value not in (None, "none"):
            raise _unsupported(
                f"{info.field_name} (function calling)",
                'omit it or send "none"',
            )
        return value

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, value: StreamOptions | None, info: ValidationInfo) -> Any:
        if value is not None and not info.data.get("stream"):
            raise PydanticCustomError(
                "stream_options", "stream_options is only allowed with stream: true"
            )
        return value

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def sampling(self) -> dict[str, Any]:
        """The normalised sampling settings (the contract is in the class docstring)."""
        cap = self.max_completion_tokens
        stop = self.stop
        return {
            "max_tokens": cap if cap is not None else self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": None if self.top_k is None else max(self.top_k, 0),
            "seed": self.seed,
            "stop": [stop] if isinstance(stop, str) else list(stop or []),
            "repetition_penalty": self.repetition_penalty,
        }

    def payload(self, modalities: list[str] | None = None) -> dict[str, Any]:
        """What the entry stage receives as ``request.data`` (see the class docstring)."""
        if "sampling" in (self.model_extra or {}):
            raise APIError(
                400,
                "sampling is written by the server; send max_tokens, temperature, top_p, "
                "top_k, seed, stop and repetition_penalty as top-level fields",
                param="sampling",
            )
        data = self.model_dump(mode="json")
        data["modalities"] = list(modalities if modalities is not None else self.modalities or [])
        data["sampling"] = self.sampling()
        return data


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


def validate_data(data: Any, model: type[Model]) -> Model:
    """Validate already-decoded JSON (one item of a batch); APIError(400) naming the bad field."""
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
