"""Which plugin distributions the tests expect: the ones this repository ships.

The model plugins are always installed (the Makefile does it); the walk-through
plugin (examples/plugin, omni-hello) is installed by the Makefile too, but a
test environment built otherwise may lack it.

The suite runs against the shipped plugins only: a developer's own plugins,
installed in the same environment (``pip install -e`` of one written from
CONTRIBUTING.md), must not fail it. Tests that list every installed plugin
compare through :func:`shipped_only`, which drops the rows of ``OTHERS``;
tests about something else restrict discovery itself with ``OMNI_PLUGINS``
set to :data:`ONLY_SHIPPED` (the documented way to choose which plugins load).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib import metadata
from typing import TypeVar

from omni_core.hookspecs import ENTRY_POINT_GROUP

MODELS = {
    "omni-moss-tts": ["moss-tts"],
    "omni-qwen3-asr": ["qwen3-asr"],
    "omni-qwen3-omni": ["qwen3-omni", "qwen3-omni-colocated", "qwen3-omni-text"],
    "omni-qwen3-tts": ["qwen3-tts"],
}
WALKTHROUGH = {"omni-hello": ["hello"]}
SHIPPED = {**MODELS, **WALKTHROUGH}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed_distributions() -> set[str]:
    """The distributions with an ``omni`` entry point in this environment, normalised."""
    return {
        _normalise(ep.dist.name if ep.dist else ep.name)
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)
    }


_FOUND = _installed_distributions()
# The shipped plugins installed here, and their pipelines (the models always).
INSTALLED = {**MODELS, **(WALKTHROUGH if "omni-hello" in _FOUND else {})}
# Plugins installed here that this repository does not ship (a developer's own).
OTHERS = _FOUND - set(SHIPPED)
# OMNI_PLUGINS's value that loads the shipped plugins only.
ONLY_SHIPPED = ",".join(sorted(INSTALLED))

V = TypeVar("V")


def shipped_only(by_plugin: Mapping[str, V]) -> dict[str, V]:
    """``by_plugin`` (listing rows or columns, by plugin name) without the ``OTHERS``.

    A plugin is listed under its distribution's name, or ``dist:entry-point``
    when a distribution has several entry points.
    """
    return {
        name: value
        for name, value in by_plugin.items()
        if _normalise(name.split(":")[0]) not in OTHERS
    }
