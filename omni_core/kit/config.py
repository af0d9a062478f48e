"""Reading a release's JSON config into our frozen dataclasses (torch-free).

Releases add keys we do not read (``model_type``, training settings) and
write ``null`` where they mean "the default"; every family's config parser
picked the keys that name its fields the same way. :func:`known_fields` does
it once, and :class:`FromDict` gives a flat config its ``from_dict``.
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
