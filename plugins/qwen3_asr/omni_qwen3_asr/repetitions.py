"""A transcript's runaway repetitions collapsed, by the release's rule.

A speech model decoding greedily can fall into a loop ("ha ha ha ...",
one character hundreds of times) and stay in it until its token cap. The
release (``qwen_asr``, 0.0.6) cleans every finished transcript before it
returns it; so do we, with the same threshold, so both give the same text:

1. a character repeated more than ``threshold`` (20) times in a row becomes
   one of it;
2. then, scanning from the start, the first place where a pattern of 1 to
   20 characters is repeated at least ``threshold`` times in a row (the
   shortest such pattern at the earliest such place) keeps one copy; the
   scan goes on after the run, on the rest of the text. As in the release,
   a place is only tried while at least twice ``threshold`` characters of
   the text being scanned remain from it, so a run at the very end of a
   text can stay.

Where it applies (decision): to each piece's finished text (the release
cleans per piece, before pieces are joined), so to the final text of a
transcription: the non-streamed response in every format (verbose_json's
segments included), the ``transcript.text.done`` event of a stream and a
realtime session's completed transcript. A stream's
``transcript.text.delta`` events stay raw: they are sent as the model
writes, before anyone can know that a run will reach the threshold, and
holding text back until it could no longer be part of one would delay every
delta by up to 400 characters. So when a run was collapsed, the deltas joined
are longer than the done event's text; the done text is the transcript.
"""

from __future__ import annotations

THRESHOLD = 20  # the release's threshold
MAX_PATTERN = 20  # longest repeated pattern it looks for, in characters


def collapse_repetitions(text: str, threshold: int = THRESHOLD) -> str:
    """``text`` with its character runs and repeated patterns collapsed (module doc)."""
    return _collapse_patterns(_collapse_runs(text, threshold), threshold)


def _collapse_runs(text: str, threshold: int) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        j = i + 1
        while j < len(text) and text[j] == text[i]:
            j += 1
        out.append(text[i] if j - i > threshold else text[i:j])
        i = j
    return "".join(out)


def _collapse_patterns(text: str, threshold: int) -> str:
    out: list[str] = []
    rest = text
    while True:
        found = _first_repeat(rest, threshold)
        if found is None:
            out.append(rest)
            return "".join(out)
        at, size, end = found
        out.append(rest[: at + size])
        rest = rest[end:]


def _first_repeat(text: str, threshold: int) -> tuple[int, int, int] | None:
    """(where, pattern length, end of the run) of the first pattern repeated ``threshold``
    times, or None; only places with ``2 * threshold`` characters after them are tried."""
    n = len(text)
    for at in range(n - 2 * threshold + 1):
        for size in range(1, MAX_PATTERN + 1):
            span = size * threshold
            end = at + span
            if end > n:
                break
            pattern = text[at : at + size]
            if text[at + size : at + 2 * size] != pattern or text[at:end] != pattern * threshold:
                continue
            while text[end : end + size] == pattern:
                end += size
            return at, size, end
    return None
