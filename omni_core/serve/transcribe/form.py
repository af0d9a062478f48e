"""The multipart form of a transcription or translation, checked field by field.

OpenAI's clients send every field as a form part (numbers and booleans as
text; lists as repeated ``name[]`` parts). Every refusal is a 400 whose
``param`` names the field, and unknown fields are refused rather than
ignored, so that a client never believes a setting took effect when it did
not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..common.errors import APIError

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
STREAMABLE = ("json", "text")
MAX_PROMPT_CHARS = 4096  # context for the model, not a document: a few paragraphs
MAX_LANGUAGE_CHARS = 64
COMMON = {"file", "model", "prompt", "response_format", "temperature", "stream"}
TRANSCRIBE_ONLY = {"language", "timestamp_granularities[]", "include[]", "chunking_strategy"}


@dataclass(frozen=True)
class TranscriptionForm:
    """What the client asked for; ``task`` is "transcribe" or "translate"."""

    task: str
    file: bytes
    filename: str
    model: str | None
    language: str | None
    prompt: str | None
    response_format: str
    temperature: float | None
    stream: bool
    words: bool = False  # timestamp_granularities includes "word"


async def parse_form(form: Any, task: str) -> TranscriptionForm:
    """``form`` (Starlette's FormData) as a :class:`TranscriptionForm`; APIError(400) if wrong."""
    allowed = COMMON | (TRANSCRIBE_ONLY if task == "transcribe" else set())
    for key in form:
        if key not in allowed:
            raise APIError(
                400,
                f"unknown field {key!r}; this endpoint takes: {', '.join(sorted(allowed))}",
                param=key,
            )
    upload = form.get("file")
    if upload is None or isinstance(upload, str):
        raise APIError(
            400, "'file' must be an uploaded audio file (a multipart file part)", param="file"
        )
    words = _check_extras(form)
    response_format = _text(form, "response_format") or "json"
    if response_format not in FORMATS:
        raise APIError(
            400,
            f"response_format {response_format!r} is not supported; use one of "
            + ", ".join(FORMATS),
            param="response_format",
        )
    stream = _boolean(form, "stream")
    if stream and response_format not in STREAMABLE:
        raise APIError(
            400,
            f"response_format {response_format!r} cannot be streamed; stream json or text, "
            "or set stream to false",
            param="stream",
        )
    if words and response_format != "verbose_json":
        raise APIError(
            400,
            "timestamp_granularities 'word' needs response_format verbose_json (the only "
            "format with word timings)",
            param="timestamp_granularities",
        )
    return TranscriptionForm(
        task=task,
        file=await upload.read(),
        filename=upload.filename or "",
        model=_text(form, "model"),
        language=_bounded(form, "language", MAX_LANGUAGE_CHARS),
        prompt=_bounded(form, "prompt", MAX_PROMPT_CHARS),
        response_format=response_format,
        temperature=_temperature(form),
        stream=stream,
        words=words,
    )


def _check_extras(form: Any) -> bool:
    """OpenAI's options this server cannot honour are refused; the harmless ones accepted.

    Returns whether word timings were asked for (a pipeline that gives none is
    a 400 once it has answered; qwen3-asr's ``align`` stage gives them).
    """
    granularities = form.getlist("timestamp_granularities[]")
    for granularity in granularities:
        if granularity not in ("segment", "word"):
            raise APIError(
                400,
                f"timestamp_granularities {granularity!r} is not supported; use 'segment' "
                "(one segment covers the whole clip) or 'word'",
                param="timestamp_granularities",
            )
    for wanted in form.getlist("include[]"):
        raise APIError(
            400,
            f"include {wanted!r} is not supported: the pipeline reports no log probabilities",
            param="include",
        )
    strategy = _text(form, "chunking_strategy")
    if strategy not in (None, "auto"):
        raise APIError(
            400,
            "chunking_strategy must be 'auto' or left out: the whole clip is heard at once",
            param="chunking_strategy",
        )
    return "word" in granularities


def _text(form: Any, name: str) -> str | None:
    values = form.getlist(name)
    if len(values) > 1:
        raise APIError(400, f"{name!r} is given {len(values)} times; give it once", param=name)
    if not values:
        return None
    if not isinstance(values[0], str):
        raise APIError(400, f"{name!r} must be a text field, not a file", param=name)
    return values[0] or None


def _bounded(form: Any, name: str, limit: int) -> str | None:
    value = _text(form, name)
    if value is not None and len(value) > limit:
        raise APIError(
            400,
            f"{name!r} is {len(value)} characters; at most {limit} are taken",
            param=name,
            code="string_above_max_length",
        )
    return value


def _boolean(form: Any, name: str) -> bool:
    value = _text(form, name)
    if value is None or value.lower() == "false":
        return False
    if value.lower() == "true":
        return True
    raise APIError(400, f"{name!r} must be true or false, got {value[:32]!r}", param=name)


def _temperature(form: Any) -> float | None:
    value = _text(form, "temperature")
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not 0.0 <= number <= 1.0:
        raise APIError(
            400,
            f"temperature must be a number from 0 to 1, got {value[:32]!r}",
            param="temperature",
        )
    return number
