"""The release's prompt, and the header its answers start with.

A request is a system turn holding the context (the client's ``prompt``:
names, spellings, the topic; empty when none) and a user turn holding the
clip, rendered with the checkpoint's chat template (Qwen3-Omni's renderer),
then ``<|im_start|>assistant\\n``. The clip's placeholder is repeated once per
audio-tower row. This is what ``qwen_asr``'s ``Qwen3ASRModel`` builds.

The model answers ``language <Name><asr_text><transcript>`` (``language
None<asr_text>`` for a clip without speech). Forcing a language appends that
header to the prompt, so the model writes the transcript only: the release's
way, and ours. :class:`AnswerParser` reads the header off a streamed answer,
so only transcript text reaches the client, and says which language it named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ASR_TEXT = "<asr_text>"
LANGUAGE_PREFIX = "language "


def prompt_ids(prompter: Any, context: str, audio_rows: int, language: str | None) -> list[int]:
    """Token ids of one request: the chat turns, the generation prompt, a forced header."""
    messages = [
        {"role": "system", "content": context or ""},
        {"role": "user", "content": [{"type": "audio"}]},
    ]
    text = prompter.render(messages)
    if language:
        text += f"{LANGUAGE_PREFIX}{language}{ASR_TEXT}"
    return prompter.expand_placeholders(text, audio_token_counts=[audio_rows])


@dataclass
class AnswerParser:
    """Feed decoded text as it streams; get back the transcript's part of it.

    With a forced language everything is transcript. Otherwise text is held
    until ``<asr_text>`` shows up (its header names the language) or cannot
    any more: an answer that does not start like ``language ...`` has no
    header, and is all transcript (as the release's parser treats it).
    """

    forced: str | None = None
    language: str | None = None
    _held: str = ""
    _open: bool = field(default=False, init=False)
    _started: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if self.forced:
            self.language, self._open = self.forced, True

    def feed(self, text: str) -> str:
        """The transcript's part of ``text``; leading blanks dropped, as the release strips."""
        out = self._feed(text)
        if not self._started:
            out = out.lstrip()
            self._started = bool(out)
        return out

    def _feed(self, text: str) -> str:
        if self._open:
            return text
        self._held += text
        if ASR_TEXT in self._held:
            header, rest = self._held.split(ASR_TEXT, 1)
            self._header(header)
            self._held, self._open = "", True
            return rest
        head = self._held.lstrip()
        if not (LANGUAGE_PREFIX.startswith(head) or head.startswith(LANGUAGE_PREFIX)):
            out, self._held, self._open = self._held, "", True
            return out
        return ""

    def flush(self) -> str:
        """What is held when the answer ends (a header never closed is transcript)."""
        out, self._held = self._held, ""
        return out if self._started else out.lstrip()

    def _header(self, header: str) -> None:
        for line in header.splitlines():
            line = line.strip()
            if line.lower().startswith(LANGUAGE_PREFIX):
                name = line[len(LANGUAGE_PREFIX) :].strip()
                self.language = None if name.lower() in ("", "none") else name
                return
