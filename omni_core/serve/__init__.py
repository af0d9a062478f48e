"""The HTTP server: an OpenAI-compatible API over a running :class:`~omni_core.runtime.Runtime`.

Only ``omni serve`` imports it (it needs starlette and uvicorn; audio encoding
needs numpy and, for flac, mp3, opus, aac, speed and sample_rate, PyAV), so its
names load on first access and ``omni plan`` stays light.

Rooms: ``service`` (what every endpoint shares: admitting an API request into
the runtime), ``server`` (uvicorn beside the runtime), ``launch`` (what
``omni serve`` and ``omni run`` share); ``common/`` (HTTP plumbing),
``audio/`` (formats and encoders), ``speech/``, ``chat/``, ``voices/`` (the
API families), ``views/`` (deployment picture and playground).
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "create_app": "common.app",
    "OmniServer": "server",
    "serve_runtime": "server",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
