"""The answer in each ``response_format``, as OpenAI's clients parse it.

The pipelines serving this API produce text without timestamps, so the
timed formats (``srt``, ``vtt``, ``verbose_json``) hold one segment that
covers the whole clip, from 0 to its decoded duration. Of a segment's
fields, ``start``, ``end``, ``text``, ``temperature`` and
``compression_ratio`` (zlib over the text, as Whisper computes it) are
real; ``tokens`` is empty, and ``avg_logprob`` and ``no_speech_prob`` are 0,
because the pipeline reports neither token ids nor log probabilities.
``verbose_json`` with ``timestamp_granularities`` ``word`` adds ``words``
(``word``, ``start``, ``end``) from a pipeline that times them (qwen3-asr's
forced aligner), and its ``language`` is what the model heard when the
client gave none and the pipeline says.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse, PlainTextResponse, Response

from .form import TranscriptionForm


@dataclass(frozen=True)
class Transcript:
    """What the pipeline answered, and what the response formats need beside it."""

    text: str
    seconds: float  # the clip's decoded duration
    usage: dict[str, int] | None  # prompt/completion/total tokens, or None if not reported
    language: str | None = None  # what the model heard, when it says (qwen3-asr)
    words: list[dict[str, Any]] | None = None  # [{"word", "start", "end"}], when asked for


def token_usage(usage: dict[str, int] | None) -> dict[str, Any] | None:
    """The pipeline's counts in OpenAI's transcription shape (``type: "tokens"``)."""
    if usage is None:
        return None
    return {
        "type": "tokens",
        "input_tokens": usage["prompt_tokens"],
        "output_tokens": usage["completion_tokens"],
        "total_tokens": usage["total_tokens"],
    }


def render(form: TranscriptionForm, transcript: Transcript) -> Response:
    """The non-streamed response for ``form.response_format``."""
    kind = form.response_format
    text = transcript.text
    if kind == "text":
        return PlainTextResponse(text)
    if kind == "srt":
        span = f"{_stamp(0.0, ',')} --> {_stamp(transcript.seconds, ',')}"
        return PlainTextResponse(f"1\n{span}\n{text}\n\n")
    if kind == "vtt":
        span = f"{_stamp(0.0, '.')} --> {_stamp(transcript.seconds, '.')}"
        return PlainTextResponse(f"WEBVTT\n\n{span}\n{text}\n\n", media_type="text/vtt")
    body: dict[str, Any] = {"text": text}
    if kind == "verbose_json":
        body = {
            "task": form.task,
            "language": _language(form, transcript.language),
            "duration": round(transcript.seconds, 3),
            "text": text,
            "segments": [_segment(form, transcript)],
            **({"words": transcript.words} if form.words else {}),
            # whisper-1's shape for verbose_json: billed by duration, not tokens
            "usage": {"type": "duration", "seconds": round(transcript.seconds, 3)},
        }
    else:
        usage = token_usage(transcript.usage)
        if usage is not None:
            body["usage"] = usage
    return JSONResponse(body)


def _segment(form: TranscriptionForm, transcript: Transcript) -> dict[str, Any]:
    text = transcript.text
    encoded = text.encode()
    return {
        "id": 0,
        "seek": 0,
        "start": 0.0,
        "end": round(transcript.seconds, 3),
        "text": text,
        "tokens": [],
        "temperature": 0.0 if form.temperature is None else form.temperature,
        "avg_logprob": 0.0,
        "compression_ratio": len(encoded) / len(zlib.compress(encoded)) if encoded else 0.0,
        "no_speech_prob": 0.0,
    }


def _language(form: TranscriptionForm, heard: str | None) -> str:
    """The output's language: English for a translation, else the client's hint, else what
    the model says it heard (lower case, as OpenAI's names are)."""
    if form.task == "translate":
        return "english"
    return form.language or (heard or "unknown").lower()


def _stamp(seconds: float, comma: str) -> str:
    """``HH:MM:SS,mmm`` (srt) or ``HH:MM:SS.mmm`` (vtt)."""
    millis = round(seconds * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{comma}{millis:03d}"
