"""Text budgets checked in the API process, before a request reaches any stage.

Why here: a stage that tokenizes a 6 MB string does seconds of CPU work, and
the body limit (tens of MB, sized for media) does not bound text. Counting
characters costs nothing, so every API that takes text refuses an
oversized field with a 400 naming it and the setting, before anything is
submitted. The stages keep their own token budgets (a count in characters
cannot see how a tokenizer splits rare scripts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import APIError

SPEECH_TEXT_FIELDS = ("input", "instructions", "ref_text")


@dataclass(frozen=True)
class InputBudget:
    max_input_chars: int = 4096
    max_chat_text_chars: int = 131072

    @classmethod
    def of(cls, server: Any) -> InputBudget:
        return cls(server.max_input_chars, server.max_chat_text_chars)

    def check(self, data: dict[str, Any], api: str | None) -> None:
        """Refuse ``data`` (a request body as a stage will see it) over budget; 400."""
        if api == "speech":
            self._check_speech(data)
        elif api == "chat":
            self._check_chat(data)

    def _check_speech(self, data: dict[str, Any]) -> None:
        for name in SPEECH_TEXT_FIELDS:
            value = data.get(name)
            if isinstance(value, str) and len(value) > self.max_input_chars:
                raise APIError(
                    400,
                    f"{name!r} is {len(value)} characters; this server takes at most "
                    f"{self.max_input_chars} (server.max_input_chars): split the text "
                    "into several requests, or stream it over /v1/audio/speech/stream",
                    param=name,
                    code="string_above_max_length",
                )

    def _check_chat(self, data: dict[str, Any]) -> None:
        total = 0
        for message in data.get("messages") or []:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                total += len(content)
            elif isinstance(content, list):
                for part in content:
                    text = part.get("text") if isinstance(part, dict) else None
                    total += len(text) if isinstance(text, str) else 0
        if total > self.max_chat_text_chars:
            raise APIError(
                400,
                f"the messages hold {total} characters of text; this server takes at most "
                f"{self.max_chat_text_chars} per request (server.max_chat_text_chars)",
                param="messages",
                code="string_above_max_length",
            )
