"""What clients write into a session: conversation items, truncations, response options.

``conversation.item.create`` takes a ``message`` item (``system``, ``user`` or
``assistant``) whose content parts are ``input_text`` / ``input_audio`` (user,
system) or ``output_text`` / ``text`` (assistant; beta ``text`` and
``audio`` are read too). A user item may also hold ``input_image``
(``image_url``: a ``data:image/...;base64,`` URL, as OpenAI's Realtime API
spells it) and ``input_video`` (``video_url``: a ``data:video/...;base64,``
URL; our addition, for models that see video): they reach the model as the
chat API's ``image_url`` / ``video_url`` parts, bounded and decoded by the
pipeline's own media limits. Function calls are not supported: this server runs
no tools, and says so. ``response.create`` may override the session's
instructions, output modalities, voice and token cap for one response, and
with ``conversation: "none"`` answer only its own ``input`` items.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from ..chat.content import check_base64
from ..common.errors import APIError
from .config import ConfigError, SessionConfig, _max_tokens, _modalities, _temperature
from .conversation import Item, new_id
from .formats import to_session_pcm
from .response import ResponsePlan

ROLES = ("system", "user", "assistant")
MEDIA_PARTS = {"input_image": ("image_url", "image"), "input_video": ("video_url", "video")}


def parse_item(value: Any, config: SessionConfig) -> Item:
    if not isinstance(value, dict):
        raise APIError(400, "item must be an object", code="invalid_value", param="item")
    kind = value.get("type", "message")
    if kind != "message":
        raise APIError(
            400,
            f"item type {kind!r} is not supported here (this server runs no "
            "tools); send a message item",
            code="invalid_value",
            param="item.type",
        )
    role = value.get("role")
    if role not in ROLES:
        raise APIError(
            400,
            f"item.role must be one of {', '.join(ROLES)}",
            code="invalid_value",
            param="item.role",
        )
    content = value.get("content")
    if not isinstance(content, list) or not content:
        raise APIError(
            400,
            "item.content must be a non-empty list of parts",
            code="invalid_value",
            param="item.content",
        )
    parts = [_part(part, role, i, config) for i, part in enumerate(content)]
    return Item(str(value.get("id") or new_id("item")), role, parts)


def _part(part: Any, role: str, index: int, config: SessionConfig) -> dict[str, Any]:
    where = f"item.content[{index}]"
    if not isinstance(part, dict):
        raise APIError(400, f"{where} must be an object", code="invalid_value", param=where)
    kind = part.get("type")
    text_kinds = ("output_text", "text") if role == "assistant" else ("input_text", "text")
    if kind in text_kinds:
        text = part.get("text")
        if not isinstance(text, str):
            raise APIError(
                400, f"{where}.text must be a string", code="invalid_value", param=f"{where}.text"
            )
        return {"type": kind, "text": text}
    if kind in ("input_audio", "audio") and role == "user":
        audio = part.get("audio")
        try:
            data = base64.b64decode(audio or "", validate=True)
        except (binascii.Error, ValueError, TypeError):
            raise APIError(
                400,
                f"{where}.audio is not valid base64",
                code="invalid_base64",
                param=f"{where}.audio",
            ) from None
        return {
            "type": "input_audio",
            "pcm": to_session_pcm(data, config.input_format),
            "transcript": part.get("transcript"),
        }
    if kind in MEDIA_PARTS and role == "user":
        key, medium = MEDIA_PARTS[kind]
        return {"type": kind, "url": _data_url(part.get(key), medium, f"{where}.{key}")}
    user_kinds = ("input_audio", *MEDIA_PARTS)
    allowed = ", ".join(text_kinds + (user_kinds if role == "user" else ()))
    raise APIError(
        400,
        f"{where}.type {kind!r} is not a part a {role} item can hold here; use {allowed}",
        code="invalid_value",
        param=f"{where}.type",
    )


def _data_url(value: Any, medium: str, where: str) -> str:
    """``value`` if it is a base64 ``data:`` URL of a ``medium`` (or untyped), else a 400."""
    if not isinstance(value, str) or not value[:5].lower() == "data:":
        raise APIError(
            400,
            f"{where} must be a data: URL (data:{medium}/...;base64,...); a session reads "
            "no files or remote URLs",
            code="invalid_value",
            param=where,
        )
    head, comma, payload = value[5:].partition(",")
    params = [p.strip().lower() for p in head.split(";")]
    mediatype = params[0] if len(params) > 1 else ""
    if not comma or params[-1] != "base64" or (mediatype and not mediatype.startswith(medium)):
        raise APIError(
            400,
            f"{where} must be data:{medium}/...;base64,<data>",
            code="invalid_value",
            param=where,
        )
    try:
        check_base64(payload, where)
    except APIError as exc:
        raise APIError(400, exc.message, code="invalid_base64", param=where) from None
    return value


def truncate(item: Item, audio_end_ms: Any) -> int:
    """Keep what the client heard of an assistant item: its transcript cut in proportion.

    The model's text carries no timings, so the transcript is cut at the same
    fraction of its characters as ``audio_end_ms`` is of the audio sent.
    """
    if item.role != "assistant":
        raise APIError(
            400, "only assistant items can be truncated", code="invalid_value", param="item_id"
        )
    if isinstance(audio_end_ms, bool) or not isinstance(audio_end_ms, int) or audio_end_ms < 0:
        raise APIError(
            400, "audio_end_ms must be an integer >= 0", code="invalid_value", param="audio_end_ms"
        )
    if item.audio_ms and audio_end_ms > item.audio_ms + 1:
        raise APIError(
            400,
            f"audio_end_ms {audio_end_ms} is past the item's audio ({item.audio_ms:.0f} ms)",
            code="invalid_value",
            param="audio_end_ms",
        )
    fraction = min(1.0, audio_end_ms / item.audio_ms) if item.audio_ms else 1.0
    for part in item.parts:
        for key in ("transcript", "text"):
            if isinstance(part.get(key), str):
                part[key] = part[key][: int(len(part[key]) * fraction)]
    item.audio_ms = min(item.audio_ms, float(audio_end_ms))
    return audio_end_ms


def response_plan(config: SessionConfig, overrides: Any, service: Any) -> ResponsePlan:
    if not isinstance(overrides, dict):
        raise APIError(400, "response must be an object", code="invalid_value", param="response")
    audio_out = service.serving.audio_stage is not None
    modalities = config.output_modalities
    try:
        for name in ("output_modalities", "modalities"):
            if name in overrides:
                modalities = _modalities(overrides[name], name, audio_out)
        tokens = config.max_output_tokens
        for name in ("max_output_tokens", "max_response_output_tokens"):
            if name in overrides:
                tokens = _max_tokens(overrides[name], f"response.{name}")
        temperature = config.temperature
        if "temperature" in overrides:
            temperature = _temperature(overrides["temperature"], "response.temperature")
    except ConfigError as exc:
        raise APIError(
            400, str(exc), code="invalid_value", param=exc.param.replace("session.", "response.")
        ) from None
    voice = config.voice
    output = (
        ((overrides.get("audio") or {}).get("output") or {})
        if isinstance(overrides.get("audio"), dict)
        else {}
    )
    voice = output.get("voice", overrides.get("voice", voice))
    instructions = overrides.get("instructions", config.instructions)
    if not isinstance(instructions, str):
        raise APIError(
            400,
            "response.instructions must be a string",
            code="invalid_value",
            param="response.instructions",
        )
    conversation = overrides.get("conversation", "auto")
    extra = [parse_item(item, config) for item in overrides.get("input") or []]
    return ResponsePlan(
        instructions,
        modalities,
        voice,
        tokens,
        temperature=temperature,
        use_conversation=conversation != "none",
        extra_items=extra,
    )
