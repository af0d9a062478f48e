"""Step 2: stage factories. Each returns an object with ``async def run(request)``."""

from __future__ import annotations

import os

from omni_core import RequestError


class Greet:
    def __init__(self, greeting: str):
        self.greeting = greeting

    async def run(self, request):
        return {"text": f"{self.greeting}, {name_of(request.data)}"}


class Shout:
    def __init__(self, suffix: str, gpu_id: int | None):
        self.suffix, self.gpu_id = suffix, gpu_id

    async def run(self, request):
        text = request.data["text"].upper() + self.suffix
        await request.emit(text)  # the text_stage's chunks are the reply's text deltas
        return {"text": text, "pid": os.getpid(), "gpu_id": self.gpu_id}


def name_of(data: dict) -> str:
    """``{"name": ...}`` (Runtime.run in tests), or the last user message of a chat request."""
    if data.get("name"):
        return data["name"]
    for message in reversed(data.get("messages") or []):
        content = message.get("content") if message.get("role") == "user" else None
        if isinstance(content, list):  # content parts: keep the text ones
            content = " ".join(p.get("text", "") for p in content if p.get("type") == "text")
        if isinstance(content, str) and content.strip():
            return content.strip()
    raise RequestError("nobody to greet: send a user message with a name")


def create_greet(greeting: str) -> Greet:
    return Greet(greeting)


def create_shout(suffix: str, gpu_id: int | None = None) -> Shout:
    # gpu_id is a standard kwarg: injected because this signature declares it.
    return Shout(suffix, gpu_id)
