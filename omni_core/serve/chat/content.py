"""The content parts a chat message may hold, each checked for shape before anything reads it.

Stages read message content by key (``part["image_url"]["url"]`` …), so a
part of the wrong shape must be refused here, with the field named, rather
than reach a stage as a list where a string was meant or a ``{"path": …}``
nobody checked. Accepted, as OpenAI and the Qwen-Omni processors write them::

    {"type": "text", "text": str}                      (also "refusal")
    {"type": "image_url", "image_url": {"url": str, "detail"?: "auto"|"low"|"high"}}
    {"type": "audio_url", "audio_url": {"url": str}}   (also "video_url")
    {"type": "input_audio", "input_audio": {"data": base64, "format"?: "wav"|...}}
    {"type": "image", "image": str}                    (also "audio", "video")

Nothing else: unknown types and unknown keys are refused. Every media
reference found (a URL or path) is returned for :mod:`.media` to check.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..common.errors import APIError

TEXT_PARTS = ("text", "refusal")
URL_PARTS = {"image_url": "image", "audio_url": "audio", "video_url": "video"}
BARE_PARTS = {"image": "image", "audio": "audio", "video": "video"}
PART_TYPES = (*TEXT_PARTS, *URL_PARTS, "input_audio", *BARE_PARTS)
INPUT_AUDIO_FORMATS = ("wav", "mp3", "flac", "ogg")
IMAGE_DETAIL = ("auto", "low", "high")
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")


@dataclass
class Reference:
    """One media reference in a message: where it is, what it should be, how to rewrite it."""

    where: str  # the request field, e.g. messages.0.content.1.image_url.url
    value: str
    kind: str  # image, audio or video
    replace: Callable[[str], None]


def check_base64(text: str, where: str) -> None:
    """APIError(400) unless ``text`` is padded standard base64 (checked without decoding)."""
    if not text:
        raise APIError(400, f"{where}: is empty; expected base64 data", param=where)
    if len(text) % 4 or not _BASE64.fullmatch(text):
        raise APIError(
            400,
            f"{where}: is not base64 (standard alphabet A-Z a-z 0-9 + /, padded with =, "
            "no spaces or line breaks)",
            param=where,
        )


def media_references(messages: list[dict[str, Any]]) -> list[Reference]:
    """Check the shape of every content part; return the media references they hold."""
    found: list[Reference] = []
    for m_index, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for p_index, part in enumerate(content):
            found.extend(_part(part, f"messages.{m_index}.content.{p_index}"))
    return found


def _part(part: Any, where: str) -> list[Reference]:
    if not isinstance(part, dict):
        raise APIError(400, f"{where}: a content part must be an object", param=where)
    kind = part.get("type")
    if not isinstance(kind, str):
        raise APIError(400, f"{where}: a content part needs a string 'type'", param=f"{where}.type")
    if kind not in PART_TYPES:
        raise APIError(
            400,
            f"{where}.type: unsupported content part type {kind!r}; accepted: "
            + ", ".join(PART_TYPES),
            param=f"{where}.type",
        )
    _only_keys(part, ("type", kind), where)
    if kind not in part:
        raise APIError(400, f"{where}: a {kind!r} part needs a {kind!r} field", param=where)
    value, inner = part[kind], f"{where}.{kind}"
    if kind in TEXT_PARTS:
        _string(value, inner)
        return []
    if kind in BARE_PARTS:
        _string(value, inner)
        return [Reference(inner, value, BARE_PARTS[kind], lambda new: part.__setitem__(kind, new))]
    if kind == "input_audio":
        _input_audio(value, inner)
        return []
    if not isinstance(value, dict):
        raise APIError(400, f"{inner}: must be an object like {{'url': '...'}}", param=inner)
    _only_keys(value, ("url", "detail") if kind == "image_url" else ("url",), inner)
    if "url" not in value:
        raise APIError(400, f"{inner}: needs a 'url'", param=f"{inner}.url")
    _string(value["url"], f"{inner}.url")
    if "detail" in value and value["detail"] not in IMAGE_DETAIL:
        raise APIError(
            400,
            f"{inner}.detail: must be one of {', '.join(IMAGE_DETAIL)}",
            param=f"{inner}.detail",
        )
    return [
        Reference(
            f"{inner}.url", value["url"], URL_PARTS[kind], lambda new: value.__setitem__("url", new)
        )
    ]


def _input_audio(value: Any, where: str) -> None:
    if not isinstance(value, dict):
        raise APIError(
            400, f"{where}: must be an object like {{'data': base64, 'format': 'wav'}}", param=where
        )
    _only_keys(value, ("data", "format"), where)
    if "data" not in value:
        raise APIError(400, f"{where}: needs 'data' (base64 audio)", param=f"{where}.data")
    _string(value["data"], f"{where}.data")
    check_base64(value["data"], f"{where}.data")
    if "format" in value and value["format"] not in INPUT_AUDIO_FORMATS:
        raise APIError(
            400,
            f"{where}.format: must be one of {', '.join(INPUT_AUDIO_FORMATS)}",
            param=f"{where}.format",
        )


def _only_keys(value: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in value:
        if key not in allowed:
            raise APIError(
                400,
                f"{where}: unknown field {key!r}; accepted: {', '.join(allowed)}",
                param=f"{where}.{key}",
            )


def _string(value: Any, where: str) -> None:
    if not isinstance(value, str):
        raise APIError(400, f"{where}: must be a string, got {type(value).__name__}", param=where)
