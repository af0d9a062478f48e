"""Turning a stream of token ids into text deltas, and cutting the text at stop strings.

Byte-level BPE splits characters across tokens (an emoji or a CJK character
is often two or three tokens), so decoding token by token would send broken
characters. :class:`Detokenizer` keeps a short window: it decodes the tokens
since the last safe point, sends only text that no longer ends in a
replacement character, and slides the window so each step decodes a few
tokens, not the whole answer. :class:`StopMatcher` holds back just enough
text to recognise a stop string that arrives split across deltas, and sends
everything before the first stop string, never the string itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

REPLACEMENT = "\ufffd"


class Detokenizer:
    def __init__(self, decode: Callable[[list[int]], str], skip: Iterable[int] = ()):
        self.decode, self.skip = decode, set(skip)
        self.tokens: list[int] = []
        self.prefix = 0  # start of the window decoded for context
        self.read = 0  # tokens whose text has been sent

    def feed(self, token: int) -> str:
        if token in self.skip:
            return ""
        self.tokens.append(token)
        before = self.decode(self.tokens[self.prefix : self.read])
        after = self.decode(self.tokens[self.prefix :])
        if after.endswith(REPLACEMENT) or len(after) <= len(before):
            return ""  # an unfinished character: wait for the next token
        self.prefix = self.read  # the sent tokens just before the new ones stay as context
        self.read = len(self.tokens)
        return after[len(before) :]

    def flush(self) -> str:
        """Whatever is left when the stream ends (even an unfinished character)."""
        before = self.decode(self.tokens[self.prefix : self.read])
        after = self.decode(self.tokens[self.prefix :])
        self.prefix = self.read = len(self.tokens)
        return after[len(before) :]


class StopMatcher:
    def __init__(self, stops: Iterable[str]):
        self.stops = [s for s in stops if s]
        self.keep = max((len(s) for s in self.stops), default=1) - 1
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """The text safe to send now, and whether a stop string was reached."""
        if not self.stops:
            return text, False
        self.pending += text
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.pending = self.pending[: min(hits)], ""
            return out, True
        cut = max(len(self.pending) - self.keep, 0)
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, False

    def flush(self, text: str = "") -> str:
        out, hit = self.feed(text)
        if hit:
            return out
        out, self.pending = out + self.pending, ""
        return out
