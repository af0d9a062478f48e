"""Reading a release's JSON config into our frozen dataclasses (torch-free).

Releases add keys we do not read (``model_type``, training settings) and
write ``null`` where they mean "the default"; every family's config parser
picked the keys that name its fields the same way. :func:`known_fields` does
it once, and :class:`FromDict` gives a flat config its ``from_dict``.
:func:`rope_theta` and :func:`rope_type` read rotary settings under both
spellings transformers has used (top-level keys, or ``rope_parameters`` /
``rope_scaling``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
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
