"""On/off environment switches of the compiled steps, read where a stage builds them.

Why environment variables and not deployment fields: they choose between two
ways of compiling the same steps, with the same results, for someone
measuring start-up against step time (``OMNI_COMPILE_REGIONS``,
``OMNI_COMPILE_FRAMES``); a deployment file need not know them.
"""

from __future__ import annotations

import os

_ON = ("1", "true", "on")
_OFF = ("0", "false", "off")


def switch_on(name: str, meaning: str) -> bool:
    """Whether switch ``name`` is on (unset: on); a clear error for any other value.

    ``meaning``: what 1 does, for the error (``"regions, the default"``).
    """
    value = os.environ.get(name, "1").strip().lower()
    if value not in _ON + _OFF:
        raise ValueError(f"{name}={value!r}: expected 1 ({meaning}) or 0")
    return value in _ON
