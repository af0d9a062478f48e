"""The session's conversation: items in order, and the chat history they make.

An item is a message (``system``, ``user`` or ``assistant``) of content
parts: ``input_text``, ``input_audio`` (the user's PCM16 at 24 kHz, kept as
audio: the model hears it again in later turns), ``output_text`` and
``output_audio`` (with its transcript). A response's prompt is the whole
conversation as chat messages, the user's audio as WAV ``input_audio``
parts and the assistant's turns as the text of what was actually sent (an
interrupted answer is truncated to the audio the client received).

Bounds (:data:`MAX_ITEMS`, :data:`MAX_AUDIO_SECONDS`): past either, the
oldest items leave the history (they are no longer heard or read by the
model), so a long session costs a bounded prompt.
"""

from __future__ import annotations

import base64
import io
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..audio.pcm import wav_header
from .formats import SESSION_RATE

MAX_ITEMS = 64
MAX_AUDIO_SECONDS = 300.0  # of user audio kept in the history


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


@dataclass
class Item:
    id: str
    role: str  # system, user, assistant
    parts: list[dict[str, Any]] = field(default_factory=list)  # {"type", "text"|"pcm"|...}
    status: str = "completed"
    audio_ms: float = 0.0  # an assistant item: its audio as the client received it

    @property
    def audio_seconds(self) -> float:
        return sum(len(p.get("pcm", b"")) for p in self.parts) / (2 * SESSION_RATE)

    def describe(self) -> dict[str, Any]:
        """The item as the API shows it (audio bytes are never echoed back)."""
        content = []
        for part in self.parts:
            kind = part["type"]
            if kind in ("input_text", "output_text", "text"):
                content.append({"type": kind, "text": part.get("text", "")})
            else:
                content.append({"type": kind, "transcript": part.get("transcript")})
        return {
            "id": self.id,
            "object": "realtime.item",
            "type": "message",
            "status": self.status,
            "role": self.role,
            "content": content,
        }


class Conversation:
    def __init__(self) -> None:
        self.items: list[Item] = []

    def last_id(self) -> str | None:
        return self.items[-1].id if self.items else None

    def add(self, item: Item, previous_id: str | None = None) -> str | None:
        """Insert after ``previous_id`` (None: at the end); returns the id before it."""
        if previous_id is None or previous_id == self.last_id():
            before = self.last_id()
            self.items.append(item)
        else:
            index = self.index(previous_id)
            self.items.insert(index + 1, item)
            before = previous_id
        self._bound()
        return before

    def index(self, item_id: str) -> int:
        for i, item in enumerate(self.items):
            if item.id == item_id:
                return i
        raise KeyError(item_id)

    def get(self, item_id: str) -> Item:
        return self.items[self.index(item_id)]

    def delete(self, item_id: str) -> None:
        del self.items[self.index(item_id)]

    def _bound(self) -> None:
        while len(self.items) > MAX_ITEMS:
            self.items.pop(0)
        while sum(i.audio_seconds for i in self.items) > MAX_AUDIO_SECONDS and self.items:
            self.items.pop(0)

    def messages(self, instructions: str) -> list[dict[str, Any]]:
        """The conversation as chat messages (a prompt for the next response)."""
        out: list[dict[str, Any]] = []
        if instructions:
            out.append({"role": "system", "content": instructions})
        for item in self.items:
            if item.role == "assistant":
                text = "".join(p.get("text") or p.get("transcript") or "" for p in item.parts)
                if text:
                    out.append({"role": "assistant", "content": text})
                continue
            content: list[dict[str, Any]] = []
            for part in item.parts:
                if part.get("pcm"):
                    content.append(
                        {
                            "type": "input_audio",
                            "input_audio": {
                                "data": base64.b64encode(_wav(part["pcm"])).decode(),
                                "format": "wav",
                            },
                        }
                    )
                elif part.get("type") in ("input_image", "input_video"):
                    kind = "image_url" if part["type"] == "input_image" else "video_url"
                    content.append({"type": kind, kind: {"url": part["url"]}})
                elif part.get("text"):
                    content.append({"type": "text", "text": part["text"]})
            if not content:
                continue
            if item.role == "system":
                text = "".join(c.get("text", "") for c in content)
                out.append({"role": "system", "content": text})
            else:
                out.append({"role": "user", "content": content})
        return out


def _wav(pcm: bytes) -> bytes:
    buffer = io.BytesIO()
    buffer.write(wav_header(SESSION_RATE, len(pcm)))
    buffer.write(pcm)
    return buffer.getvalue()
