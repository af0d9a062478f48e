"""Byte sizes as people write them: ``2GiB``, ``512 MiB``, ``80GB``, ``1073741824``."""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: object) -> int:
    """Parse a size into bytes; raise ValueError with the accepted spellings."""
    if isinstance(value, bool):
        raise ValueError("a byte size cannot be a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a byte size cannot be negative, got {value}")
        return value
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match and match.group(2).lower() in _UNITS:
            number = float(match.group(1)) * _UNITS[match.group(2).lower()]
            if number != int(number):
                raise ValueError(f"{value!r} is not a whole number of bytes")
            return int(number)
    raise ValueError(
        f"{value!r} is not a byte size; write an integer or a number with a unit "
        "such as 2GiB, 512MiB or 80GB"
    )


def format_bytes(value: int) -> str:
    """Render bytes the way people read them (binary units)."""
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if value >= size:
            return f"{value / size:.2f}".rstrip("0").rstrip(".") + unit
    return f"{value}B"
