"""The runtime: launch a plan, run stages, move payloads between them.

Only ``omni serve`` / ``omni run`` and the child processes use it; its names
load on first access so that ``omni plugins list`` (which lists the built-in
transports from :mod:`omni_core.runtime.transports`) stays fast.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "FunctionStage": "stage_api",
    "Stage": "stage_api",
    "StageRequest": "stage_api",
    "Overloaded": "coordinator",
    "RequestFailed": "coordinator",
    "RequestHandle": "coordinator",
    "Unavailable": "coordinator",
    "Runtime": "runtime",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
