"""The units Qwen3-ForcedAligner times: a transcript split into words, per language.

The aligner was trained on the release's units (qwen-asr 0.0.6), so omni splits
as the release does wherever it can, and every unit is cleaned the same way:
only letters, digits and ``'`` are kept, and a unit left empty is dropped.

- Languages written with spaces, and Chinese: the space-separated words, with
  every CJK ideograph a unit of its own.
- Japanese (no spaces between words): the words of nagisa, the release's own
  splitter (a small BiLSTM tagger; MIT). It is an optional dependency,
  ``pip install 'omni-qwen3-asr[ja]'`` (wheels for CPython 3.10 to 3.13 on
  Linux); without it, a request for Japanese word timings is refused naming
  that command. The release pins nagisa 0.2.11; 0.3.0 splits the test
  sentences identically (nagisa normalises some characters, e.g. full-width
  digits to ASCII, so a unit may differ from the transcript's spelling, as in
  the release).
- Korean (spaces between eojeol, each a stem with its particles or endings):
  the release cuts each space-separated eojeol once, after its longest prefix
  of two or more characters found in a word list it ships
  (``qwen_asr/inference/assets/korean_dict_jieba.dict``); an eojeol with no
  listed prefix stays whole (soynlp's ``LTokenizer`` with every listed word
  scored 1). omni does not copy that list: it reads it from an installed
  ``qwen-asr`` package when there is one (``pip install --no-deps
  qwen-asr==0.0.6`` brings it without the release's dependencies), and then its
  units are the release's. Without it every eojeol stays whole, which is what
  the release does to an eojeol it finds no listed prefix for, and a real word
  boundary (Korean writes spaces between words): the aligner then times
  ``학교에`` as one unit where the release times ``학교`` and ``에``. The rule is
  ours, a few lines over a set of words, instead of soynlp itself, which is
  GPL-3.0 and imports SciPy and scikit-learn; the reference test checks it
  against soynlp on the release's list.
"""

from __future__ import annotations

import importlib
import importlib.util
import unicodedata
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from types import ModuleType

JAPANESE_EXTRA = "pip install 'omni-qwen3-asr[ja]'"
RELEASE_KOREAN_LIST = ("inference", "assets", "korean_dict_jieba.dict")  # in qwen_asr


class WordSplitterMissing(NotImplementedError):
    """A language's word splitter is not installed here.

    A NotImplementedError, like a language this deployment cannot time at all:
    the align stage answers the request with the message, which names the
    command that installs the splitter.
    """


def _kept(ch: str) -> bool:
    return ch == "'" or unicodedata.category(ch)[0] in "LN"


def clean(token: str) -> str:
    """``token`` with only its letters, digits and apostrophes."""
    return "".join(filter(_kept, token))


def _cleaned(tokens: Iterable[str]) -> list[str]:
    return [word for word in map(clean, tokens) if word]


def _ideograph(ch: str) -> bool:
    code = ord(ch)
    return any(
        low <= code <= high
        for low, high in (
            (0x4E00, 0x9FFF),
            (0x3400, 0x4DBF),
            (0x20000, 0x2A6DF),
            (0x2A700, 0x2B73F),
            (0x2B740, 0x2B81F),
            (0x2B820, 0x2CEAF),
            (0xF900, 0xFAFF),
        )
    )


def split_spaced(text: str) -> list[str]:
    """Space-separated words, cleaned, every CJK ideograph on its own."""
    words: list[str] = []
    for piece in text.split():
        run = ""
        for ch in clean(piece):
            if _ideograph(ch):
                words.extend([run, ch] if run else [ch])
                run = ""
            else:
                run += ch
        if run:
            words.append(run)
    return words


def _nagisa() -> ModuleType:
    try:
        return importlib.import_module("nagisa")
    except ImportError:
        raise WordSplitterMissing(
            "word timings for Japanese need nagisa, the release's Japanese word splitter, "
            f"which is not installed here: {JAPANESE_EXTRA}"
        ) from None


def split_japanese(text: str) -> list[str]:
    """nagisa's words, cleaned (needs the ``ja`` extra)."""
    return _cleaned(_nagisa().tagging(text).words)


@lru_cache(maxsize=1)
def release_korean_list() -> Path | None:
    """The release's Korean word list, in an installed ``qwen_asr`` package (never imported)."""
    try:
        spec = importlib.util.find_spec("qwen_asr")
    except (ImportError, ValueError):
        return None
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = Path(root).joinpath(*RELEASE_KOREAN_LIST)
        if path.is_file():
            return path
    return None


@lru_cache(maxsize=4)
def read_word_list(path: Path) -> frozenset[str]:
    """The first field of each non-blank line (the list's other fields are unused)."""
    with open(path, encoding="utf-8") as lines:
        return frozenset(line.split()[0] for line in lines if line.strip())


def _eojeol_parts(eojeol: str, listed: frozenset[str]) -> tuple[str, str]:
    """``eojeol`` cut after its longest listed prefix (two characters or more), else whole."""
    cut = next((n for n in range(len(eojeol), 1, -1) if eojeol[:n] in listed), len(eojeol))
    return eojeol[:cut], eojeol[cut:]


def split_korean(text: str, word_list: Path | None) -> list[str]:
    """The release's units with its word list, else the eojeol (see the module doc)."""
    if word_list is None:
        return _cleaned(text.split())
    listed = read_word_list(word_list)
    return _cleaned(part for eojeol in text.split() for part in _eojeol_parts(eojeol, listed))


def split_words(text: str, language: str) -> list[str]:
    """The units the aligner times in ``text``, a transcript in ``language`` (a name)."""
    name = language.lower()
    if name == "japanese":
        return split_japanese(text)
    if name == "korean":
        return split_korean(text, release_korean_list())
    return split_spaced(text)
