"""Robustness clean-up of the text MOSS-TTS is asked to speak.

MOSS-TTS was trained on text that went through a fixed clean-up before the prompt
was built, so the text we tokenise must go through the same one: this module
reproduces that clean-up character for character (an opt-in test compares it with
the official implementation, ``tests/test_normalize_reference.py``).

It is not semantic text normalisation. Numbers, dates, units and abbreviations are
left as written; what changes is the noise that makes a speech model stumble:

1. control and zero-width characters are dropped;
2. light Markdown (links, headings, quotes, list markers) is flattened and the lines
   are joined into one string with ``。`` between them;
3. tokens that later steps would damage -- URLs, e-mail addresses, @mentions, r/ and
   u/ names, #hashtags, dot-files, file names and versions -- are set aside;
4. whitespace is tidied by script: none inside Chinese/Japanese, single spaces in
   Latin text, one space between a Chinese/Japanese character and a Latin word;
5. structural marks (bracketed headlines, stand-alone titles, arrows, long dashes)
   become clause or sentence boundaries;
6. runs of repeated punctuation collapse to one mark;
7. whitespace is tidied again and the set-aside tokens are put back.

Square and curly brackets are never touched, so speaker tags (``[S1]``), sound
events (``{whisper}``) and pause markers (``[pause 3.2s]``) pass through unchanged.
"""

# Full-width (Chinese) punctuation is what this module is about, not a look-alike typo:
# ruff: noqa: RUF001, RUF002

from __future__ import annotations

import re
import unicodedata

__all__ = ["normalize_text"]

# Scripts written without spaces between words: CJK ideographs (extension A and the
# unified block) and the hiragana/katakana blocks. Hangul is not among them.
_SPACELESS_RANGES = "\u3400-\u4dbf\u4e00-\u9fff\u3040-\u30ff"
_SPACELESS = f"[{_SPACELESS_RANGES}]"

# Characters that may occur inside a file name, path, version or similar token
# (underscore included).
_TOKEN_CHARS = "A-Za-z0-9._/+:-"

# A set-aside token is replaced by a slot marker while the text is cleaned. The
# marker's shape is part of the behaviour: the spacing rules see it as a Latin word
# (so Chinese next to it gets a space), and its underscores, letters and digits are
# token characters, so a later token pattern may take a marker into its own match
# (``node_modules/.bin/tsc``). Such a nested marker is never filled in again and
# shows in the output; the official normaliser does the same, so we keep it.
_SLOT = "___PROT{}___"
_ANY_SLOT = r"___PROT\d+___"

# A "Latin-ish" word for the spacing rules: a slot marker, or a run of token
# characters that starts with a letter or digit and contains at least one letter.
_LATIN_WORD = rf"(?:{_ANY_SLOT}|(?=[{_TOKEN_CHARS}]*[A-Za-z])[A-Za-z0-9][{_TOKEN_CHARS}]*)"


def normalize_text(text: str) -> str:
    """Clean ``text`` the way MOSS-TTS's training text was cleaned (see the module doc)."""
    text = _drop_invisible(text)
    text = _flatten_markdown(text)
    shelf = _TokenShelf()
    text = shelf.put_away(text)
    text = _tidy_spaces(text)
    text = _structure_to_boundaries(text)
    text = _collapse_repeated_punctuation(text)
    text = _tidy_spaces(text)
    return shelf.bring_back(text).strip()


# --------------------------------------------------------------------------- step 1


def _drop_invisible(text: str) -> str:
    """Unify line breaks and drop control, format and other invisible characters.

    A model has no sound for a zero-width joiner or a stray control byte, and they
    split words that the tokenizer would otherwise see whole. Every character of a
    Unicode "C" category goes (controls, zero-width and other format characters,
    private use, unassigned) except newline, tab and space; CR and CRLF become
    newlines first, and the ideographic space becomes an ASCII space.
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\u3000", " ")
    return "".join(
        ch for ch in text if ch in "\n\t " or not unicodedata.category(ch).startswith("C")
    )


# --------------------------------------------------------------------------- step 2

_MD_LINK = re.compile(r"\[([^\[\]]+)\]\((https?://[^)\s]+)\)")

_LINE_MARKERS = re.compile(
    r"""
    ^
    (?:\#{1,6}\s+)?     # heading
    (?:>\s+)?           # block quote
    (?:[-*+]\s+)?       # bullet
    (?:\d+[.)]\s+)?     # numbered item
    """,
    re.VERBOSE,
)


def _flatten_markdown(text: str) -> str:
    """Turn Markdown structure into plain sentences.

    A link ``[label](http...)`` is read as its label followed by its address; a
    line's leading heading hashes, quote mark, bullet and item number (each at most
    once, in that order) are not read at all. Blank lines vanish and the remaining
    lines, trimmed, are joined with ``。`` so that every line break is a pause.
    """
    text = _MD_LINK.sub(r"\1 \2", text)
    lines = (line.strip() for line in text.splitlines())
    return "。".join(_LINE_MARKERS.sub("", line, count=1) for line in lines if line)


# --------------------------------------------------------------------------- step 3

# Tokens to set aside, in the order they are looked for; a later pattern sees the
# slot markers of earlier ones, never their text.
_FRAGILE_TOKENS = (
    # web address, up to whitespace or Chinese punctuation
    re.compile(r"https?://[^\s，。！？；、）】》〉」』]+"),
    # e-mail address
    re.compile(r"(?<![\w.+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}(?![\w.-])"),
    # @mention
    re.compile(r"(?<![A-Za-z0-9_])@[A-Za-z0-9_]{1,32}"),
    # Reddit user or subreddit
    re.compile(r"(?<![A-Za-z0-9_])[ur]/[A-Za-z0-9_]+"),
    # #hashtag, up to whitespace or the next '#'
    re.compile(r"(?<![A-Za-z0-9_])#[^\s#]+"),
    # dot-file or extension: .env, .map, .gitignore
    re.compile(r"(?<![A-Za-z0-9_])\.[._-]*[A-Za-z0-9][A-Za-z0-9._-]*"),
    # file name, path or version: app.js.map, v2.3.1, src/main.py
    re.compile(
        rf"""
        (?<![A-Za-z0-9_])
        (?=[{_TOKEN_CHARS}]*[A-Za-z])     # the run holds a letter
        (?=[{_TOKEN_CHARS}]*[._/+:-])     # and a separator
        [A-Za-z0-9]
        (?:[{_TOKEN_CHARS}]*[A-Za-z0-9])?  # first and last characters alphanumeric
        (?![A-Za-z0-9_])
        """,
        re.VERBOSE,
    ),
)


class _TokenShelf:
    """Tokens taken out of the text while it is cleaned, and put back afterwards.

    URLs, addresses, file names and versions are full of dots, slashes, hyphens and
    ``#`` that the punctuation and spacing rules would otherwise rewrite
    (``app.js.map``, ``v2.3.1``, ``a--b.txt``). Each one is replaced by a numbered
    slot marker; markers are filled in again in numbering order.
    """

    def __init__(self) -> None:
        self._tokens: list[str] = []

    def _stash(self, match: re.Match[str]) -> str:
        self._tokens.append(match.group(0))
        return _SLOT.format(len(self._tokens) - 1)

    def put_away(self, text: str) -> str:
        """Replace every fragile token with its slot marker."""
        for pattern in _FRAGILE_TOKENS:
            text = pattern.sub(self._stash, text)
        return text

    def bring_back(self, text: str) -> str:
        """Put the tokens back where their markers are."""
        for index, token in enumerate(self._tokens):
            text = text.replace(_SLOT.format(index), token)
        return text


# --------------------------------------------------------------------------- step 4

_SPACE_RULES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), replacement)
    for pattern, replacement in (
        # tabs and runs of spaces: one space
        (r"[ \t]+", " "),
        # Chinese/Japanese is written without spaces, also before a number ...
        (rf"({_SPACELESS})\s+(?=[{_SPACELESS_RANGES}]|\d)", r"\1"),
        # ... and after one
        (rf"(\d)\s+(?={_SPACELESS})", r"\1"),
        # but a Latin word next to Chinese/Japanese is set off by one space
        (rf"({_SPACELESS})(?={_LATIN_WORD})", r"\1 "),
        (rf"({_LATIN_WORD})(?={_SPACELESS})", r"\1 "),
        (r" {2,}", " "),
        # no space inside Chinese punctuation: before a closing or pausing mark ...
        (r"\s+(?=[，。！？；：、”’」』】）》])", ""),
        # ... after an opening one ...
        (r"(?<=[（【「『《“‘])\s+", ""),
        # ... or after a pausing one
        (r"(?<=[，。！？；：、])\s+", ""),
        # nor before ASCII punctuation
        (r"\s+(?=[,.;!?])", ""),
        (r" {2,}", " "),
    )
)


def _tidy_spaces(text: str) -> str:
    """Space the text the way its scripts are written.

    Chinese and Japanese have no spaces between words, so stray ones (from copying,
    from line joins) are dropped, also next to numbers; Latin text keeps single
    spaces; a Latin word or set-aside token inside Chinese gets one space on each
    side so that it is read as a unit. Punctuation never has a space before it, and
    Chinese punctuation none after it either.
    """
    for pattern, replacement in _SPACE_RULES:
        text = pattern.sub(replacement, text)
    return text.strip()


# --------------------------------------------------------------------------- step 5

# where a sentence may start: the beginning, or after a sentence-ending mark
_SENTENCE_START = r"(^|[。！？!?；;]\s*)"

_BRACKETED_HEADLINE = re.compile(rf"{_SENTENCE_START}[【〖『「]([^】〗』」]+)[】〗』」]\s*")

_STANDALONE_TITLE = re.compile(
    rf"""
    {_SENTENCE_START}《([^》]+)》
    (?=\s*(?:{_ANY_SLOT}|[—–―-]{{2,}}|$|[。！？!?；;，,]))   # nothing else follows
    """,
    re.VERBOSE,
)

_ARROW = re.compile(r"\s*(?:<[-=]+>|[-=]+>|<[-=]+|[→←↔⇒⇐⇔⟶⟵⟷⟹⟸⟺↦↤↪↩])\s*")

_DASH_RUN = re.compile(r"\s*[—–―-]{2,}\s*")


def _structure_to_boundaries(text: str) -> str:
    """Replace structural marks with the pause they stand for, instead of reading them.

    - A headline in 【】〖〗『』「」 at the start of a sentence loses its brackets and
      ends in ``。`` (two passes, so that two headlines in a row both go).
    - A 《》 title that stands on its own (nothing but a boundary follows) loses its
      brackets; a title inside a sentence (``我喜欢《哈姆雷特》这本书``) keeps them.
    - Arrows (``->``, ``=>``, ``<-``, ``<=>``, ``→``, ...) become ``，``: a flow
      ``A -> B -> C`` is read as a list.
    - Runs of two or more dashes (``——``, ``--``) become ``。``.
    """
    for _ in range(2):
        text = _BRACKETED_HEADLINE.sub(r"\1\2。", text)
    text = _STANDALONE_TITLE.sub(r"\1\2", text)
    text = _ARROW.sub("，", text)
    return _DASH_RUN.sub("。", text)


# --------------------------------------------------------------------------- step 6

_ELLIPSIS = re.compile(r"\.{3,}|…{2,}")
_STOP_RUN = re.compile(r"[。．]{2,}")
_COMMA_RUN = re.compile(r"[，,]{2,}")
_QUESTION_EXCLAMATION_RUN = re.compile(r"[!?！？]{2,}")


def _question_exclamation(match: re.Match[str]) -> str:
    run = match.group(0)
    question = any(ch in "?？" for ch in run)
    exclamation = any(ch in "!！" for ch in run)
    if question and exclamation:
        return "？！"
    return "？" if question else "！"


def _collapse_repeated_punctuation(text: str) -> str:
    """Collapse emphatic runs of punctuation to a single (full-width) mark.

    Social-media text repeats marks for emphasis (``？？？！！！``, ``......``), which
    reads as noise. An ellipsis of three or more dots or two or more ``…`` becomes
    ``。``; a run of full stops becomes one ``。``, of commas one ``，``; a run of
    ``?``/``!`` becomes ``？``, ``！`` or, when it mixes both, ``？！``. Single marks
    are left as written.
    """
    text = _ELLIPSIS.sub("。", text)
    text = _STOP_RUN.sub("。", text)
    text = _COMMA_RUN.sub("，", text)
    return _QUESTION_EXCLAMATION_RUN.sub(_question_exclamation, text)
