"""Server events: each one's shape, an ``event_id``, and the beta names older SDKs listen for.

GA and beta Realtime clients differ in a few server event names (GA
``response.output_audio.delta``, beta ``response.audio.delta``, and so on).
A session knows which its client speaks (:func:`beta_names` from the first
spelling it sees) and renames on the way out; everything else is one shape.
"""

from __future__ import annotations

import uuid
from typing import Any

# GA name -> beta name, for the events whose names changed.
BETA_NAMES = {
    "conversation.item.added": "conversation.item.created",
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
}


def event(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "event_id": f"event_{uuid.uuid4().hex[:20]}", **fields}


def error(
    message: str,
    *,
    code: str,
    param: str | None = None,
    event_id: str | None = None,
    kind: str = "invalid_request_error",
) -> dict[str, Any]:
    """An ``error`` event: the session goes on (the client's mistake, named)."""
    body = {"type": kind, "code": code, "message": message, "param": param, "event_id": event_id}
    return event("error", error=body)


def response_object(
    response_id: str,
    status: str,
    *,
    modalities: tuple[str, ...],
    output: list[dict[str, Any]] | None = None,
    usage: dict[str, Any] | None = None,
    details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "realtime.response",
        "status": status,
        "status_details": details,
        "output": output or [],
        "output_modalities": list(modalities),
        "usage": usage,
    }


def usage_object(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """The pipeline's token counts as the Realtime API reports them."""
    if not usage:
        return None
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    return {
        "total_tokens": prompt + completion,
        "input_tokens": prompt,
        "output_tokens": completion,
        "input_token_details": {"text_tokens": prompt, "audio_tokens": 0, "cached_tokens": 0},
        "output_token_details": {"text_tokens": completion, "audio_tokens": 0},
    }
