"""Which plugin distributions this environment has installed, for tests that list them.

The model plugins are always installed (the Makefile does it); the walk-through
plugin (examples/plugin, omni-hello) is installed by the Makefile too, but a
test environment built otherwise may lack it.
"""

from __future__ import annotations

from importlib import metadata

MODELS = {
    "omni-moss-tts": ["moss-tts"],
    "omni-qwen3-omni": ["qwen3-omni", "qwen3-omni-colocated", "qwen3-omni-text"],
    "omni-qwen3-tts": ["qwen3-tts"],
}


def _walkthrough() -> dict[str, list[str]]:
    try:
        metadata.distribution("omni-hello")
    except metadata.PackageNotFoundError:
        return {}
    return {"omni-hello": ["hello"]}


INSTALLED = {**MODELS, **_walkthrough()}
