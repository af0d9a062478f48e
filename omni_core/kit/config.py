"""Reading a release's JSON config into our frozen dataclasses (torch-free).

Releases add keys we do not read (``model_type``, training settings) and
write ``null`` where they mean "the default"; every family's config parser
picked the keys that name its fields the same way. :func:`known_fields` does
it once, and :class:`FromDict` gives a flat config its ``from_dict``.
:func:`rope_theta` and :func:`rope_type` read rotary settings under both
spellings transformers has used (top-level keys, or ``rope_parameters`` /
``rope_scaling``). :class:`ChatTokenIds` and :class:`TTSTextIds` are the
Qwen tokenizer's special ids that every family built on it (Qwen3-TTS,
Qwen3-Omni's talker, MOSS-TTS) reads from its root ``config.json``, with
their defaults written once; :func:`token_ids` reads them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any


def known_fields(
    cls: type,
    raw: Mapping[str, Any],
    aliases: Mapping[str, str] | None = None,
    *,
    exclude: Collection[str] = (),
) -> dict[str, Any]:
    """The non-null keys of ``raw`` that name fields of dataclass ``cls``.

    ``aliases`` maps another spelling a release uses to the field's name
    (the field's own spelling wins when both are there); ``exclude`` leaves
    out fields the caller builds itself (a nested section).
    """
    names = {f.name for f in dataclasses.fields(cls)} - set(exclude)
    out = {k: v for k, v in raw.items() if k in names and v is not None}
    for alias, name in (aliases or {}).items():
        if name not in out and raw.get(alias) is not None:
            out[name] = raw[alias]
    return out


class FromDict:
    """``from_dict`` for a flat dataclass config: its known non-null keys, defaults elsewhere."""

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Any:
        return cls(**known_fields(cls, raw))


@dataclass(frozen=True, kw_only=True)
class ChatTokenIds:
    """``<|im_start|>`` / ``<|im_end|>``: the ChatML turn markers of Qwen's tokenizer.

    Keyword-only with the release's defaults, so a family's config inherits
    them after its own positional fields.
    """

    im_start_token_id: int = 151644
    im_end_token_id: int = 151645


@dataclass(frozen=True, kw_only=True)
class TTSTextIds(ChatTokenIds):
    """The text-side ids a Qwen talker's prompt is built from (``<tts_pad>``,
    ``<tts_text_bos>``, ``<tts_text_eod>``), besides the ChatML markers."""

    tts_pad_token_id: int = 151671
    tts_bos_token_id: int = 151672
    tts_eos_token_id: int = 151673


def token_ids(ids: type, raw: Mapping[str, Any]) -> dict[str, int]:
    """The non-null ids of dataclass ``ids`` that ``raw`` sets, as ints (nulls keep defaults)."""
    return {name: int(value) for name, value in known_fields(ids, raw).items()}


def rope_theta(raw: Mapping[str, Any], default: float) -> float:
    """``rope_theta`` (transformers 4) or ``rope_parameters.rope_theta`` (5), else ``default``."""
    for source in (raw, raw.get("rope_parameters") or {}, raw.get("rope_scaling") or {}):
        if source.get("rope_theta") is not None:
            return float(source["rope_theta"])
    return float(default)


def rope_type(raw: Mapping[str, Any]) -> str:
    """The rotary variant (``default``, ``mrope``, ...) under either spelling."""
    for key in ("rope_scaling", "rope_parameters"):
        section = raw.get(key) or {}
        kind = section.get("rope_type", section.get("type"))
        if kind:
            return str(kind)
    return "default"
