"""The languages Qwen3-ASR names, and a request's ``language`` as the model spells it.

The model writes (and, when forced, reads) ``language English<asr_text>``:
an English name, capitalised. OpenAI's clients send ISO-639-1 codes (``en``)
and some send names; both are accepted. The list is the release's
(``qwen_asr.inference.utils``); a checkpoint's ``support_languages`` replaces it.
"""

from __future__ import annotations

from collections.abc import Sequence

RELEASE_LANGUAGES = (
    "Chinese", "English", "Cantonese", "Arabic", "German", "French", "Spanish", "Portuguese",
    "Indonesian", "Italian", "Korean", "Russian", "Thai", "Vietnamese", "Japanese", "Turkish",
    "Hindi", "Malay", "Dutch", "Swedish", "Danish", "Finnish", "Polish", "Czech", "Filipino",
    "Persian", "Greek", "Romanian", "Hungarian", "Macedonian",
)  # fmt: skip
ISO_639_1 = {
    "zh": "Chinese", "en": "English", "yue": "Cantonese", "ar": "Arabic", "de": "German",
    "fr": "French", "es": "Spanish", "pt": "Portuguese", "id": "Indonesian", "it": "Italian",
    "ko": "Korean", "ru": "Russian", "th": "Thai", "vi": "Vietnamese", "ja": "Japanese",
    "tr": "Turkish", "hi": "Hindi", "ms": "Malay", "nl": "Dutch", "sv": "Swedish",
    "da": "Danish", "fi": "Finnish", "pl": "Polish", "cs": "Czech", "fil": "Filipino",
    "tl": "Filipino", "fa": "Persian", "el": "Greek", "ro": "Romanian", "hu": "Hungarian",
    "mk": "Macedonian",
}  # fmt: skip


def canonical(language: str, known: Sequence[str] = ()) -> str:
    """``language`` (a code or a name, any case) as the model writes it; ValueError if unknown."""
    listed = tuple(known) or RELEASE_LANGUAGES
    text = language.strip()
    name = ISO_639_1.get(text.lower(), text[:1].upper() + text[1:].lower())
    by_lower = {n.lower(): n for n in listed}
    if name.lower() not in by_lower:
        raise ValueError(
            f"language {language!r} is not one this model transcribes; give an ISO-639-1 code "
            f"or a name of: {', '.join(listed)}"
        )
    return by_lower[name.lower()]
