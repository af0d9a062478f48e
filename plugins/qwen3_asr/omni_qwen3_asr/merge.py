"""A long clip's pieces' answers made one (the release's rules, :mod:`.split` for the cut).

- text: each piece's text, cleaned (:mod:`.repetitions`), joined with nothing
  between them (the model writes its own spaces; a piece of Chinese needs none);
- language: each piece's language in order, blanks dropped and a language
  that repeats the previous one kept once, joined with commas
  (``"Chinese,English"``); no language at all is ``None``;
- words: each piece's words, their times shifted by the piece's offset (in
  seconds, rounded to the millisecond as the aligner's are).
"""

from __future__ import annotations

from typing import Any


def merge_languages(languages: list[str | None]) -> str | None:
    """The pieces' languages as one string (module doc); None when none was heard."""
    kept: list[str] = []
    for name in languages:
        name = (name or "").strip()
        if name and (not kept or kept[-1] != name):
            kept.append(name)
    return ",".join(kept) or None


def shifted(words: list[Any], offset: float) -> list[dict[str, Any]]:
    """Word timings of one piece (``word``, ``start``, ``end`` attributes) on the whole clip."""
    return [
        {"word": w.word, "start": round(w.start + offset, 3), "end": round(w.end + offset, 3)}
        for w in words
    ]
