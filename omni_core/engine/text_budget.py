"""A stage's budget of tokens for the text fields of one request.

Why in the stage and not the API: only the model's tokenizer knows how a
text splits (a rare script can take several tokens a character), while the
API's character limits (``server.max_input_chars``) cost nothing and catch
the bulk first. Stages call this from a worker thread: tokenizing megabytes
on the event loop would silence the heartbeat that proves the process alive.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..errors import RequestError

# Beyond this many characters a token a text is refused without tokenizing it: no
# speech or chat text averages that much (long tokens are runs of spaces or symbols),
# and a tokenizer's time grows with the text even in a thread.
CHARS_PER_TOKEN_BOUND = 64


def check_text_tokens(
    encode: Callable[[str], list[int]],
    data: Mapping[str, Any],
    fields: Iterable[str],
    limit: int,
    setting: str,
) -> None:
    """Refuse (400) a text field of ``data`` that tokenizes to more than ``limit`` tokens.

    ``setting`` names where the limit is configured, for the message.
    """
    for name in fields:
        text = data.get(name)
        if not isinstance(text, str) or not text:
            continue
        if len(text) > CHARS_PER_TOKEN_BOUND * limit:
            size = f"is {len(text)} characters, more than {limit} tokens can hold"
        else:
            tokens = len(encode(text))
            if tokens <= limit:
                continue
            size = f"takes {tokens} tokens"
        raise RequestError(
            f"{name!r} {size}; this server takes at most {limit} tokens ({setting})",
            hint="split the text into several requests",
        )
