"""Cutting text that arrives in pieces into sentences (or clauses) as soon as they are complete.

Why: a streaming speech session speaks an LLM's answer while it is being
written, one request per sentence. A sentence may be sent to the model only
once it is *certainly* complete: ``3.`` may become ``3.14``, ``Mr.`` is
followed by a name, and ``"Hi."`` may still get its closing quote. So every
boundary is decided from the text alone, and a decision that needs a
character not yet received waits for it; the segments therefore do not
depend on how the text was cut into pieces (the tests feed the same text in
random piece sizes and expect the same segments).

The rules, in order of the text:

- A line break ends a segment.
- ``。！？；…`` (and the half-width ``｡``) end a sentence; in clause mode
  ``，、：`` end a clause too. Closing quotes and brackets that follow are kept
  with it.
- ``.!?;`` (and in clause mode ``,:``) end one only when whitespace follows
  them and any closing quotes or brackets after them: ``3.14``, ``20:00``,
  ``1,000``, ``example.com/a.b`` and ``a@b.org`` stay whole.
- After a ``.``: titles and Latin abbreviations (``Mr.``, ``Dr.``, ``e.g.``,
  ``i.e.``, ``vs.`` …), initialisms (``U.S.``, ``a.m.``), single initials
  (``J. K. Rowling``) and a list number alone (``1. First``) never end a
  sentence; ``etc.`` (and ``Inc.``, ``Ltd.`` …) ends one only before a
  capital; nor does a ``.`` followed by a lower-case word (an abbreviation we
  do not know).
- An ellipsis (``...``, ``…``), or a ``!``/``?`` inside closing quotes,
  followed by a lower-case word continues the sentence (``"Why?" she asked``).
- A segment longer than ``max_chars`` is cut at its last clause mark, else
  its last space, else (text without spaces, such as Chinese without
  punctuation) at ``max_chars``.

Whitespace runs are collapsed to one character as text arrives (a line
break if the run holds one), which also keeps the buffer small: what waits
is at most about ``max_chars`` characters. Segments with nothing to say (no
letter or digit: ``"..."``, ``"**"``) are dropped.
"""

# Full-width (Chinese) punctuation is what this module is about, not a look-alike typo:
# ruff: noqa: RUF001, RUF002

from __future__ import annotations

from typing import Literal

Mode = Literal["sentence", "clause"]
MAX_CHARS = 300

CJK_ENDS = frozenset("。！？；｡…")
ASCII_ENDS = frozenset(".!?;")
CJK_CLAUSES = frozenset("，、：")
ASCII_CLAUSES = frozenset(",:")
CLOSERS = frozenset("\"')]}’”」』）】》〉")
MAX_RUN = 8  # terminators or closers in a row considered; more are text (bounds the wait)

TITLES = "mr mrs ms mx dr prof sr jr st mt rev gen col lt sgt capt gov sen rep hon"
NEVER_ENDS = frozenset(f"{TITLES} vs v cf e.g i.e viz al approx ca".split())
# abbreviations when a number follows: "No. 5", "p. 12", "Jan. 3"
MONTHS = "jan feb mar apr jun jul aug sep sept oct nov dec"
NUMBER_ENDS = frozenset(f"no nos vol pp p ch sec art fig figs eq {MONTHS}".split())
CAPITAL_ENDS = frozenset("etc inc ltd co corp bros".split())  # noqa: SIM905 (end before a capital)

# Whether a decision at one position is made yet.
YES, NO, WAIT = "yes", "no", "wait"


class Segmenter:
    """Feed text pieces with :meth:`feed`; :meth:`flush` at the end of the input.

    Both return the segments that became complete, stripped, in order.
    """

    def __init__(self, mode: Mode = "sentence", max_chars: int = MAX_CHARS):
        if mode not in ("sentence", "clause"):
            raise ValueError(f"mode must be 'sentence' or 'clause', got {mode!r}")
        if max_chars < 16:
            raise ValueError(f"max_chars must be >= 16, got {max_chars}")
        self.mode, self.max_chars = mode, max_chars
        self.ends = CJK_ENDS | ASCII_ENDS
        self.clauses = (CJK_CLAUSES | ASCII_CLAUSES) if mode == "clause" else frozenset()
        self._buffer = ""

    @property
    def pending(self) -> str:
        """What was fed and is not yet part of a segment."""
        return self._buffer

    def feed(self, text: str) -> list[str]:
        self._append(text)
        return self._cut(final=False)

    def flush(self) -> list[str]:
        """The rest of the text as the last segment(s); the segmenter is empty afterwards."""
        segments = self._cut(final=True)
        self._buffer = ""
        return segments

    # -- input ------------------------------------------------------------------------

    def _append(self, text: str) -> None:
        """Add ``text`` with whitespace runs collapsed, across pieces too."""
        out: list[str] = []
        last = self._buffer[-1] if self._buffer else "\n"  # leading whitespace is dropped
        for char in text:
            if char.isspace():
                mark = "\n" if char in "\n\r\u2028\u2029" else " "
                if last.isspace():
                    if mark == "\n" and last == " ":  # upgrade the run to a line break
                        if out:
                            out[-1] = "\n"
                        else:
                            self._buffer = self._buffer[:-1] + "\n"
                        last = "\n"
                    continue
                char = mark
            out.append(char)
            last = char
        self._buffer += "".join(out)

    # -- cutting ----------------------------------------------------------------------

    def _cut(self, final: bool) -> list[str]:
        segments: list[str] = []
        while self._buffer:
            cut = self._next_cut(self._buffer, final)
            if cut is None:
                break
            segment, self._buffer = self._buffer[:cut].strip(), self._buffer[cut:].lstrip()
            if any(char.isalnum() for char in segment):
                segments.append(segment)
        return segments

    def _next_cut(self, text: str, final: bool) -> int | None:
        """Where the first segment of ``text`` ends, or None while that is not yet certain."""
        limit = self.max_chars
        index = 0
        while index < len(text) and index < limit:
            char = text[index]
            if char == "\n":
                return index + 1
            if char in self.ends or char in self.clauses:
                verdict, end = self._boundary(text, index, final)
                if verdict == WAIT:
                    return None
                if verdict == YES:
                    if end <= limit:
                        return end
                    break  # the closers run past the limit: cut for length
                index = end
                continue
            index += 1
        if len(text) <= limit:
            return len(text) if final else None
        return self._length_cut(text)

    def _length_cut(self, text: str) -> int:
        """A cut in a segment over ``max_chars``: last clause mark, else last space, else hard."""
        window = text[: self.max_chars + 1]
        for index in range(self.max_chars - 1, 0, -1):
            char = window[index]
            if char in CJK_CLAUSES or (char in ASCII_CLAUSES and window[index + 1] == " "):
                return index + 1
        space = window.rfind(" ", 1)
        return space if space > 0 else self.max_chars

    def _boundary(self, text: str, index: int, final: bool) -> tuple[str, int]:
        """Does the punctuation at ``index`` end a segment? (verdict, index past it and closers).

        For a NO the index is where scanning resumes (past the punctuation run).
        """
        run_end = index
        while run_end < len(text) and run_end - index < MAX_RUN and self._is_mark(text[run_end]):
            run_end += 1
        run = text[index:run_end]
        end = run_end
        while end < len(text) and end - run_end < MAX_RUN and text[end] in CLOSERS:
            end += 1
        if end == len(text):
            return (YES, end) if final else (WAIT, end)
        last = run[-1]
        ellipsis = last == "…" or run.endswith("...")
        if last in CJK_ENDS or last in CJK_CLAUSES:
            if ellipsis:  # "…and so on" continues
                return self._unless_lower(text, end, end, final)
            return YES, end
        if text[end] != " ":  # "3.14", "20:00", "a.b", "Wait...what", a 9th closer
            if index and _is_cjk(text[index - 1]) and _is_cjk(text[end]):
                return YES, end  # ASCII punctuation in Chinese text: "你好!我"
            return NO, run_end
        if last in ASCII_CLAUSES or last == ";":
            return YES, end
        if ellipsis:
            return self._unless_lower(text, end, end, final)
        if last in "!?":
            if end > run_end:  # '"Why?" she asked' continues
                return self._unless_lower(text, end, end, final)
            return YES, end
        return self._after_period(text, index, end, final)

    def _is_mark(self, char: str) -> bool:
        return char in self.ends or char in self.clauses

    def _after_period(self, text: str, index: int, end: int, final: bool) -> tuple[str, int]:
        """A single ``.`` followed by whitespace: an abbreviation, an initial, or an end."""
        word = _word_before(text, index)
        bare = word.lower()
        if bare in NEVER_ENDS:
            return NO, index + 1
        if text[:index].strip().isdigit() and len(word) <= 3:
            return NO, index + 1  # "1. First item": a list number is not a sentence
        after = end + 1
        if after >= len(text):
            return (YES, end) if final else (WAIT, end)
        if bare in NUMBER_ENDS and text[after].isdigit():
            return NO, index + 1
        if _is_initialism(word):  # U.S. never ends a sentence; a.m. or p.m. before a capital
            if word.islower() and _starts_sentence(text[after]):
                return YES, end
            return NO, index + 1
        if bare in CAPITAL_ENDS:
            return (YES, end) if _starts_sentence(text[after]) else (NO, index + 1)
        return (NO, index + 1) if text[after].islower() else (YES, end)

    def _unless_lower(self, text: str, end: int, resume: int, final: bool) -> tuple[str, int]:
        """A boundary at ``end`` unless the next word starts lower-case (then resume scanning)."""
        after = end + 1 if end < len(text) and text[end] == " " else end
        if after >= len(text):
            return (YES, end) if final else (WAIT, end)
        return (NO, resume) if text[after].islower() else (YES, end)


def _word_before(text: str, index: int) -> str:
    """The word that ends at ``index`` (the dot), without opening quotes or brackets."""
    start = index
    while start > 0 and not text[start - 1].isspace():
        start -= 1
    return text[start:index].lstrip("\"'([{‘“「『（【《〈")


def _is_initialism(word: str) -> bool:
    """``J``, ``U.S`` or ``a.m`` (the dot at the end already cut off); not the pronoun ``I``."""
    parts = word.split(".")
    return all(len(part) == 1 and part.isalpha() for part in parts) and (
        len(parts) > 1 or (word.isupper() and word != "I")
    )


def _starts_sentence(char: str) -> bool:
    return char.isupper() or char.isdigit() or char in "\"'“‘(「『" or _is_cjk(char)


def _is_cjk(char: str) -> bool:
    """Kana, CJK ideographs or Hangul: scripts written without spaces between words."""
    return (
        "\u3040" <= char <= "\u30ff" or "\u3400" <= char <= "\u9fff" or "\uac00" <= char <= "\ud7af"
    )
