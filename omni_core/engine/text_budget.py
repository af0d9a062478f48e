"""A stage's budget of tokens for the text fields of one request.

Why in the stage and not the API: only the model's tokenizer knows how a
text splits (a rare script can take several tokens a character), while the
API's character limits (``server.max_input_chars``) cost nothing and catch
the bulk first.

Why in slices: a worker thread is not enough. The Rust tokenizers hold the
GIL for a whole ``encode`` (5 s for 6 MB here), and while they hold it the
event loop's heartbeat cannot run, so the process looks hung and is killed.
A long text is counted a slice at a time (the GIL is free between slices)
and the count stops as soon as it passes the limit: a text over budget
costs at most the budget's worth of tokenizing, never the whole text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from ..errors import RequestError

# Beyond this many characters a token a text is refused without tokenizing it: no
# speech or chat text averages that much (long tokens are runs of spaces or symbols).
CHARS_PER_TOKEN_BOUND = 64
# Characters tokenized at once: a few milliseconds of holding the GIL.
SLICE_CHARS = 8192
_SPACE = re.compile(r"\s")


def check_text_tokens(
    encode: Callable[[str], list[int]],
    data: Mapping[str, Any],
    fields: Iterable[str],
    limit: int,
    setting: str,
) -> None:
    """Refuse (400) a text field of ``data`` that tokenizes to more than ``limit`` tokens.

    ``setting`` names where the limit is configured, for the message. A
    text longer than one slice is counted slice by slice, cut before a
    white-space character; the sum can differ from the whole text's count
    by a token or so per cut, which a budget can afford.
    """
    for name in fields:
        text = data.get(name)
        if not isinstance(text, str) or not text:
            continue
        if len(text) > CHARS_PER_TOKEN_BOUND * limit:
            size = f"is {len(text)} characters: more than {limit}"
        else:
            tokens = count_tokens(encode, text, stop_above=limit)
            if tokens <= limit:
                continue
            # one slice is counted exactly; a longer text's count stopped past the limit
            size = f"takes {tokens}" if len(text) <= SLICE_CHARS else f"takes over {limit}"
        raise RequestError(
            f"{name!r} {size} tokens; this server takes at most {limit} ({setting})",
            hint="split the text into several requests",
        )


def count_tokens(encode: Callable[[str], list[int]], text: str, stop_above: int) -> int:
    """The tokens of ``text``, counted a slice at a time; stops once past ``stop_above``."""
    total = 0
    for piece in slices(text, SLICE_CHARS):
        total += len(encode(piece))
        if total > stop_above:
            break
    return total


def slices(text: str, size: int) -> Iterator[str]:
    """``text`` in pieces of about ``size`` characters, each cut before a white-space
    character where one is near (so that words stay whole), else at ``size``."""
    start = 0
    while start < len(text):
        end = start + size
        if end < len(text):
            window = text[start + size // 2 : end]
            spaces = [m.start() for m in _SPACE.finditer(window)]
            if spaces:
                end = start + size // 2 + spaces[-1]
        yield text[start:end]
        start = end
