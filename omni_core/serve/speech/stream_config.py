"""A speech WebSocket session's ``session.config``: checked once, before any text is spoken.

The endpoint's own fields (``audio_transport``, ``split``) and every field
of a speech request, validated as ``POST /v1/audio/speech`` would validate
them, so that each segment's request is exactly what that route would submit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from ..audio.encoders import StreamEncoder
from ..common.errors import APIError
from ..common.protocol import SpeechRequest, validate_data
from ..service import Service
from .segmenter import MAX_CHARS

REFUSED = {
    "input": "send the text in input.text messages, not in session.config",
    "stream": "the audio is always streamed here; omit stream",
    "stream_format": "the audio is always streamed here (audio_transport picks how); "
    "omit stream_format",
}


class StreamSettings(BaseModel):
    """The fields of ``session.config`` that are this endpoint's own, not the pipeline's."""

    model_config = ConfigDict(extra="forbid")

    audio_transport: Literal["binary", "base64"] = "binary"
    split: Literal["sentence", "clause"] = "sentence"


@dataclass(frozen=True)
class StreamConfig:
    """A session's validated settings."""

    fields: dict[str, Any]  # speech-request fields for every segment (no input)
    audio_transport: str
    split: str
    response_format: str
    speed: float
    sample_rate: int | None  # asked for; None: the pipeline's
    out_rate: int  # what the client gets

    def request_data(self, text: str) -> dict[str, Any]:
        """What ``POST /v1/audio/speech`` with this text and these fields would submit."""
        return validate_data({**self.fields, "input": text}, SpeechRequest).model_dump(mode="json")

    def encoder(self, in_rate: int) -> StreamEncoder:
        return StreamEncoder(self.response_format, in_rate, self.sample_rate, self.speed)

    def echo(self, model: str) -> dict[str, Any]:
        return {
            "type": "session.created",
            **self.fields,
            "model": self.fields.get("model") or model,
            "audio_transport": self.audio_transport,
            "split": self.split,
            "sample_rate": self.out_rate,
            "max_segment_chars": MAX_CHARS,
        }


def parse_config(message: dict[str, Any], service: Service) -> StreamConfig:
    """``session.config`` checked as far as it can be without text; APIError(400) names a field."""
    fields = {key: value for key, value in message.items() if key != "type"}
    for name, why in REFUSED.items():
        if name in fields:
            raise APIError(400, why, param=name)
    own = {key: fields.pop(key) for key in ("audio_transport", "split") if key in fields}
    settings = validate_data(own, StreamSettings)
    fields.setdefault("response_format", "pcm")
    request = validate_data({**fields, "input": "-"}, SpeechRequest)
    service.check_model(request.model)
    in_rate = service.serving.sample_rate or 0
    probe = StreamEncoder(request.response_format, in_rate, request.sample_rate, request.speed)
    probe.close()
    return StreamConfig(
        fields,
        settings.audio_transport,
        settings.split,
        request.response_format,
        request.speed,
        request.sample_rate,
        probe.out_rate,
    )
